"""The gateway's end of model control: publish a load or unload to every
worker, and gather their replies.

Replies come back on this gateway's own control reply channel. ``send``
waits until every worker that was live when the message went out has
answered, or until the timeout, and returns what arrived.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import structlog

from broker import channels
from broker.reader import ChannelReader
from broker.transport import Delivery, Transport
from workers.control.messages import Action, ControlDecodeError, ControlMessage, ControlReply, decode_reply, encode_message
from workers.repository.overrides import LoadOverrides

log = structlog.get_logger("ferry.gateway.control")

LiveWorkers = Callable[[], Awaitable[set[str]]]


@dataclass(slots=True)
class Gathered:
    expected: set[str]
    replies: dict[str, ControlReply] = field(default_factory=dict)
    done: asyncio.Event = field(default_factory=asyncio.Event)

    @property
    def missing(self) -> set[str]:
        return self.expected - self.replies.keys()

    def add(self, reply: ControlReply) -> None:
        self.replies[reply.worker] = reply
        if not self.missing:
            self.done.set()


class ControlClient:
    def __init__(self, transport: Transport, gateway_id: str, live_workers: LiveWorkers,
                 prefix: str = channels.PREFIX, wall_ns: Callable[[], int] = time.time_ns) -> None:
        self._transport = transport
        self._live_workers = live_workers
        self._prefix = prefix
        self._wall_ns = wall_ns
        self._reply_to = channels.control_reply_channel(gateway_id, prefix)
        self._waiting: dict[str, Gathered] = {}
        self._reader = ChannelReader(transport, self._reply_to, f"{self._reply_to}.readers", gateway_id,
                                     self._record, batch=64, poll_timeout_s=0.5)

    async def start(self) -> None:
        await self._reader.start()

    async def aclose(self) -> None:
        await self._reader.aclose()

    async def live_workers(self) -> set[str]:
        return await self._live_workers()

    async def send(self, action: Action, model: str, overrides: LoadOverrides, timeout_s: float,
                   expected: set[str]) -> Gathered:
        message = ControlMessage(uuid.uuid4().hex, action, model, self._reply_to, self._wall_ns(), overrides)
        gathered = Gathered(set(expected))
        self._waiting[message.id] = gathered
        try:
            await self._transport.publish(channels.control_channel(self._prefix), encode_message(message))
            log.info("control.sent", action=action, model=model, workers=sorted(expected))
            try:
                async with asyncio.timeout(timeout_s):
                    await gathered.done.wait()
            except TimeoutError:
                log.warning("control.timeout", action=action, model=model, missing=sorted(gathered.missing))
        finally:
            self._waiting.pop(message.id, None)
        return gathered

    async def _record(self, delivery: Delivery) -> None:
        try:
            reply = decode_reply(delivery.payload)
        except ControlDecodeError as exc:
            log.warning("control.bad_reply", error=str(exc))
            return
        gathered = self._waiting.get(reply.id)
        if gathered is not None:
            gathered.add(reply)
