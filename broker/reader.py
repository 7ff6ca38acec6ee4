"""Reading one channel as one member of a group, acking each message only
after its handler returns. A handler that raises leaves its message pending.

In a group shared by several processes (every gateway reads job replies in
one group), a member that dies leaves what it had taken pending; with
``claim_idle_s`` the reader also takes over messages another member has left
unacked that long, so they are handled once all the same.

Every ``trim_interval_s`` the reader trims its channel of what every group
has acked, so reply channels do not grow without bound.
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
                 claim_idle_s: float | None = None, trim_interval_s: float = 1.0) -> None:
        self._transport = transport
        self._channel = channel
        self._group = group
        self._consumer = consumer
        self._handle = handle
        self._batch = batch
        self._poll_timeout_s = poll_timeout_s
        self._claim_idle_s = claim_idle_s
        self._trim_interval_s = trim_interval_s
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
                deliveries = await self._claim() + await self._transport.fetch(
                    self._channel, self._group, self._consumer, self._batch, self._poll_timeout_s
                )
                for delivery in deliveries:
                    await self._handle(delivery)
                    await self._transport.ack(delivery)
            except TransportClosed:
                return
            except Exception as exc:
                log.warning("reader.failed", channel=self._channel, error=str(exc))
                await asyncio.sleep(0.5)

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
