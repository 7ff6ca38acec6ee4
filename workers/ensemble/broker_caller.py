"""Steps as requests over the broker, answered on a reply channel of this process.

Each worker process that hosts an ensemble owns one ``BrokerStepCaller``: a
``ReplyRouter`` reading ``ferry.replies.<worker id>.steps`` (its reply pump),
and a publisher onto step models' request channels. Whichever worker serves a
step's model, in this process or another, answers there.

``start`` may be called by each ensemble the worker loads; the pump starts
once. The worker closes it after its ensembles.
"""

from __future__ import annotations

import asyncio
from dataclasses import replace
from functools import partial

from broker import channels
from broker.claims.check import Claims, NoClaims
from broker.envelope import Request, Response, encode_request
from broker.replies import ReplyRouter
from broker.transport import Transport
from workers.errors import RequestTimeout


def owner_id(worker_id: str) -> str:
    return f"{worker_id}.steps"


class BrokerStepCaller:
    def __init__(self, transport: Transport, worker_id: str, prefix: str = channels.PREFIX,
                 poll_timeout_s: float = 1.0, claims: Claims = NoClaims()) -> None:
        self._transport = transport
        self._claims = claims
        self._router = ReplyRouter(transport, owner_id(worker_id), prefix, poll_timeout_s, claims)
        self._started = False
        self._starting = asyncio.Lock()

    @property
    def reply_channel(self) -> str:
        return self._router.channel

    async def start(self) -> None:
        async with self._starting:
            if not self._started:
                await self._router.start()
                self._started = True

    async def aclose(self) -> None:
        if self._started:
            await self._router.aclose()
            self._started = False

    async def call(self, channel: str, request: Request, timeout_s: float) -> Response:
        request = replace(request, reply_to=self._router.channel)
        future = self._router.expect(request.id)
        try:
            request = await self._claims.stash_request(request, claim_outputs=True)
            message_id = await self._publish(channel, request)
            if request.sequence_id is None:
                # Lost by the broker, a step is published again: its model keeps no state between
                # requests. (A sequence's step may be forwarded to its home, so gone proves nothing.)
                self._router.sent(request.id, channel, message_id, request.model,
                                  partial(self._publish, channel, request))
            async with asyncio.timeout(timeout_s):
                return await future
        except TimeoutError:
            raise RequestTimeout(f"no reply from model '{request.model}' within {timeout_s:g} s") from None
        finally:
            self._router.forget(request.id)

    async def _publish(self, channel: str, request: Request) -> str:
        return await self._transport.publish(channel, encode_request(request))
