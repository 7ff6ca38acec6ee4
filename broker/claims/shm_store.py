"""Claim-checked bytes in /dev/shm, for senders and receivers on one host.

A blob goes into a block of the writing process's arena
(``broker.claims.shm_arena``) where one has room, else into a file of its own,
``ferry-claim-<owner>-<id>``. ``owner`` is the process that sent the request
the blob belongs to and waits for its reply (its pid and start time): the
worker deletes a request's inputs once it has acked it, and the owner takes
(reads and deletes) its reply's outputs. Whatever is left once the owner is
gone (SIGKILL included) can never be read by anyone who waits for it, so every
store sweeps /dev/shm when it opens and then at most every ``sweep_s`` as it is
used, removing the blob files of owners that are gone, any blob file older than
the TTL, and the arenas of writers that are gone (an arena reuses the blocks of
owners that are gone, and of the TTL, itself). Whether a process is gone is asked
of ``/proc``, then of its presence file (``broker.claims.presence``), so that
processes in other PID namespaces that share the directory count as running.

Claims are checked against the file-name patterns before any path is built, so
a claim in a message from outside ferry cannot name another file.
"""

from __future__ import annotations

import os
import re
import time
import uuid
from collections.abc import Sequence
from pathlib import Path

import structlog

from broker.claims import presence
from broker.claims.presence import Presence
from broker.claims.shm_arena import ARENA_BYTES, ARENAS, CLAIM, ArenaReader, Arenas
from broker.claims.shm_arena import NAME as ARENA_NAME
from broker.claims.store import claim_id, process_start, process_tag
from broker.errors import ClaimMissing, TransportError

log = structlog.get_logger("ferry.broker.claims")

SHM = Path("/dev/shm")
_OWNER = re.compile(r"(\d+)\.(\d+)")
_NAME = re.compile(r"ferry-claim-(\d+)\.(\d+)-[0-9a-f]{32}")


class ShmClaims:
    scheme = "shm"

    def __init__(self, directory: Path = SHM, ttl_s: float = 900.0, sweep_s: float = 5.0,
                 arena_bytes: int = ARENA_BYTES, arenas: int = ARENAS) -> None:
        """Up to ``arenas`` arenas of ``arena_bytes`` each; 0 of either: a file per blob."""
        self._directory = directory
        self.owner = process_tag()
        self._ttl_s = ttl_s
        self._sweep_s = sweep_s
        self._swept_at = 0.0
        self._alive: dict[tuple[int, int], tuple[bool, float]] = {}
        self._presence = Presence(directory, self.owner)  # seen from other PID namespaces too
        self._written = Arenas(directory, self.owner, arena_bytes, arenas, ttl_s, self._lives)
        self._arenas = ArenaReader(directory)
        self.sweep()

    async def put(self, blobs: Sequence[bytes | memoryview], ttl_s: float, owner: str) -> list[str]:
        """The TTL is the store's own (the sweep applies it); an owner tag that is not one
        (a request from outside ferry) makes this process the owner."""
        self._maybe_sweep()
        owner = owner if _OWNER.fullmatch(owner) else self.owner
        pid, start = (int(part) for part in owner.split("."))
        claims: list[str] = []
        try:
            for blob in blobs:
                placed = self._written.place(blob, pid, start)
                if placed is not None:
                    claims.append(f"{self.scheme}:{placed}")
                    continue
                name = f"ferry-claim-{owner}-{uuid.uuid4().hex}"
                claims.append(f"{self.scheme}:{name}")
                self._write(self._directory / name, blob)
        except OSError as exc:  # /dev/shm full, say: the sender gets a 503, as for a broker that is down
            await self.delete(claims)
            raise TransportError(f"shm claims: cannot write in {self._directory}: {exc}") from None
        return claims

    @staticmethod
    def _write(path: Path, blob: bytes | memoryview) -> None:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            view = memoryview(blob)
            while view:
                view = view[os.write(fd, view):]
        finally:
            os.close(fd)

    async def get(self, claims: Sequence[str], delete: bool = False) -> list[bytes]:
        self._maybe_sweep()
        ids = [self._id(claim) for claim in claims]
        blobs = []
        for claim, (name, in_arena) in zip(claims, ids):
            if in_arena:
                blobs.append(self._arenas.read(name, release=delete))
                continue
            try:
                blobs.append((self._directory / name).read_bytes())
            except FileNotFoundError:
                raise ClaimMissing(f"claim '{claim}' is not in {self._directory} (expired, its owner died, or "
                                   "it was written on another host)") from None
            except OSError as exc:
                raise ClaimMissing(f"claim '{claim}' cannot be read from {self._directory}: {exc}") from None
        if delete:
            self._unlink([self._directory / name for name, in_arena in ids if not in_arena])
        return blobs

    async def delete(self, claims: Sequence[str]) -> None:
        files = []
        for name, in_arena in (self._id(claim) for claim in claims):
            if in_arena:
                self._arenas.release(name)
            else:
                files.append(self._directory / name)
        self._unlink(files)

    async def aclose(self) -> None:
        """Unmaps what this process read and removes its arenas: a reader that mapped one keeps its blocks."""
        self._arenas.close()
        self._written.close()
        self._presence.close()

    def live_blocks(self) -> int:
        """Blocks of this process's arenas not yet released."""
        return self._written.live_blocks()

    def _lives(self, pid: int, start: int) -> bool:
        """Whether the process ``pid`` started at ``start`` still runs, in this PID namespace or another
        (``broker.claims.presence``); looked up at most once a second."""
        now = time.monotonic()
        known = self._alive.get((pid, start))
        if known is None or now - known[1] > 1.0:
            known = (process_start(pid) == start or presence.present(self._directory, f"{pid}.{start}"), now)
            self._alive[(pid, start)] = known
        return known[0]

    def sweep(self) -> int:
        """Remove the blob files of owners that are gone and those past the TTL, and the arenas of
        writers that are gone; returns how many files."""
        self._swept_at = time.monotonic()
        now, removed = time.time(), 0
        self._alive.clear()  # looked up afresh, once per process, by _lives
        for entry in os.scandir(self._directory):
            found = _NAME.fullmatch(entry.name) or ARENA_NAME.fullmatch(entry.name)
            if found is None:
                if presence.NAME.fullmatch(entry.name):
                    removed += presence.sweep(self._directory, entry.name)
                continue
            pid, start = int(found.group(1)), int(found.group(2))
            try:
                age = now - entry.stat().st_mtime
            except FileNotFoundError:
                continue
            if entry.name.startswith("ferry-arena-"):
                if not self._lives(pid, start):
                    self._arenas.forget(entry.name)
                    removed += self._unlink([Path(entry.path)])
            elif not self._lives(pid, start) or age > self._ttl_s:
                removed += self._unlink([Path(entry.path)])
        for name in self._arenas.names():  # mapped here, its writer gone (its file perhaps removed elsewhere)
            found = ARENA_NAME.fullmatch(name)
            if found is not None and not self._lives(int(found.group(1)), int(found.group(2))):
                self._arenas.forget(name)
        if removed:
            log.info("claims.swept", directory=str(self._directory), removed=removed)
        return removed

    def _maybe_sweep(self) -> None:
        if time.monotonic() - self._swept_at >= self._sweep_s:
            self.sweep()

    def _id(self, claim: str) -> tuple[str, bool]:
        """The claim's file name, or its arena block (and True); nothing else."""
        try:
            name = claim_id(claim, self.scheme)
        except ValueError as exc:
            raise ClaimMissing(str(exc)) from None
        if CLAIM.fullmatch(name) is not None:
            return name, True
        if _NAME.fullmatch(name) is None:
            raise ClaimMissing(f"claim '{claim[:80]}' does not name a ferry claim file or arena block")
        return name, False

    @staticmethod
    def _unlink(paths: Sequence[Path]) -> int:
        removed = 0
        for path in paths:
            try:
                path.unlink()
                removed += 1
            except FileNotFoundError:
                pass
        return removed
