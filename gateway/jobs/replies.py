"""The shared job-reply channel: every gateway reads it in one group, so each
job's reply is written to the store once, by whichever gateway takes it.

A reply is acked only after the store has it, so a gateway that dies in
between leaves the reply pending for the group. A reply for a job that is no
longer queued (cancelled, expired, a duplicate) is dropped.
"""

from __future__ import annotations

import asyncio

import structlog

from broker import channels
from broker.envelope import decode_response
from broker.errors import EnvelopeError, TransportClosed
from broker.transport import Delivery, Transport
from gateway.jobs.job import JobStatus
from gateway.jobs.names import job_reply_channel, job_reply_group
from gateway.jobs.store import JobStore

log = structlog.get_logger("ferry.gateway.jobs")


class JobReplyConsumer:
    def __init__(self, transport: Transport, store: JobStore, consumer: str,
                 prefix: str = channels.PREFIX, poll_timeout_s: float = 1.0) -> None:
        self._transport = transport
        self._store = store
        self._consumer = consumer
        self.channel = job_reply_channel(prefix)
        self._group = job_reply_group(prefix)
        self._poll_timeout_s = poll_timeout_s
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        self._task = asyncio.create_task(self._loop(), name="job-replies")

    async def aclose(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None

    async def _loop(self) -> None:
        while True:
            try:
                deliveries = await self._transport.fetch(
                    self.channel, self._group, self._consumer, 64, self._poll_timeout_s
                )
                for delivery in deliveries:
                    await self._store_reply(delivery)
                    await self._transport.ack(delivery)
            except TransportClosed:
                return
            except Exception as exc:
                log.warning("jobs.reply_failed", channel=self.channel, error=str(exc))
                await asyncio.sleep(0.5)

    async def _store_reply(self, delivery: Delivery) -> None:
        try:
            response = decode_response(delivery.payload)
        except EnvelopeError as exc:
            log.warning("jobs.bad_reply", channel=self.channel, error=str(exc))
            return
        status = JobStatus.FAILED if response.error is not None else JobStatus.SUCCEEDED
        if not await self._store.finish(response.id, status, delivery.payload):
            log.info("jobs.reply_dropped", job_id=response.id)
