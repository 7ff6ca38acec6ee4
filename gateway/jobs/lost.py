"""Async jobs whose requests the broker lost in a failure (``broker.lost_requests``).

A job's reply goes to whichever gateway reads the shared job-reply channel first, so the
gateway that submitted it cannot tell it answered from a reply of its own: the store can. A job
still ``queued`` whose request is gone from its channel once the broker is back is published
again: safe, since the store keeps one result however often it is delivered (should both copies
run, the second ``finish`` is refused, so every poll reads the first). One that cannot be sent
again is finished as failed, with an ``unavailable`` error that says so, rather than left
queued until its TTL. The ledger keeps the jobs submitted in the last ``HORIZON_S`` seconds only:
a broker loses what it acknowledged last (Redis with ``appendfsync everysec``: up to 2 s).
"""

from __future__ import annotations

from broker.envelope import Response, encode_response
from broker.lost_requests import SentLedger
from broker.transport import Transport
from gateway.jobs.job import JobStatus
from gateway.jobs.store import JobStore

HORIZON_S = 60.0


def job_ledger(transport: Transport, store: JobStore) -> SentLedger:
    async def queued(job_ids: list[str]) -> list[str]:
        return [job_id for job_id in job_ids
                if (job := await store.get(job_id)) is not None and job.status is JobStatus.QUEUED]

    async def fail(response: Response) -> None:
        await store.finish(response.id, JobStatus.FAILED, encode_response(response))

    return SentLedger(transport, fail, unanswered=queued, horizon_s=HORIZON_S)
