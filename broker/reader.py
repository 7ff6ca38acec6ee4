"""Reading one channel as one member of a group, acking each message only
after its handler returns (those of one read together). A handler that raises
leaves its message, and the rest of that read, pending.

In a group shared by several processes (every gateway reads job replies in
one group), a member that dies leaves what it had taken pending; with
``claim_idle_s`` the reader also takes over messages another member has left
unacked that long, so they are handled once all the same.

Every ``trim_interval_s`` the reader trims its channel of what every group
has acked, so reply channels do not grow without bound.

A reader that is the only member of its group (``exclusive``: a gateway's or
an ensemble host's own reply channel) takes back everything still pending in
its group after any failure, before it reads anything new. A broker that dies
while answering a read may already have recorded the messages as delivered
(Redis persists that in its AOF), so they are pending but never arrived: read
again only by ``>``, they would never be handled, their callers would wait out
their timeouts, and the channel could no longer be trimmed past them.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

import structlog

from broker.errors import TransportClosed
from broker.transport import Delivery, Reclaiming, Transport

log = structlog.get_logger("ferry.broker.reader")

Handler = Callable[[Delivery], Awaitable[None]]


class ChannelReader:
    def __init__(self, transport: Transport, channel: str, group: str, consumer: str,
                 handle: Handler, batch: int = 64, poll_timeout_s: float = 1.0,
                 claim_idle_s: float | None = None, trim_interval_s: float = 1.0,
                 exclusive: bool = False) -> None:
        self._transport = transport
        self._channel = channel
        self._group = group
        self._consumer = consumer
        self._handle = handle
        self._batch = batch
        self._poll_timeout_s = poll_timeout_s
        self._claim_idle_s = claim_idle_s
        self._trim_interval_s = trim_interval_s
        self._exclusive = exclusive
        self._recovering = exclusive  # a restarted owner may find its last reads pending
        self._claimed_at = self._trimmed_at = time.monotonic()
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        self._task = asyncio.create_task(self._loop(), name=f"read-{self._channel}")

    async def aclose(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None

    async def _loop(self) -> None:
        while True:
            try:
                await self._trim()
                if self._recovering:
                    await self._recover()
                deliveries = await self._claim() + await self._transport.fetch(
                    self._channel, self._group, self._consumer, self._batch, self._poll_timeout_s
                )
                await self._handle_all(deliveries)
            except TransportClosed:
                return
            except Exception as exc:
                log.warning("reader.failed", channel=self._channel, error=str(exc))
                self._recovering = self._exclusive
                await asyncio.sleep(0.5)

    async def _handle_all(self, deliveries: list[Delivery]) -> None:
        """Each handled in turn; then those handled acked together (one round trip where the
        transport can), also when a later one's handler raises, which leaves it and the rest pending."""
        handled: list[Delivery] = []
        try:
            for delivery in deliveries:
                await self._handle(delivery)
                handled.append(delivery)
        finally:
            if handled:
                await self._transport.ack_all(handled)

    async def _recover(self) -> None:
        """Handle what the group holds pending: as its only member, all of it is ours."""
        if not isinstance(self._transport, Reclaiming):
            self._recovering = False
            return
        while True:
            pending = await self._transport.claim_stale(self._channel, self._group, self._consumer, 0.0, self._batch)
            if pending:
                log.info("reader.recovered", channel=self._channel, count=len(pending))
            await self._handle_all(pending)
            if len(pending) < self._batch:
                self._recovering = False
                return

    async def _claim(self) -> list[Delivery]:
        idle_s = self._claim_idle_s
        if idle_s is None or not isinstance(self._transport, Reclaiming):
            return []
        if time.monotonic() - self._claimed_at < idle_s / 2:
            return []
        self._claimed_at = time.monotonic()
        claimed = await self._transport.claim_stale(self._channel, self._group, self._consumer, idle_s, self._batch)
        if claimed:
            log.info("reader.claimed", channel=self._channel, count=len(claimed))
        return claimed

    async def _trim(self) -> None:
        if time.monotonic() - self._trimmed_at < self._trim_interval_s:
            return
        self._trimmed_at = time.monotonic()
        await self._transport.trim(self._channel)
