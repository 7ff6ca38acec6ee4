"""A worker's end of model control: read every control message, apply it, reply.

The worker reads ``ferry.control`` in a group of its own, so it sees every
message any gateway publishes. Messages sent before it started listening are
skipped: a worker that joins later serves what its own flags say. A message
for a model outside ``--models`` is answered ``skipped``; a worker not in
explicit mode answers each message with an error.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Protocol

import structlog

from broker import channels
from broker.errors import TransportError
from broker.reader import ChannelReader
from broker.transport import Delivery, Transport
from workers.control.messages import (
    ControlDecodeError, ControlMessage, ControlReply, ControlSettings, decode_message, encode_reply,
)
from workers.errors import WorkerError
from workers.repository.overrides import LoadOverrides
from workers.responder import error_of

log = structlog.get_logger("ferry.control")


class ManagedModels(Protocol):
    @property
    def worker_id(self) -> str: ...

    def serves(self, model: str) -> bool: ...

    async def load_model(self, model: str, overrides: LoadOverrides = ...) -> tuple[int, ...]: ...

    async def unload_model(self, model: str) -> bool: ...


class ControlListener:
    def __init__(self, transport: Transport, models: ManagedModels, settings: ControlSettings,
                 prefix: str = channels.PREFIX, wall_ns: Callable[[], int] = time.time_ns,
                 poll_timeout_s: float = 0.5) -> None:
        self._transport = transport
        self._settings = settings
        self._models = models
        self._wall_ns = wall_ns
        self._since_ns = 0
        worker = models.worker_id
        self._reader = ChannelReader(transport, channels.control_channel(prefix),
                                     channels.control_group(worker, prefix), worker, self._handle,
                                     batch=16, poll_timeout_s=poll_timeout_s)

    async def start(self) -> None:
        self._since_ns = self._wall_ns()
        await self._reader.start()

    async def aclose(self) -> None:
        await self._reader.aclose()

    async def _handle(self, delivery: Delivery) -> None:
        try:
            message = decode_message(delivery.payload)
        except (ControlDecodeError, WorkerError) as exc:
            log.warning("control.bad_message", message_id=delivery.message_id, error=str(exc))
            return
        if message.sent_ns < self._since_ns:
            return
        reply = await self.apply(message)
        if not message.reply_to:
            return
        try:
            await self._transport.publish(message.reply_to, encode_reply(reply))
        except TransportError as exc:
            log.warning("control.reply_failed", model=message.model, error=str(exc))

    async def apply(self, message: ControlMessage) -> ControlReply:
        worker, model = self._models.worker_id, message.model
        if not self._models.serves(model):
            return ControlReply(message.id, worker, model, "skipped")
        log.info("control.received", action=message.action, model=model, worker_id=worker)
        if not self._settings.accepts_requests:
            return ControlReply(message.id, worker, model, "failed", code="invalid_argument",
                                error=f"worker {worker} runs in model control mode '{self._settings.mode}', "
                                      "which refuses load and unload")
        try:
            if message.action == "load":
                versions = await self._models.load_model(model, message.overrides)
                return ControlReply(message.id, worker, model, "loaded", versions)
            await self._models.unload_model(model)
            return ControlReply(message.id, worker, model, "unloaded")
        except Exception as exc:
            error = error_of(exc)
            log.error("control.failed", action=message.action, model=model, worker_id=worker, error=str(error))
            return ControlReply(message.id, worker, model, "failed", error=str(error), code=error.code)
