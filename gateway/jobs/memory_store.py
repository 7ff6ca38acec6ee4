"""The in-memory job store: the embedded default and the unit-test fake.

A job lives ``ttl_s`` from its creation on the injected monotonic clock. After
that it reads as ``expired`` (its result dropped) for one more TTL, so a late
poll learns what happened, and is then forgotten.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, replace

from gateway.jobs.job import Job, JobStatus
from gateway.jobs.store import DEFAULT_TTL_S


_QUEUED = frozenset({JobStatus.QUEUED})
_UNFINISHED = frozenset({JobStatus.QUEUED, JobStatus.RUNNING})


@dataclass(slots=True)
class _Entry:
    job: Job
    expires_at: float


class MemoryJobStore:
    def __init__(self, ttl_s: float = DEFAULT_TTL_S, clock: Callable[[], float] = time.monotonic) -> None:
        self._ttl_s = ttl_s
        self._clock = clock
        # Ordered by creation, which is expiry order; popping the oldest is O(1) (a plain dict's
        # first key is not, once many have been deleted before it).
        self._entries: OrderedDict[str, _Entry] = OrderedDict()

    async def __aenter__(self) -> MemoryJobStore:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def create(self, job: Job) -> None:
        self._forget_old()
        self._entries[job.id] = _Entry(job, self._clock() + self._ttl_s)

    async def get(self, job_id: str) -> Job | None:
        entry = self._live(job_id)
        if entry is None:
            return None
        if self._clock() >= entry.expires_at:
            return replace(entry.job, status=JobStatus.EXPIRED, result=b"")
        return entry.job

    async def begin(self, job_id: str) -> bool:
        return self._move(job_id, JobStatus.RUNNING, b"", _UNFINISHED)

    async def finish(self, job_id: str, status: JobStatus, result: bytes) -> bool:
        return self._move(job_id, status, result, _UNFINISHED)

    async def cancel(self, job_id: str) -> Job | None:
        self._move(job_id, JobStatus.CANCELLED, b"", _QUEUED)
        return await self.get(job_id)

    async def discard(self, job_id: str) -> None:
        self._entries.pop(job_id, None)

    async def aclose(self) -> None:
        self._entries.clear()

    def _move(self, job_id: str, status: JobStatus, result: bytes, sources: frozenset[JobStatus]) -> bool:
        entry = self._live(job_id)
        if entry is None or self._clock() >= entry.expires_at or entry.job.status not in sources:
            return False
        entry.job = replace(entry.job, status=status, result=result)
        return True

    def _live(self, job_id: str) -> _Entry | None:
        entry = self._entries.get(job_id)
        if entry is not None and self._clock() >= entry.expires_at + self._ttl_s:
            del self._entries[job_id]
            return None
        return entry

    def _forget_old(self) -> None:
        # Every job lives the same TTL on a monotonic clock: stop at the first job still remembered.
        cutoff = self._clock() - self._ttl_s
        while self._entries:
            job_id, entry = next(iter(self._entries.items()))
            if entry.expires_at > cutoff:
                return
            del self._entries[job_id]
