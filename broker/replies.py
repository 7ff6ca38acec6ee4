"""A reply channel: replies are matched to waiting requests by id.

Whoever sends requests and awaits their replies owns one: each gateway, and
each worker that hosts an ensemble (its steps are requests to other models).
Each owner reads only its own channel. A reply whose id nobody waits for
(a duplicate after a redelivery, or a late one after the caller gave up) is
acked and dropped, so a client sees exactly one reply per request.

A streamed request (a decoupled model may answer 0..N times) waits on a
queue instead of a future: every reply goes into it until the final one.

A request recorded with ``sent`` is looked for in its channel after a broker
failure, until its first reply (``broker.lost_requests``): one the broker lost
is sent again, or answered with an error, not left hanging.
"""

from __future__ import annotations

import asyncio
from collections import Counter

import structlog

from broker import channels
from broker.claims.check import Claims, NoClaims
from broker.envelope import ErrorInfo, Response, decode_response
from broker.errors import BrokerError, EnvelopeError
from broker.lost_requests import Resend, SentLedger
from broker.reader import ChannelReader
from broker.transport import Delivery, Transport

log = structlog.get_logger("ferry.broker.replies")


class ReplyRouter:
    def __init__(
        self,
        transport: Transport,
        owner_id: str,
        prefix: str = channels.PREFIX,
        poll_timeout_s: float = 1.0,
        claims: Claims = NoClaims(),
    ) -> None:
        self.channel = channels.reply_channel(owner_id, prefix)
        self._claims = claims
        self._waiting: dict[str, asyncio.Future[Response]] = {}
        self._streams: dict[str, asyncio.Queue[Response]] = {}
        self._ledger = SentLedger(transport, self._answer_lost)
        self._reader = ChannelReader(transport, self.channel, channels.reply_group(owner_id, prefix),
                                     owner_id, self._route, batch=256, poll_timeout_s=poll_timeout_s,
                                     exclusive=True)

    async def start(self) -> None:
        await self._reader.start()
        await self._ledger.start()

    async def aclose(self) -> None:
        await self._reader.aclose()
        await self._ledger.aclose()
        for future in self._waiting.values():
            if not future.done():
                future.cancel()
        self._waiting.clear()

    def expect(self, request_id: str) -> asyncio.Future[Response]:
        future: asyncio.Future[Response] = asyncio.get_running_loop().create_future()
        self._waiting[request_id] = future
        return future

    def expect_stream(self, request_id: str) -> asyncio.Queue[Response]:
        queue: asyncio.Queue[Response] = asyncio.Queue()
        self._streams[request_id] = queue
        return queue

    def sent(self, request_id: str, channel: str, message_id: str, model: str, resend: Resend | None) -> None:
        """The request awaited as ``request_id`` is message ``message_id`` of ``channel``;
        ``resend`` publishes it again, where that is safe (see ``broker.lost_requests``)."""
        self._ledger.record(request_id, channel, message_id, model, resend)

    @property
    def lost(self) -> Counter[tuple[str, str]]:
        """Requests the broker lost, by (model, "sent_again" or "failed")."""
        return self._ledger.counts

    def forget(self, request_id: str) -> None:
        self._waiting.pop(request_id, None)
        self._streams.pop(request_id, None)
        self._ledger.forget(request_id)

    async def _route(self, delivery: Delivery) -> None:
        try:
            response = decode_response(delivery.payload)
        except EnvelopeError as exc:
            log.warning("replies.bad_message", channel=self.channel, error=str(exc))
            return
        self._deliver(await self._redeemed(response))

    async def _answer_lost(self, response: Response) -> None:
        self._deliver(response)

    def _deliver(self, response: Response) -> None:
        self._ledger.forget(response.id)
        queue = self._streams.get(response.id)
        if queue is not None:
            if response.final:
                self._streams.pop(response.id, None)
            queue.put_nowait(response)
            return
        future = self._waiting.pop(response.id, None)
        if future is None:
            log.debug("replies.unclaimed", request_id=response.id)
        elif not future.done():
            future.set_result(response)

    async def _redeemed(self, response: Response) -> Response:
        """The reply with its claim-checked outputs' bytes, or an error in its
        place when they cannot be read: the waiting client is told, not left hanging."""
        try:
            return await self._claims.redeem_response(response)
        except BrokerError as exc:
            log.warning("replies.claims_unreadable", request_id=response.id, error=str(exc))
            return Response(id=response.id, model=response.model, model_version=response.model_version,
                            error=ErrorInfo("unavailable", f"the reply's outputs could not be read: {exc}"),
                            parameters=response.parameters, final=response.final)
