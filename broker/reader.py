"""Reading one channel as one member of a group, acking each message only
after its handler returns. A handler that raises leaves its message pending."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import structlog

from broker.errors import TransportClosed
from broker.transport import Delivery, Transport

log = structlog.get_logger("ferry.broker.reader")

Handler = Callable[[Delivery], Awaitable[None]]


class ChannelReader:
    def __init__(self, transport: Transport, channel: str, group: str, consumer: str,
                 handle: Handler, batch: int = 64, poll_timeout_s: float = 1.0) -> None:
        self._transport = transport
        self._channel = channel
        self._group = group
        self._consumer = consumer
        self._handle = handle
        self._batch = batch
        self._poll_timeout_s = poll_timeout_s
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
                deliveries = await self._transport.fetch(
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
