"""``ferry serve`` as a subprocess on a free 127.0.0.1 port, and throw-away model repositories."""

from __future__ import annotations

import contextlib
import http.client
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

HOST = "127.0.0.1"
REPO_ROOT = Path(__file__).resolve().parent.parent


class ServerError(Exception):
    """The server did not become ready, or exited early."""


@dataclass(frozen=True, slots=True)
class RunningServer:
    host: str
    port: int
    pid: int
    log_path: Path


def free_port(host: str = HOST) -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


def copy_model(source: Path, repository: Path, *, dynamic_batching: bool) -> Path:
    """Copy one model directory into ``repository``, dropping ``dynamic_batching`` when asked."""
    target = repository / source.name
    shutil.copytree(source, target)
    if not dynamic_batching:
        config = target / "config.pbtxt"
        config.write_text(without_block(config.read_text(), "dynamic_batching"))
    return target


def without_block(pbtxt: str, field: str) -> str:
    """``pbtxt`` with the top-level ``field { ... }`` message removed (braces matched, strings skipped)."""
    start = _top_level_field(pbtxt, field)
    if start is None:
        return pbtxt
    opening = pbtxt.index("{", start)
    return pbtxt[:start] + pbtxt[_matching_brace(pbtxt, opening) + 1:].lstrip("\n")


def _top_level_field(text: str, field: str) -> int | None:
    depth = 0
    for index, char in enumerate(text):
        if char in "{[":
            depth += 1
        elif char in "}]":
            depth -= 1
        elif depth == 0 and text.startswith(field, index) and (index == 0 or not text[index - 1].isalnum()):
            rest = text[index + len(field):].lstrip(" \t\n:")
            if rest.startswith("{"):
                return index
    return None


def _matching_brace(text: str, opening: int) -> int:
    depth, quoted = 0, False
    for index in range(opening, len(text)):
        char = text[index]
        if char == '"' and text[index - 1] != "\\":
            quoted = not quoted
        elif not quoted and char == "{":
            depth += 1
        elif not quoted and char == "}":
            depth -= 1
            if depth == 0:
                return index
    raise ValueError("unbalanced braces in config.pbtxt")


@contextlib.contextmanager
def ferry_server(repository: Path, log_path: Path, ready_timeout_s: float = 90.0,
                 extra_args: Sequence[str] = ()) -> Iterator[RunningServer]:
    """Run ``ferry serve`` (with ``extra_args``, e.g. ``--broker``) until the block ends, then SIGTERM it."""
    port = free_port()
    process = spawn_ferry(["serve", "--model-repository", str(repository), "--http-port", str(port),
                           "--host", HOST, "--grpc-port", "0", *extra_args], log_path)
    try:
        wait_ready(process, port, log_path, ready_timeout_s)
        yield RunningServer(HOST, port, process.pid, log_path)
    finally:
        stop_process(process)


def spawn_ferry(args: Sequence[str], log_path: Path) -> subprocess.Popen[bytes]:
    """``python -m ferry.cli.main ARGS`` in the repository root, JSON logs to ``log_path``."""
    command = [sys.executable, "-m", "ferry.cli.main", *args, "--log-format", "json"]
    with log_path.open("wb") as log:
        return subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, cwd=REPO_ROOT,
                                env={**os.environ, "PYTHONUNBUFFERED": "1"})


def wait_ready(process: subprocess.Popen[bytes], port: int, log_path: Path, timeout_s: float,
               name: str = "ferry serve") -> None:
    """Until ``GET /v2/health/ready`` answers 200; ``ServerError`` if ``process`` exits or time runs out."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise ServerError(f"{name} exited with {process.returncode}:\n{log_tail(log_path)}")
        if _ready_status(port) == 200:
            return
        time.sleep(0.2)
    raise ServerError(f"{name} was not ready after {timeout_s:.0f} s:\n{log_tail(log_path)}")


def _ready_status(port: int) -> int | None:
    connection = http.client.HTTPConnection(HOST, port, timeout=2)
    try:
        connection.request("GET", "/v2/health/ready")
        return connection.getresponse().status
    except OSError:
        return None
    finally:
        connection.close()


def stop_process(process: subprocess.Popen[bytes], timeout_s: float = 15.0) -> None:
    """SIGTERM, then SIGKILL once ``timeout_s`` has passed."""
    if process.poll() is not None:
        return
    process.send_signal(signal.SIGTERM)
    try:
        process.wait(timeout_s)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def log_tail(path: Path, lines: int = 20) -> str:
    return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
