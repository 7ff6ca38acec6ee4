"""Submitting, polling and cancelling async jobs.

A job's request envelope carries the job id as its request id and replies to
the shared job-reply channel, so its result reaches the store whichever
gateway is up when it arrives. The worker that takes the request first moves
the job from ``queued`` to ``running`` in the store (the store is its
``JobGate``) and skips it if it was cancelled or expired, so a job cancelled
before it started is never computed.

Each job submitted is recorded in a ``SentLedger`` for a while (``gateway.jobs.lost``): should
the broker lose its request in a failure, it is published again.
"""

from __future__ import annotations

import time
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

from broker import channels
from broker.lost_requests import SentLedger
from broker.transport import Transport
from gateway.errors import JobConflict, JobNotFound
from gateway.jobs.job import FINISHED, Job, JobStatus, Rendering
from gateway.jobs.lost import job_ledger
from gateway.jobs.replies import JobReplyConsumer
from gateway.jobs.store import JobStore
from gateway.service import InferenceService
from gateway.v2_codec import ParsedInfer


@dataclass(frozen=True, slots=True)
class JobSettings:
    channel_prefix: str = channels.PREFIX
    poll_timeout_s: float = 1.0


class JobService:
    def __init__(self, inference: InferenceService, store: JobStore, replies: JobReplyConsumer, ledger: SentLedger,
                 settings: JobSettings = JobSettings(), wall_ns: Callable[[], int] = time.time_ns) -> None:
        self._inference = inference
        self._store = store
        self._replies = replies
        self._ledger = ledger
        self._reply_channel = channels.job_reply_channel(settings.channel_prefix)
        self._wall_ns = wall_ns

    async def start(self) -> None:
        await self._replies.start()
        await self._ledger.start()

    async def aclose(self) -> None:
        await self._replies.aclose()
        await self._ledger.aclose()
        await self._store.aclose()

    @property
    def lost(self) -> Counter[tuple[str, str]]:
        """Jobs whose requests the broker lost, by (model, "sent_again" or "failed")."""
        return self._ledger.counts

    async def submit(self, model: str, version: str, parsed: ParsedInfer,
                     trace: dict[str, str] | None = None) -> Job:
        job_id = uuid.uuid4().hex
        # The span covers only the submission; the workers' spans, later, are its children.
        with self._inference.tracer.span(model, job_id, trace, job=True) as span:
            request = self._inference.envelope(model, version, parsed, span.trace, self._reply_channel, job_id)
            job = Job(job_id, request.model, version, self._wall_ns(),
                      Rendering(parsed.id, parsed.outputs, parsed.binary_output_default))
            # Stored before it is published, so its reply always finds it.
            await self._store.create(job)
            try:
                channel, message_id = await self._inference.publish(request)
            except BaseException:
                await self._store.discard(job_id)
                raise
            # A sequence's step is not looked for: a worker may forward it to the sequence's home
            # and ack it, and sent again it could be applied twice.
            if request.sequence_id is None:
                self._ledger.record(job_id, channel, message_id, request.model,
                                    partial(self._inference.resend, channel, request))
            return job

    async def get(self, job_id: str) -> Job:
        job = await self._store.get(job_id) if _plausible(job_id) else None
        if job is None:
            raise JobNotFound(f"unknown job '{job_id}'")
        return job

    async def cancel(self, job_id: str) -> Job:
        job = await self._store.cancel(job_id) if _plausible(job_id) else None
        if job is None:
            raise JobNotFound(f"unknown job '{job_id}'")
        if job.status in FINISHED or job.status == JobStatus.RUNNING:
            raise JobConflict(f"job '{job_id}' is {job.status.value} and can no longer be cancelled")
        return job


def build_jobs(transport: Transport, store: JobStore, inference: InferenceService, gateway_id: str,
               settings: JobSettings = JobSettings()) -> JobService:
    """Jobs for one gateway; the service owns ``store`` and closes it."""
    replies = JobReplyConsumer(transport, store, gateway_id, settings.channel_prefix, settings.poll_timeout_s)
    return JobService(inference, store, replies, job_ledger(transport, store), settings)


def _plausible(job_id: str) -> bool:
    return len(job_id) == 32 and all(c in "0123456789abcdef" for c in job_id)
