"""An instance process: one Python-backend instance, served to its worker.

    python -P -m workers.backends.python_stub <socket fd> <worker pid> <label for ps>

The worker (``workers.backends.python_process``) starts it with one end of a
socket pair. It runs ``PythonBackend``, the in-process backend, on the frames
the worker sends (``workers.backends.python_wire``), one call at a time:

    {"op": "load", "context": ...}   -> {}                 (and exit if it failed)
    {"op": "infer", tensors}         -> {tensors}
    {"op": "stream", tensors}        -> {tensors}... then {"end": true}
    {"op": "unload"}                 -> {}                 and exit

While it computes, a Triton Python model may call other models (BLS): it sends
``{"bls": <request message>}`` and reads ``{"bls": <reply message>}``, which
the worker sends once it has the answer.

Any call may answer ``{"error": {type, message}}`` instead. The process ends
with its worker: the kernel kills it when the worker dies (PR_SET_PDEATHSIG on
Linux), and it exits when its socket closes.
"""

from __future__ import annotations

import os
import signal
import socket
import sys
from collections.abc import Callable

from workers.backends.python import PythonBackend
from workers.backends.triton_python import bls
from workers.backends.triton_python.bls import StubModelCaller
from workers.backends.python_wire import Channel, ChannelClosed, Tensors, context_from, error_body
from workers.linux import die_with_parent



def main(argv: list[str]) -> int:
    fd, worker_pid = int(argv[0]), int(argv[1])
    _die_with(worker_pid)
    # Ctrl-C, and a supervisor's SIGTERM to the whole process group, are for the worker: it
    # drains its requests, then stops its instances (or the kernel kills them when it dies).
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    channel = Channel(socket.socket(fileno=fd))
    bls.install(StubModelCaller(channel))  # a Triton model's own requests go through its worker
    try:
        serve(channel)
    except ChannelClosed:
        pass  # the worker is gone or has let go of this instance
    finally:
        channel.close()
    return 0


def serve(channel: Channel) -> None:
    backend = _load(channel)
    if backend is None:
        return
    while True:
        header, tensors = channel.receive()
        op = header.get("op")
        if op == "infer":
            _answer(channel, lambda: backend.infer(tensors))
        elif op == "stream":
            _stream(channel, backend, tensors)
        elif op == "unload":
            _answer(channel, lambda: _unloaded(backend))
            return
        else:
            raise SystemExit(f"instance process: unknown op {op!r}")


def _answer(channel: Channel, call: Callable[[], Tensors]) -> None:
    """Send what ``call`` returns, or the error it raised."""
    try:
        channel.send({}, call())
    except ChannelClosed:
        raise
    except Exception as exc:
        channel.send({"error": error_body(exc)})


def _stream(channel: Channel, backend: PythonBackend, inputs: Tensors) -> None:
    try:
        for outputs in backend.infer_stream(inputs):
            channel.send({}, outputs)
    except ChannelClosed:
        raise
    except Exception as exc:
        channel.send({"error": error_body(exc)})
        return
    channel.send({"end": True})


def _load(channel: Channel) -> PythonBackend | None:
    """The loaded model; None once a failure to load it has been answered."""
    header, _ = channel.receive()
    if header.get("op") != "load":
        raise SystemExit(f"instance process: expected a load, got {header.get('op')!r}")
    try:
        backend = PythonBackend(context_from(header["context"]))
        backend.load()
    except Exception as exc:
        channel.send({"error": error_body(exc)})
        return None
    channel.send({})
    return backend


def _unloaded(backend: PythonBackend) -> Tensors:
    backend.unload()
    return {}


def _die_with(worker_pid: int) -> None:
    """Have the kernel SIGKILL this process when its worker dies, even by SIGKILL."""
    die_with_parent(signal.SIGKILL)
    if os.getppid() != worker_pid:  # the worker died before the line above took effect
        raise SystemExit(0)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
