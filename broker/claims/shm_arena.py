"""One file in /dev/shm per writing process, reused block by block: the shm claim store's fast path.

A new file per blob costs the kernel a file, fresh pages, and their freeing at
the unlink: on a 2-core machine about 210 µs for a 301 KB tensor written, read
and deleted, where copying it into pages already there and out again costs
about 30 (benchmarks/README.md). So a process that claim-checks keeps a file, an arena,
``ferry-arena-<pid>.<start time>-<nonce>``, its pages reserved up front
(``posix_fallocate``: a full /dev/shm fails here, never as a SIGBUS later), and
places each blob in it as a block: a 64-byte header, then the bytes. When a blob
finds no room in its arenas, the process makes another, up to ``ARENAS``.

The header says whether the block is live or released, a generation (so a claim
names one use of the block, not whatever is there later), the size, and who the
block is for (the process that waits for it) and when it was written. A reader
maps the writer's file and copies the bytes out; releasing a block is one
4-byte store in its header. The writer reuses the space of released blocks as
its cursor comes round to them, and of blocks whose reader is gone or whose TTL
has passed; a live block is stepped over, so one that is never released holds
only its own space. When no arena has a gap large enough and no more may be
made, the store writes a file of its own for that blob, as before.

An arena goes when its writer closes the store, or, once the writer is gone
(SIGKILL included), at the next sweep of any store on the host; a reader that
has mapped it keeps what it mapped until it is done.
"""

from __future__ import annotations

import mmap
import os
import re
import secrets
import struct
import time
from bisect import bisect_left, insort
from collections.abc import Callable
from pathlib import Path

import structlog

from broker.errors import ClaimMissing

log = structlog.get_logger("ferry.broker.claims")

ARENA_BYTES = 32 * 1024 * 1024  # each; at most an eighth of /dev/shm's free space when it is made
ARENAS = 4  # at most, per writing process: a further arena is made only when those there are full
MIN_ARENA_BYTES = 4 * 1024 * 1024  # below this a process writes files only
NAME = re.compile(r"ferry-arena-(\d+)\.(\d+)-[0-9a-f]{8}")
CLAIM = re.compile(r"(ferry-arena-\d+\.\d+-[0-9a-f]{8})@(\d+):(\d+):(\d+)")  # file@offset:size:generation

HEADER = 64  # bytes before each block's payload; blocks start on 64-byte boundaries
_FIELDS = struct.Struct("<IIQQQQd")  # state, generation, size, span, reader pid, reader start, written at
_STATE = struct.Struct("<I")
_LIVE, _RELEASED = 1, 2


def _round_up(n: int, to: int) -> int:
    return -(-n // to) * to


class Arena:
    """The writer's file: places blobs, reuses the space of released and abandoned ones."""

    def __init__(self, path: Path, capacity: int, ttl_s: float, alive: Callable[[int, int], bool]) -> None:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            os.posix_fallocate(fd, 0, capacity)
            self._map = mmap.mmap(fd, capacity)
        except BaseException:
            os.unlink(path)
            raise
        finally:
            os.close(fd)
        self.path = path
        self.capacity = capacity
        self._ttl_s = ttl_s
        self._alive = alive
        self._starts: list[int] = []  # offsets of the blocks not yet reused, in order
        self._spans: dict[int, int] = {}
        self._cursor = 0
        self._generation = 0

    @classmethod
    def open(cls, directory: Path, tag: str, wanted: int, ttl_s: float,
             alive: Callable[[int, int], bool]) -> Arena | None:
        """This process's arena, as large as ``wanted`` and /dev/shm's room allow; None when too small."""
        try:
            stats = os.statvfs(directory)
            capacity = min(wanted, stats.f_bavail * stats.f_frsize // 8) // mmap.PAGESIZE * mmap.PAGESIZE
            if capacity < min(wanted, MIN_ARENA_BYTES):
                log.info("claims.arena_too_small", directory=str(directory), free_bytes=stats.f_bavail * stats.f_frsize)
                return None
            return cls(directory / f"ferry-arena-{tag}-{secrets.token_hex(4)}", capacity, ttl_s, alive)
        except OSError as exc:
            log.warning("claims.arena_unavailable", directory=str(directory), error=str(exc))
            return None

    @property
    def name(self) -> str:
        return self.path.name

    def place(self, blob: bytes | memoryview, reader_pid: int, reader_start: int) -> str | None:
        """The claim id of ``blob`` placed in a gap, or None when it is larger than a quarter of
        the arena (it would crowd out the rest) or no gap is large enough."""
        view = memoryview(blob).cast("B")
        size = view.nbytes
        span = HEADER + _round_up(size, HEADER)
        offset = self._gap(span) if span <= self.capacity // 4 else None
        if offset is None:
            return None
        self._generation = (self._generation + 1) & 0xFFFFFFFF
        self._map[offset + HEADER:offset + HEADER + size] = view
        _FIELDS.pack_into(self._map, offset, _LIVE, self._generation, size, span, reader_pid, reader_start, time.time())
        insort(self._starts, offset)
        self._spans[offset] = span
        self._cursor = offset + span
        return f"{self.name}@{offset}:{size}:{self._generation}"

    def live_blocks(self) -> int:
        return sum(1 for offset in self._starts if _STATE.unpack_from(self._map, offset)[0] == _LIVE)

    def close(self) -> None:
        self._map.close()
        try:
            self.path.unlink()
        except FileNotFoundError:
            pass

    def _gap(self, span: int) -> int | None:
        """Next fit from the cursor, round the file at most once, reusing released blocks on the way."""
        cursor, wrapped = self._cursor, False
        while True:
            if wrapped and cursor >= self._cursor:
                return None
            index = bisect_left(self._starts, cursor)
            following = self._starts[index] if index < len(self._starts) else self.capacity
            if following - cursor >= span:
                return cursor
            if following == self.capacity:  # no room before the end: round to the start
                if wrapped:
                    return None
                cursor, wrapped = 0, True
            elif self._reusable(following):
                del self._starts[index]
                del self._spans[following]
            else:
                cursor = following + self._spans[following]

    def _reusable(self, offset: int) -> bool:
        state, _, _, _, pid, start, written_at = _FIELDS.unpack_from(self._map, offset)
        if state != _LIVE:
            return True
        return time.time() - written_at > self._ttl_s or not self._alive(pid, start)


class Arenas:
    """A writing process's arenas: a first one at its first blob, another (up to ``count``) only
    when a blob finds no gap in those there."""

    def __init__(self, directory: Path, tag: str, size: int, count: int, ttl_s: float,
                 alive: Callable[[int, int], bool]) -> None:
        self._directory, self._tag, self._size, self._ttl_s, self._alive = directory, tag, size, ttl_s, alive
        self._room = count if size else 0  # arenas still to make
        self._arenas: list[Arena] = []
        self._current = 0  # the arena that took the last blob: tried first

    def place(self, blob: bytes | memoryview, reader_pid: int, reader_start: int) -> str | None:
        """The blob's claim id in an arena, or None: no arena has a gap for it and no more can be made."""
        arenas = self._arenas
        for step in range(len(arenas)):
            index = (self._current + step) % len(arenas)
            placed = arenas[index].place(blob, reader_pid, reader_start)
            if placed is not None:
                self._current = index
                return placed
        if not self._room:
            return None
        self._room -= 1
        arena = Arena.open(self._directory, self._tag, self._size, self._ttl_s, self._alive)
        if arena is None:
            self._room = 0  # /dev/shm has no room for one: files from now on
            return None
        arenas.append(arena)
        self._current = len(arenas) - 1
        return arena.place(blob, reader_pid, reader_start)

    def live_blocks(self) -> int:
        return sum(arena.live_blocks() for arena in self._arenas)

    def close(self) -> None:
        for arena in self._arenas:
            arena.close()
        self._arenas.clear()
        self._room = 0


class ArenaReader:
    """Other processes' arenas, mapped once each, for reading and releasing blocks."""

    def __init__(self, directory: Path) -> None:
        self._directory = directory
        self._maps: dict[str, mmap.mmap] = {}

    def read(self, claim_id: str, release: bool) -> bytes:
        mapped, offset, size = self._block(claim_id)
        data = mapped[offset + HEADER:offset + HEADER + size]
        if release:
            _STATE.pack_into(mapped, offset, _RELEASED)
        return data

    def release(self, claim_id: str) -> None:
        try:
            mapped, offset, _ = self._block(claim_id)
        except ClaimMissing:
            return
        _STATE.pack_into(mapped, offset, _RELEASED)

    def forget(self, name: str) -> None:
        mapped = self._maps.pop(name, None)
        if mapped is not None:
            mapped.close()

    def names(self) -> list[str]:
        return list(self._maps)

    def close(self) -> None:
        for name in self.names():
            self.forget(name)

    def _block(self, claim_id: str) -> tuple[mmap.mmap, int, int]:
        found = CLAIM.fullmatch(claim_id)
        if found is None:
            raise ClaimMissing(f"claim '{claim_id[:80]}' does not name a block of a ferry arena")
        name, offset, size, generation = found.group(1), int(found.group(2)), int(found.group(3)), int(found.group(4))
        mapped = self._mapped(name)
        if offset % HEADER or offset + HEADER + size > len(mapped):
            raise ClaimMissing(f"claim '{claim_id}' lies outside its arena")
        state, held, held_size = _FIELDS.unpack_from(mapped, offset)[:3]
        if state != _LIVE or held != generation or held_size != size:
            raise ClaimMissing(f"claim '{claim_id}' is no longer in its arena (released, expired, or its "
                               "reader died)")
        return mapped, offset, size

    def _mapped(self, name: str) -> mmap.mmap:
        mapped = self._maps.get(name)
        if mapped is not None:
            return mapped
        try:
            fd = os.open(self._directory / name, os.O_RDWR)
        except FileNotFoundError:
            raise ClaimMissing(f"arena '{name}' is not in {self._directory} (its writer is gone, or it is on "
                               "another host)") from None
        except OSError as exc:
            raise ClaimMissing(f"arena '{name}' cannot be opened in {self._directory}: {exc}") from None
        try:
            mapped = mmap.mmap(fd, 0)
        except (OSError, ValueError) as exc:  # an empty file of that name, say: not an arena
            raise ClaimMissing(f"arena '{name}' cannot be mapped from {self._directory}: {exc}") from None
        finally:
            os.close(fd)
        self._maps[name] = mapped
        return mapped
