"""A throwaway real ``redis-server`` on a free loopback port, for integration tests."""

from __future__ import annotations

import shutil
import socket
import subprocess
import tempfile
import time
from types import TracebackType
from urllib.parse import urlsplit

READY_TIMEOUT_S = 10.0


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def command(port: int, *words: str, timeout_s: float = 1.0) -> bytes:
    """Send one inline command and return the first reply line (b"" if the server hung up)."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout_s) as conn:
        conn.sendall(" ".join(words).encode() + b"\r\n")
        reply = b""
        while not reply.endswith(b"\r\n"):
            chunk = conn.recv(4096)
            if not chunk:
                break
            reply += chunk
        return reply.strip()


def flushdb(url: str) -> None:
    """Empty the database a ``redis://127.0.0.1:PORT/DB`` URL names."""
    parts = urlsplit(url)
    db = parts.path.strip("/") or "0"
    with socket.create_connection((parts.hostname or "127.0.0.1", parts.port or 6379), timeout=1) as conn:
        conn.sendall(f"SELECT {db}\r\nFLUSHDB\r\n".encode())
        replies = b""
        while replies.count(b"\r\n") < 2:
            chunk = conn.recv(4096)
            if not chunk:
                break
            replies += chunk
    if replies != b"+OK\r\n+OK\r\n":
        raise RuntimeError(f"FLUSHDB failed: {replies!r}")


class RedisServer:
    """``extra`` are more ``redis-server`` options (``--appendfsync always``)."""

    def __init__(self, executable: str = "redis-server", extra: tuple[str, ...] = ()) -> None:
        found = shutil.which(executable)
        if found is None:
            raise FileNotFoundError(f"{executable} is not installed")
        self._executable = found
        self._dir: tempfile.TemporaryDirectory[str] | None = None
        self._process: subprocess.Popen[bytes] | None = None
        self._extra = extra
        self.port = 0

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    @property
    def running(self) -> bool:
        return self._process is not None and self._process.poll() is None

    def __enter__(self) -> RedisServer:
        self.start()
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    def start(self) -> None:
        self._dir = tempfile.TemporaryDirectory(prefix="ferry-redis-")
        # The port is free when probed but another process may take it before
        # redis binds it; a fresh port on each attempt rides that race out.
        for _ in range(3):
            self.port = free_port()
            self._process = subprocess.Popen(
                self._arguments(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
            )
            if self._wait_ready():
                return
            self._kill()
        self._cleanup_dir()
        raise RuntimeError("redis-server did not answer PING")

    def crash(self) -> None:
        """SIGKILL the server, keeping its directory (and AOF) for ``restart``."""
        if self._process is not None:
            self._process.kill()
            self._process.wait()
            self._process = None

    def restart(self) -> None:
        """Start again on the same port and directory, as after a crash."""
        self._process = subprocess.Popen(self._arguments(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        if not self._wait_ready():
            self._kill()
            raise RuntimeError(f"redis-server did not come back on port {self.port}")

    def stop(self) -> None:
        if self._process is not None and self._process.poll() is None:
            try:
                command(self.port, "SHUTDOWN", "NOSAVE")
            except OSError:
                pass
            try:
                self._process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self._kill()
        self._process = None
        self._cleanup_dir()

    def _arguments(self) -> list[str]:
        assert self._dir is not None
        return [
            self._executable,
            "--port", str(self.port),
            "--bind", "127.0.0.1",
            "--protected-mode", "yes",
            "--appendonly", "yes",
            "--save", "",
            "--dir", self._dir.name,
            *self._extra,
        ]  # fmt: skip

    def _wait_ready(self) -> bool:
        assert self._process is not None
        deadline = time.monotonic() + READY_TIMEOUT_S
        while time.monotonic() < deadline:
            if self._process.poll() is not None:
                return False
            try:
                if command(self.port, "PING") == b"+PONG":
                    return True
            except OSError:
                pass
            time.sleep(0.02)
        return False

    def _kill(self) -> None:
        if self._process is None:
            return
        self._process.terminate()
        try:
            self._process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self._process.kill()
            self._process.wait()

    def _cleanup_dir(self) -> None:
        if self._dir is not None:
            self._dir.cleanup()
            self._dir = None
