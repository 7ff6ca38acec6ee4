"""Starting real ferry processes for tests, on free loopback ports."""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_ready(url: str, process: subprocess.Popen[bytes], timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"ferry exited with {process.returncode} before becoming ready")
        try:
            with urllib.request.urlopen(f"{url}/v2/health/ready", timeout=1) as response:
                if response.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.1)
    raise TimeoutError(f"ferry at {url} was not ready within {timeout_s} s")


@contextlib.contextmanager
def ferry_serve(repository: Path, *extra: str, log_path: Path | None = None,
                env: dict[str, str] | None = None) -> Iterator[str]:
    """Run ``ferry serve`` on ``repository`` (``env`` added to its environment); yield its base URL (host:port)."""
    port = free_port()
    command = [sys.executable, "-m", "ferry.cli.main", "serve", "--model-repository", str(repository),
               "--http-port", str(port), "--host", "127.0.0.1", "--log-format", "json",
               "--grpc-port", "0", *extra]
    log = open(log_path, "wb") if log_path else subprocess.DEVNULL
    process = subprocess.Popen(command, stdout=log, stderr=log,
                               env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})})
    url = f"127.0.0.1:{port}"
    try:
        wait_ready(f"http://{url}", process)
        yield url
    finally:
        process.terminate()
        try:
            process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        if log_path:
            log.close()
