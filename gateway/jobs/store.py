"""The job store seam.

Every transition is conditional and atomic, so a cancel, a worker starting
the job and its reply racing each other leave exactly one outcome:

    queued ──begin──▶ running ──finish──▶ succeeded | failed
       │               │  ▲                  ▲
       │               └──┘ begin            │
       ├──finish─────────────────────────────┘  (a worker with no gate)
       └──cancel──▶ cancelled

A store is also the worker's ``JobGate`` (``begin``). ``begin`` on a running
job succeeds too: delivery is at least once, so the same job comes back after
its model raised and the request was released for another try, after a worker
died holding it, or after its reply could not be published. Refusing it then
would leave the job running for good, since nothing else would ever finish it.
"""

from __future__ import annotations

from typing import Protocol

from gateway.jobs.job import Job, JobStatus

DEFAULT_TTL_S = 3600.0


class JobStore(Protocol):
    async def create(self, job: Job) -> None:
        """Store a new job; it lives for the store's TTL from now."""

    async def get(self, job_id: str) -> Job | None:
        """The job, or None when unknown (or forgotten after it expired)."""

    async def begin(self, job_id: str) -> bool:
        """Move a queued job to running, or confirm a running one (a redelivery);
        False if it is cancelled, finished, expired or unknown."""

    async def finish(self, job_id: str, status: JobStatus, result: bytes) -> bool:
        """Record a result if the job is queued or running; False when it was not."""

    async def cancel(self, job_id: str) -> Job | None:
        """Cancel the job if it is still queued; the job as it stands afterwards."""

    async def discard(self, job_id: str) -> None:
        """Forget a job whose request never left the gateway."""

    async def aclose(self) -> None:
        """Release resources."""
