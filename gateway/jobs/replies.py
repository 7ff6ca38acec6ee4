"""The shared job-reply channel: every gateway reads it in one group, so each
job's reply is written to the store once, by whichever gateway takes it.

A reply is acked only after the store has it, so a gateway that dies in
between leaves the reply pending for the group, and another gateway claims it
after ``claim_idle_s``. A reply for a job that is no
longer queued (cancelled, expired, a duplicate) is dropped.
"""

from __future__ import annotations


import structlog

from broker import channels
from broker.envelope import decode_response
from broker.errors import EnvelopeError
from broker.reader import ChannelReader
from broker.transport import Delivery, Transport
from gateway.jobs.job import JobStatus
from gateway.jobs.store import JobStore

log = structlog.get_logger("ferry.gateway.jobs")


class JobReplyConsumer:
    def __init__(self, transport: Transport, store: JobStore, consumer: str,
                 prefix: str = channels.PREFIX, poll_timeout_s: float = 1.0, claim_idle_s: float = 10.0) -> None:
        self._transport = transport
        self._store = store
        self.channel = channels.job_reply_channel(prefix)
        self._reader = ChannelReader(transport, self.channel, channels.job_reply_group(prefix), consumer,
                                     self._store_reply, poll_timeout_s=poll_timeout_s, claim_idle_s=claim_idle_s)

    async def start(self) -> None:
        await self._reader.start()

    async def aclose(self) -> None:
        await self._reader.aclose()

    async def _store_reply(self, delivery: Delivery) -> None:
        try:
            response = decode_response(delivery.payload)
        except EnvelopeError as exc:
            log.warning("jobs.bad_reply", channel=self.channel, error=str(exc))
            return
        status = JobStatus.FAILED if response.error is not None else JobStatus.SUCCEEDED
        if not await self._store.finish(response.id, status, delivery.payload):
            log.info("jobs.reply_dropped", job_id=response.id)
