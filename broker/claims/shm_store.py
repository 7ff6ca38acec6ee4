"""Claim-checked bytes in files under /dev/shm, for senders and receivers on one host.

A blob is a file ``ferry-claim-<owner>-<id>``. ``owner`` is the process that
sent the request the blob belongs to and waits for its reply (its pid and start
time): the worker deletes a request's inputs once it has acked it, and the owner
takes (reads and deletes) its reply's outputs. Whatever is left once the owner
is gone (SIGKILL included) can never be read by anyone who waits for it, so
every store sweeps /dev/shm when it opens and then at most every ``sweep_s`` as
it is used, removing the blobs of owners that are gone and any blob older than
the TTL.

Claims are checked against the file-name pattern before any path is built, so a
claim in a message from outside ferry cannot name another file.
"""

from __future__ import annotations

import os
import re
import time
import uuid
from collections.abc import Sequence
from pathlib import Path

import structlog

from broker.claims.store import claim_id, process_start, process_tag
from broker.errors import ClaimMissing, TransportError

log = structlog.get_logger("ferry.broker.claims")

SHM = Path("/dev/shm")
_OWNER = re.compile(r"(\d+)\.(\d+)")
_NAME = re.compile(r"ferry-claim-(\d+)\.(\d+)-[0-9a-f]{32}")


class ShmClaims:
    scheme = "shm"

    def __init__(self, directory: Path = SHM, ttl_s: float = 900.0, sweep_s: float = 5.0) -> None:
        self._directory = directory
        self.owner = process_tag()
        self._ttl_s = ttl_s
        self._sweep_s = sweep_s
        self._swept_at = 0.0
        self.sweep()

    async def put(self, blobs: Sequence[bytes | memoryview], ttl_s: float, owner: str) -> list[str]:
        """The TTL is the store's own (the sweep applies it); an owner tag that is not one
        (a request from outside ferry) makes this process the owner."""
        self._maybe_sweep()
        owner = owner if _OWNER.fullmatch(owner) else self.owner
        claims: list[str] = []
        try:
            for blob in blobs:
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
        paths = [self._path(claim) for claim in claims]
        blobs = []
        for claim, path in zip(claims, paths):
            try:
                blobs.append(path.read_bytes())
            except FileNotFoundError:
                raise ClaimMissing(f"claim '{claim}' is not in {self._directory} (expired, its owner died, or "
                                   "it was written on another host)") from None
            except OSError as exc:
                raise ClaimMissing(f"claim '{claim}' cannot be read from {self._directory}: {exc}") from None
        if delete:
            self._unlink(paths)
        return blobs

    async def delete(self, claims: Sequence[str]) -> None:
        self._unlink([self._path(claim) for claim in claims])

    async def aclose(self) -> None:
        return None

    def sweep(self) -> int:
        """Remove the blobs of owners that are gone and those past the TTL; returns how many."""
        self._swept_at = time.monotonic()
        now, removed = time.time(), 0
        alive: dict[tuple[int, int], bool] = {}
        for entry in os.scandir(self._directory):
            found = _NAME.fullmatch(entry.name)
            if found is None:
                continue
            pid, start = int(found.group(1)), int(found.group(2))
            try:
                age = now - entry.stat().st_mtime
            except FileNotFoundError:
                continue
            if (pid, start) not in alive:
                alive[(pid, start)] = process_start(pid) == start
            if not alive[(pid, start)] or age > self._ttl_s:
                removed += self._unlink([Path(entry.path)])
        if removed:
            log.info("claims.swept", directory=str(self._directory), removed=removed)
        return removed

    def _maybe_sweep(self) -> None:
        if time.monotonic() - self._swept_at >= self._sweep_s:
            self.sweep()

    def _path(self, claim: str) -> Path:
        try:
            name = claim_id(claim, self.scheme)
        except ValueError as exc:
            raise ClaimMissing(str(exc)) from None
        if _NAME.fullmatch(name) is None:
            raise ClaimMissing(f"claim '{claim[:80]}' does not name a ferry claim file")
        return self._directory / name

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
