"""Python-backend instances in processes of their own, as Triton runs its Python stubs.

A ``model.py`` that computes in Python holds the GIL, so instances sharing the
worker's process take turns however many there are. Here each instance is a
process of its own (``workers.backends.python_stub``, started with this
interpreter), so ``instance_group { count: N }`` computes on N cores.
``ProcessBackend`` is the backend seam on the worker's side: each call is a
frame to the instance process and its answer (``workers.backends.python_wire``).

Lifecycle: ``load`` starts the process and waits for the model's load;
``unload`` has the model unload and waits for the process to exit, killing it
after ``STOP_TIMEOUT_S``. An instance process dies with its worker, even one
killed by SIGKILL (see ``python_stub``). One that dies while computing (a crash
in native code, SIGKILL, the OOM killer, ``os._exit``) fails the call it was
running with an ExecutionError, not retried here since the request may be what
killed it; a new process starts at once and the next call waits for its load.
One found dead between calls is replaced before the call is sent.

``parameters { key: "FERRY_INSTANCE_PROCESS" value: { string_value: "no" } }``
keeps a model's instances in the worker's process (``PythonBackend``).
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import structlog

from broker.envelope import decode_request, encode_response
from workers.backends.base import Backend, ModelContext
from workers.backends.triton_python import bls
from workers.backends.python import PythonBackend
from workers.backends.python_wire import Channel, ChannelClosed, Header, Tensors, context_body, error_from
from workers.errors import ExecutionError, ModelLoadError

log = structlog.get_logger("ferry.python")

INSTANCE_PROCESS = "FERRY_INSTANCE_PROCESS"  # the config parameter: "yes" (the default) or "no"
STUB_MODULE = "workers.backends.python_stub"
STOP_TIMEOUT_S = 30.0
_YES, _NO = ("yes", "true", "on", "1"), ("no", "false", "off", "0")
_FERRY_ROOT = Path(__file__).resolve().parents[2]


def python_backend(context: ModelContext) -> Backend:
    """The Python backend for one instance: in a process of its own unless the config says no."""
    value = context.parameters.get(INSTANCE_PROCESS, "yes").strip().lower()
    if value in _YES:
        return ProcessBackend(context)
    if value in _NO:
        return PythonBackend(context)
    raise ModelLoadError(f"model '{context.name}': parameter {INSTANCE_PROCESS} must be 'yes' or 'no', "
                         f"not {value!r}")


class InstanceProcess:
    """A started instance process, and the worker's end of its socket."""

    def __init__(self, process: subprocess.Popen[bytes], channel: Channel) -> None:
        self.process = process
        self.channel = channel

    @classmethod
    def start(cls, label: str) -> InstanceProcess:
        """``label`` (model/version#instance) is there for ``ps`` to show.

        Linux sends the parent-death signal when the *thread* that started the
        process ends, not only the worker: the runner starts (and restarts)
        instances on its executor's threads, which last until it has unloaded them."""
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            # -P: the worker's working directory must not shadow the ferry it runs (see _environment).
            command = [sys.executable, "-P", "-m", STUB_MODULE, str(theirs.fileno()), str(os.getpid()), label]
            process = subprocess.Popen(command, pass_fds=(theirs.fileno(),), stdin=subprocess.DEVNULL,
                                       env=_environment())
        except BaseException:
            ours.close()
            raise
        finally:
            theirs.close()
        return cls(process, Channel(ours))

    @property
    def pid(self) -> int:
        return self.process.pid

    def alive(self) -> bool:
        return self.process.poll() is None

    def stop(self, timeout_s: float) -> None:
        """Close the socket, which ends the process, and reap it; SIGKILL it past ``timeout_s``."""
        self.channel.close()
        try:
            self.process.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()

    def exit_text(self) -> str:
        code = self.process.returncode
        if code is None:
            return "stopped answering"
        if code < 0:
            return f"was killed by {signal.Signals(-code).name}"
        return f"exited with code {code}"


class ProcessBackend:
    """One instance of a Python model, computed in its own process. One call
    at a time, as the runner makes them."""

    calls_models = True  # its model's BLS requests are made on the worker's event loop: never run on it

    def __init__(self, context: ModelContext, stop_timeout_s: float = STOP_TIMEOUT_S) -> None:
        self._context = context
        self._stop_timeout_s = stop_timeout_s
        self._process: InstanceProcess | None = None
        self._loading = False  # a load was sent to _process and its answer is still to be read
        self._who = f"model '{context.name}' instance {context.instance_index}"

    @property
    def pid(self) -> int | None:
        """The instance process's pid; None before load or after unload."""
        return self._process.pid if self._process is not None else None

    def load(self) -> None:
        self._launch()
        self._await_load()

    def infer(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        process = self._ready()
        self._send(process, {"op": "infer"}, inputs)
        return self._receive(process)[1]

    def infer_stream(self, inputs: dict[str, np.ndarray]) -> Iterator[dict[str, np.ndarray]]:
        process = self._ready()
        self._send(process, {"op": "stream"}, inputs)
        streaming = True
        try:
            while True:
                try:
                    header, outputs = self._receive(process)
                except BaseException:
                    streaming = False  # an error ends the stream: nothing more will come
                    raise
                if header.get("end"):
                    streaming = False
                    return
                yield outputs
        finally:
            if streaming:  # abandoned midway: the model runs to its end, and its answers are dropped
                self._drain(process)

    def unload(self) -> None:
        process, self._process = self._process, None
        if process is None:
            return
        header: Header = {}
        try:
            if self._loading:
                self._loading = False
                process.channel.receive()
            process.channel.send({"op": "unload"})
            header, _ = process.channel.receive(timeout_s=self._stop_timeout_s)
        except ChannelClosed:
            process.stop(0)  # dead, exited after a failed load, or not answering: nothing left to unload
        else:
            process.stop(self._stop_timeout_s)  # it exits once it has answered
        if "error" in header:
            raise error_from(header["error"])

    def _ready(self) -> InstanceProcess:
        if self._process is not None and not self._loading and not self._process.alive():
            log.warning("python.instance_died", model=self._context.name, instance=self._context.instance_index,
                        pid=self._process.pid, exit=self._process.exit_text(), computing=False)
            self._forget(self._process)
        if self._process is None:
            self._launch()
        if self._loading:
            self._await_load()
        assert self._process is not None
        return self._process

    def _launch(self) -> None:
        """Start a process and send it the load, without waiting for the answer."""
        try:
            process = InstanceProcess.start(f"{self._context.name}/{self._context.version}#"
                                            f"{self._context.instance_index}")
        except OSError as exc:
            raise ModelLoadError(f"{self._who}: could not start its process: {exc}") from None
        self._process, self._loading = process, True
        log.info("python.instance_started", model=self._context.name, instance=self._context.instance_index,
                 pid=process.pid)
        try:
            process.channel.send({"op": "load", "context": context_body(self._context)})
        except ChannelClosed:
            pass  # it died at once: _await_load says how

    def _await_load(self) -> None:
        process = self._process
        assert process is not None
        self._loading = False
        try:
            header, _ = process.channel.receive()
        except ChannelClosed:
            self._forget(process)
            raise ModelLoadError(f"{self._who}: its process (pid {process.pid}) {process.exit_text()} "
                                 f"while loading the model") from None
        if "error" in header:
            self._forget(process)
            raise error_from(header["error"])

    def _send(self, process: InstanceProcess, header: Header, inputs: Tensors) -> None:
        try:
            process.channel.send(header, inputs)
        except ChannelClosed:
            raise self._died(process) from None

    def _receive(self, process: InstanceProcess) -> tuple[Header, Tensors]:
        """The instance's next answer; its model's own requests to other models (BLS) meanwhile are
        made here and their replies sent back."""
        while True:
            try:
                header, outputs = process.channel.receive()
                if "bls" not in header:
                    break
                reply = bls.current().call(decode_request(header["bls"]))
                process.channel.send({"bls": encode_response(reply)})
            except ChannelClosed:
                raise self._died(process) from None
        if "error" in header:
            raise error_from(header["error"])
        return header, outputs

    def _drain(self, process: InstanceProcess) -> None:
        try:
            while not self._receive(process)[0].get("end"):
                pass
        except Exception:
            pass  # the stream ended in an error nobody is waiting for

    def _died(self, process: InstanceProcess) -> ExecutionError:
        """The error for the call a dead process was running; a new process starts meanwhile."""
        self._forget(process)
        log.warning("python.instance_died", model=self._context.name, instance=self._context.instance_index,
                    pid=process.pid, exit=process.exit_text(), computing=True)
        error = ExecutionError(f"{self._who}: its process (pid {process.pid}) {process.exit_text()} while "
                               f"computing the request; a new process is starting")
        try:
            self._launch()
        except ModelLoadError as exc:
            log.error("python.instance_restart_failed", model=self._context.name,
                      instance=self._context.instance_index, error=str(exc))  # the next call tries again
        return error

    def _forget(self, process: InstanceProcess) -> None:
        process.stop(self._stop_timeout_s)
        if self._process is process:
            self._process, self._loading = None, False


def _environment() -> dict[str, str]:
    """The worker's environment with this ferry's source first on the path, so
    the instance process imports the ferry its worker runs, whatever is installed."""
    paths = [str(_FERRY_ROOT), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
    return {**os.environ, "PYTHONPATH": os.pathsep.join(paths)}
