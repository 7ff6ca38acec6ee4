"""Real POSIX shared memory segments for tests, made as ``shm_open`` makes them:
a file under /dev/shm. ``Segments`` unlinks what it made (ferry never does)."""

from __future__ import annotations

import os
import uuid
from pathlib import Path
from types import TracebackType

from tests.models import write_python_model

SHM = Path("/dev/shm")


class ClientRegions:
    """Segments made by ``tritonclient.utils.shared_memory``, as Triton's example clients make
    them; destroyed (unlinked) by the client on exit."""

    def __init__(self) -> None:
        self._made: dict[str, object] = {}

    def new(self, name: str, byte_size: int) -> tuple[object, str]:
        """A region's handle and its key."""
        import tritonclient.utils.shared_memory as shm

        key = f"/ferry_{name}_{uuid.uuid4().hex[:8]}"
        self._made[name] = shm.create_shared_memory_region(name, key, byte_size)
        return self._made[name], key

    def __enter__(self) -> ClientRegions:
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 trace: TracebackType | None) -> None:
        import tritonclient.utils.shared_memory as shm

        for handle in self._made.values():
            shm.destroy_shared_memory_region(handle)


class Segments:
    def __init__(self) -> None:
        self._made: list[Path] = []

    def make(self, size: int, content: bytes = b"", mode: int = 0o600) -> str:
        """A new segment of ``size`` bytes starting with ``content``; its key."""
        path = SHM / f"ferry_test_{uuid.uuid4().hex[:12]}"
        fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
        try:
            os.ftruncate(fd, size)
            os.pwrite(fd, content, 0)
        finally:
            os.close(fd)
        os.chmod(path, mode)
        self._made.append(path)
        return f"/{path.name}"

    def __enter__(self) -> Segments:
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 trace: TracebackType | None) -> None:
        for path in self._made:
            path.unlink(missing_ok=True)


def path_of(key: str) -> Path:
    return SHM / key.lstrip("/")


def contents(key: str) -> bytes:
    return path_of(key).read_bytes()


def open_descriptors(key: str, pid: int | str = "self") -> int:
    """How many file descriptors of process ``pid`` are open on the segment."""
    target = str(path_of(key))
    count = 0
    for link in Path(f"/proc/{pid}/fd").iterdir():
        try:
            count += os.readlink(link) == target
        except OSError:  # closed since the listing
            pass
    return count


GATED = """
import time
from pathlib import Path

GATE = Path({gate!r})


class Model:
    def infer(self, inputs):
        (GATE / "entered").touch()
        deadline = time.monotonic() + 30
        while not (GATE / "open").exists() and time.monotonic() < deadline:
            time.sleep(0.01)
        return {{"OUT": inputs["IN"] + 1}}
"""
GATED_CONFIG = """
name: "gated"
backend: "python"
max_batch_size: 0
input [ { name: "IN" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "OUT" data_type: TYPE_FP32 dims: [ 4 ] } ]
"""


def write_gated_model(repo: Path, gate: Path) -> None:
    """Model ``gated`` (FP32 [4] + 1), which holds each request until ``gate/open`` exists,
    after touching ``gate/entered``: a test acts while the request is in flight."""
    write_python_model(repo, "gated", GATED.format(gate=str(gate)), GATED_CONFIG)
