"""The system shared memory regions clients have registered with this gateway.

A region is a byte range of a POSIX shared memory segment the client created:
``key`` names the segment as ``shm_open`` does (``/name``, found at
``/dev/shm/name``). Registering opens the segment and checks that the range
lies inside it; unregistering, and ``aclose`` at shutdown, close it. ferry
never creates, resizes or unlinks a segment: it belongs to the client. A
segment this process may not write (opened read-only, or with no write bit in
its mode) is opened read-only: inputs may be read from it, outputs are refused.

The bytes move with ``pread``/``pwrite`` on the open descriptor rather than
through a mapping: a client that shrinks its segment then gets a clear error,
where touching a mapping past the end of the file would kill the gateway with
SIGBUS. Either way it is one copy.

Regions live in this process only: a client must register with the gateway it
sends its requests to.

Everything here runs on the event loop's thread and copies without awaiting,
so no region is closed halfway through a copy. A request keeps the ``Slice``
it resolved: a region unregistered (and perhaps registered again under the
same name) before the reply arrives is noticed, and nothing is written to it.

Messages are Triton's where it has one.
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gateway.errors import AlreadyExists, FeatureDisabled, InvalidRequest, RegionNotFound
from gateway.shared_memory.refs import RegionSlice

DISABLED = "Client shared memory is disabled. Start the server with '--allow-client-shm=true' to enable."
_OPEN_FLAGS = os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK  # as shm_open: no symlinks; a FIFO must not block us


class _Region:
    """One registered byte range of an open segment; ``close`` closes it for good."""

    def __init__(self, name: str, key: str, offset: int, byte_size: int, fd: int, writable: bool) -> None:
        self.name, self.key, self.offset, self.byte_size = name, key, offset, byte_size
        self.writable = writable
        self._fd: int | None = fd

    @classmethod
    def open(cls, name: str, key: str, offset: int, byte_size: int, directory: Path) -> _Region:
        fd, writable = _open_segment(directory, key)
        try:
            size = os.fstat(fd).st_size
            if offset + byte_size > size:
                raise InvalidRequest(f"failed to register shared memory region '{name}': invalid args (offset "
                                     f"{offset} + byte_size {byte_size} is past the {size} bytes of '{key}')")
        except BaseException:
            os.close(fd)
            raise
        return cls(name, key, offset, byte_size, fd, writable)

    @property
    def closed(self) -> bool:
        return self._fd is None

    def status(self) -> dict[str, Any]:
        return {"name": self.name, "key": self.key, "offset": self.offset, "byte_size": self.byte_size}

    def read(self, offset: int, byte_size: int, where: str) -> bytes:
        data = os.pread(self._open(), byte_size, self.offset + offset)
        if len(data) != byte_size:
            raise InvalidRequest(f"{where}: shared memory region '{self.name}' ends {byte_size - len(data)} "
                                 f"bytes short: segment '{self.key}' has shrunk since it was registered")
        return data

    def fits(self, offset: int, byte_size: int) -> bool:
        """Whether the segment still holds the range (a write must not grow the client's segment)."""
        return os.fstat(self._open()).st_size >= self.offset + offset + byte_size

    def write(self, offset: int, data: bytes | memoryview, where: str) -> None:
        view, position = memoryview(data), self.offset + offset
        try:
            while view:
                written = os.pwrite(self._open(), view, position)
                if written == 0:
                    raise OSError(0, "no byte was written")
                view, position = view[written:], position + written
        except OSError as exc:  # /dev/shm full, say: pages of a sparse segment are allocated on write
            raise InvalidRequest(f"{where}: writing to shared memory region '{self.name}' failed: "
                                 f"{exc.strerror}") from None

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def _open(self) -> int:
        assert self._fd is not None, f"shared memory region '{self.name}' is closed"
        return self._fd


@dataclass(frozen=True, slots=True)
class Slice:
    """A request's byte range of a region, checked against it when resolved."""

    region: _Region
    offset: int
    byte_size: int

    def read(self, where: str) -> bytes:
        return self.region.read(self.offset, self.byte_size, where)

    def check_target(self, where: str) -> None:
        """Whether outputs may go here: when the request arrives, and again before writing."""
        name = self.region.name
        if self.region.closed:
            raise InvalidRequest(f"{where}: shared memory region '{name}' was unregistered while the "
                                 f"request was in flight; nothing was written to it")
        if not self.region.writable:
            raise InvalidRequest(f"{where}: shared memory region '{name}' (key '{self.region.key}') is "
                                 f"read-only to the server; outputs cannot be written to it")

    def check_write(self, data: bytes | memoryview, where: str) -> None:
        """Refuse a write that cannot be done whole: call for every output before writing any."""
        self.check_target(where)
        name = self.region.name
        if len(data) > self.byte_size:
            raise InvalidRequest(f"shared memory size specified with the request for {where} "
                                 f"({self.byte_size} bytes) should be at least {len(data)} bytes to hold the results")
        if not self.region.fits(self.offset, len(data)):
            raise InvalidRequest(f"{where}: shared memory region '{name}' no longer holds its "
                                 f"{self.byte_size} bytes: segment '{self.region.key}' has shrunk")

    def write(self, data: bytes | memoryview, where: str) -> None:
        self.region.write(self.offset, data, where)


class SharedMemoryRegions:
    """``enabled`` is Triton's ``--allow-client-shm``: without it nothing can be
    registered (or unregistered), and status lists nothing."""

    def __init__(self, enabled: bool = False, directory: Path = Path("/dev/shm")) -> None:
        self.enabled = enabled
        self._directory = directory
        self._regions: dict[str, _Region] = {}

    def register(self, name: str, key: str, offset: int, byte_size: int) -> None:
        self.check_enabled()
        if name in self._regions:
            raise AlreadyExists(f"shared memory region '{name}' already in manager")
        if byte_size == 0:
            raise InvalidRequest(f"failed to register shared memory region '{name}': invalid args "
                                 f"(a byte_size of 0 holds nothing)")
        self._regions[name] = _Region.open(name, key, offset, byte_size, self._directory)

    def unregister(self, name: str) -> None:
        """A name not registered is no error, as in Triton."""
        self.check_enabled()
        region = self._regions.pop(name, None)
        if region is not None:
            region.close()

    def unregister_all(self) -> None:
        self.check_enabled()
        self._close_all()

    def __contains__(self, name: str) -> bool:
        return name in self._regions

    def status(self, name: str | None = None) -> list[dict[str, Any]]:
        if name is None:
            return [self._regions[known].status() for known in sorted(self._regions)]
        region = self._regions.get(name)
        if region is None:
            raise RegionNotFound(f"Unable to find system shared memory region: '{name}'")
        return [region.status()]

    # CUDA shared memory: ferry runs without GPUs here, as a Triton built without them does:
    # no region is ever registered, status lists none and unregister has nothing to do.

    def cuda_status(self, name: str | None = None) -> list[dict[str, Any]]:
        if name is None:
            return []
        if name in self._regions:
            raise RegionNotFound(f"The region named '{name}' is registered as system shared memory, "
                                 "not CUDA shared memory")
        raise RegionNotFound(f"Unable to find cuda shared memory region: '{name}'")

    def cuda_register(self, name: str) -> None:
        self.check_enabled()
        raise InvalidRequest(f"failed to register CUDA shared memory region: '{name}', GPUs not supported")

    def cuda_unregister(self) -> None:
        self.check_enabled()  # there is no CUDA region to unregister

    def resolve(self, wanted: RegionSlice, where: str) -> Slice:
        region = self._regions.get(wanted.region)
        if region is None:
            hint = "" if self.enabled else f" ({DISABLED})"
            raise InvalidRequest(f"{where}: Unable to find shared memory region: '{wanted.region}'{hint}")
        if wanted.offset >= region.byte_size:
            raise InvalidRequest(f"{where}: Invalid offset for shared memory region: '{region.name}' "
                                 f"(offset {wanted.offset} of its {region.byte_size} bytes)")
        if wanted.offset + wanted.byte_size > region.byte_size:
            raise InvalidRequest(f"{where}: Invalid offset + byte size for shared memory region: '{region.name}' "
                                 f"({wanted.offset} + {wanted.byte_size} bytes, past its {region.byte_size})")
        return Slice(region, wanted.offset, wanted.byte_size)

    def check_enabled(self) -> None:
        if not self.enabled:
            raise FeatureDisabled(DISABLED)

    async def __aenter__(self) -> SharedMemoryRegions:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        self._close_all()

    def _close_all(self) -> None:
        regions, self._regions = self._regions, {}
        for region in regions.values():
            region.close()


def _open_segment(directory: Path, key: str) -> tuple[int, bool]:
    """A descriptor of the segment ``key`` names, and whether it may be written."""
    path = directory / _segment_name(key)
    try:
        try:
            fd, writable = os.open(path, os.O_RDWR | _OPEN_FLAGS), True
        except PermissionError:
            fd, writable = os.open(path, os.O_RDONLY | _OPEN_FLAGS), False
    except OSError as exc:
        raise InvalidRequest(f"Unable to open shared memory region: '{key}' ({exc.strerror}: {path})") from None
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):
        os.close(fd)
        raise InvalidRequest(f"Unable to open shared memory region: '{key}' ({path} is not a shared memory segment)")
    # A root server opens anything read-write; a segment no one may write stays read-only all the same.
    return fd, writable and bool(mode & (stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH))


def _segment_name(key: str) -> str:
    """``shm_open``'s rule: leading slashes dropped, no slash after them."""
    name = key.lstrip("/")
    if not name or "/" in name or "\0" in name or name in (".", ".."):
        raise InvalidRequest(f"Unable to open shared memory region: '{key}' (a key is '/' and a name "
                             f"without '/', as shm_open takes it)")
    return name
