"""A gateway's reply channel: replies are matched to waiting requests by id.

Each gateway reads only its own channel. A reply whose id nobody waits for
(a duplicate after a redelivery, or a late one after the caller gave up) is
acked and dropped, so a client sees exactly one reply per request.
"""

from __future__ import annotations

import asyncio

import structlog

from broker import channels
from broker.envelope import Response, decode_response
from broker.errors import EnvelopeError, TransportClosed
from broker.transport import Transport

log = structlog.get_logger("ferry.gateway.replies")


class ReplyRouter:
    def __init__(
        self,
        transport: Transport,
        gateway_id: str,
        prefix: str = channels.PREFIX,
        poll_timeout_s: float = 1.0,
    ) -> None:
        self._transport = transport
        self._gateway_id = gateway_id
        self.channel = channels.reply_channel(gateway_id, prefix)
        self._group = channels.reply_group(gateway_id, prefix)
        self._poll_timeout_s = poll_timeout_s
        self._waiting: dict[str, asyncio.Future[Response]] = {}
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        self._task = asyncio.create_task(self._loop(), name="reply-router")

    async def aclose(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        for future in self._waiting.values():
            if not future.done():
                future.cancel()
        self._waiting.clear()

    def expect(self, request_id: str) -> asyncio.Future[Response]:
        future: asyncio.Future[Response] = asyncio.get_running_loop().create_future()
        self._waiting[request_id] = future
        return future

    def forget(self, request_id: str) -> None:
        self._waiting.pop(request_id, None)

    async def _loop(self) -> None:
        while True:
            try:
                deliveries = await self._transport.fetch(
                    self.channel, self._group, self._gateway_id, 256, self._poll_timeout_s
                )
            except TransportClosed:
                return
            except Exception as exc:
                log.warning("replies.fetch_failed", channel=self.channel, error=str(exc))
                await asyncio.sleep(0.5)
                continue
            for delivery in deliveries:
                self._route(delivery.payload)
                await self._transport.ack(delivery)

    def _route(self, payload: bytes) -> None:
        try:
            response = decode_response(payload)
        except EnvelopeError as exc:
            log.warning("replies.bad_message", channel=self.channel, error=str(exc))
            return
        future = self._waiting.pop(response.id, None)
        if future is None:
            log.debug("replies.unclaimed", request_id=response.id)
        elif not future.done():
            future.set_result(response)
