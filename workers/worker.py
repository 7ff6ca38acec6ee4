"""The worker loop: consume a model's request channel, infer, reply, then ack.

A message is acked only after its reply is published, so a worker that dies
mid-batch leaves the message pending for another to claim. Bytes that are not
a request are answered with an error when a reply channel can still be read
from them, and otherwise go to the dead-letter channel; either way the loop
keeps consuming.

Deliveries a dead consumer left pending are claimed every
``recovery.interval_s`` and handled like fresh ones (see ``workers.recovery``).
``drain()`` stops fetching and waits for what is in flight to be answered and
acked, for a clean shutdown.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field

import msgpack
import numpy as np
import structlog

from broker import channels
from broker.envelope import (
    ErrorInfo, Request, Response, WireTensor, decode_request, encode_response, peek_reply_to,
)
from broker.errors import EnvelopeError, TransportClosed
from broker.transport import Delivery, Transport
from workers.datatypes import encode_array
from workers.errors import ModelNotFound
from workers.recovery import (
    Reclaiming, RecoverySettings, dead_letter_reason, exhausted, exhausted_error,
)
from workers.repository import ModelEntry, ModelRepository, RepositoryIndex
from workers.runner import ModelRunner, error_of

log = structlog.get_logger("ferry.worker")


@dataclass(frozen=True, slots=True)
class WorkerSettings:
    worker_id: str = field(default_factory=lambda: uuid.uuid4().hex[:12])
    models: tuple[str, ...] = ()  # empty: every model in the repository
    fetch_count: int = 64
    max_in_flight: int = 512
    poll_timeout_s: float = 1.0
    channel_prefix: str = channels.PREFIX
    recovery: RecoverySettings = RecoverySettings()


RunnerFactory = Callable[[ModelEntry, int], ModelRunner]


class Worker:
    def __init__(
        self,
        transport: Transport,
        repository: ModelRepository,
        settings: WorkerSettings = WorkerSettings(),
        runner_factory: RunnerFactory = ModelRunner,
    ) -> None:
        self._transport = transport
        self._repository = repository
        self._settings = settings
        self._runner_factory = runner_factory
        self._runners: dict[str, dict[int, ModelRunner]] = {}
        self._consumers: list[asyncio.Task[None]] = []
        self._reclaimer: asyncio.Task[None] | None = None
        self._stopping = asyncio.Event()
        self._handlers: set[asyncio.Task[None]] = set()
        self._in_flight = 0
        self._has_room = asyncio.Event()

    @property
    def worker_id(self) -> str:
        return self._settings.worker_id

    async def __aenter__(self) -> Worker:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def start(self, index: RepositoryIndex | None = None) -> None:
        """Load the models; ``index`` spares a second scan when the caller has one."""
        index = index or self._repository.scan()
        wanted = self._settings.models or tuple(sorted(index.entries))
        for name in wanted:
            entry = index.entries.get(name)
            if entry is None:
                log.error("worker.model_unavailable", model=name, worker=self.worker_id,
                          reason=str(index.errors.get(name, "not in the repository")))
                continue
            await self._load(entry)
        for name in self._runners:
            self._consumers.append(asyncio.create_task(self._consume(name), name=f"consume-{name}"))
        if isinstance(self._transport, Reclaiming) and self._runners:
            self._reclaimer = asyncio.create_task(self._reclaim(self._transport), name="reclaim")

    def ready_models(self) -> dict[str, tuple[int, ...]]:
        return {name: tuple(sorted(versions)) for name, versions in self._runners.items()}

    async def drain(self) -> None:
        """Stop fetching; return once every delivery taken so far is answered and acked."""
        self._stopping.set()
        self._has_room.set()
        await self._stop_reclaiming()
        # Each consumer finishes the fetch it is in (at most poll_timeout_s), so
        # nothing Redis already handed this consumer is left unhandled.
        await asyncio.gather(*self._consumers, return_exceptions=True)
        await asyncio.gather(*self._handlers, return_exceptions=True)

    async def aclose(self) -> None:
        self._stopping.set()
        await self._stop_reclaiming()
        for task in self._consumers:
            task.cancel()
        await asyncio.gather(*self._consumers, return_exceptions=True)
        await asyncio.gather(*self._handlers, return_exceptions=True)
        for versions in self._runners.values():
            for runner in versions.values():
                await runner.aclose()
        self._runners.clear()

    async def _load(self, entry: ModelEntry) -> None:
        for version in entry.versions:
            runner = self._runner_factory(entry, version)
            try:
                await runner.start()
            except Exception as exc:
                log.error("worker.load_failed", model=entry.name, version=version, error=str(exc))
                await runner.aclose()
                continue
            self._runners.setdefault(entry.name, {})[version] = runner

    async def _consume(self, model: str) -> None:
        prefix = self._settings.channel_prefix
        channel = channels.request_channel(model, prefix)
        group = channels.worker_group(model, prefix)
        while not self._stopping.is_set():
            await self._room()
            if self._stopping.is_set():
                return
            limit = min(self._settings.fetch_count, self._settings.max_in_flight - self._in_flight)
            try:
                deliveries = await self._transport.fetch(
                    channel, group, self.worker_id, limit, self._settings.poll_timeout_s
                )
            except TransportClosed:
                return
            except Exception as exc:
                log.warning("worker.fetch_failed", channel=channel, error=str(exc))
                await asyncio.sleep(0.5)
                continue
            self._dispatch(model, deliveries)

    async def _reclaim(self, transport: Reclaiming) -> None:
        recovery = self._settings.recovery
        while True:
            await asyncio.sleep(recovery.interval_s)
            for model in list(self._runners):
                await self._reclaim_model(transport, model, recovery)

    async def _reclaim_model(self, transport: Reclaiming, model: str, recovery: RecoverySettings) -> None:
        room = min(self._settings.fetch_count, self._settings.max_in_flight - self._in_flight)
        if room <= 0:
            return
        prefix = self._settings.channel_prefix
        channel = channels.request_channel(model, prefix)
        try:
            deliveries = await transport.claim_stale(
                channel, channels.worker_group(model, prefix), self.worker_id, recovery.idle_s, room
            )
        except TransportClosed:
            return
        except Exception as exc:
            log.warning("worker.claim_failed", channel=channel, error=str(exc))
            return
        if deliveries:
            log.info("worker.claimed", channel=channel, count=len(deliveries), worker=self.worker_id)
        self._dispatch(model, deliveries)

    async def _stop_reclaiming(self) -> None:
        if self._reclaimer is not None:
            self._reclaimer.cancel()
            await asyncio.gather(self._reclaimer, return_exceptions=True)
            self._reclaimer = None

    def _dispatch(self, model: str, deliveries: list[Delivery]) -> None:
        for delivery in deliveries:
            self._in_flight += 1
            task = asyncio.create_task(self._handle(model, delivery))
            self._handlers.add(task)
            task.add_done_callback(self._handler_done)

    async def _room(self) -> None:
        while self._in_flight >= self._settings.max_in_flight and not self._stopping.is_set():
            self._has_room.clear()
            await self._has_room.wait()

    def _handler_done(self, task: asyncio.Task[None]) -> None:
        self._handlers.discard(task)
        self._in_flight -= 1
        self._has_room.set()
        if not task.cancelled() and task.exception() is not None:
            log.error("worker.handler_failed", error=repr(task.exception()))

    async def _handle(self, model: str, delivery: Delivery) -> None:
        if exhausted(delivery, self._settings.recovery):
            await self._give_up(delivery)
            return
        try:
            request = decode_request(delivery.payload)
        except EnvelopeError as exc:
            await self._reject(delivery, str(exc))
            return
        response = await self._respond(model, request)
        await self._transport.publish(request.reply_to, encode_response(response))
        await self._transport.ack(delivery)

    async def _respond(self, model: str, request: Request) -> Response:
        try:
            runner = self._runner(model, request)
            outputs = await runner.infer(request)
            return Response(
                id=request.id,
                model=runner.entry.name,
                model_version=str(runner.version),
                outputs=tuple(_wire(name, array) for name, array in outputs.items()),
            )
        except Exception as exc:
            error = error_of(exc)
            log.info("worker.request_failed", model=request.model, request_id=request.id,
                     code=error.code, error=str(error))
            return Response(id=request.id, model=request.model, model_version=request.model_version,
                            error=ErrorInfo(error.code, str(error)))

    def _runner(self, model: str, request: Request) -> ModelRunner:
        if request.model != model:
            raise ModelNotFound(f"model '{request.model}' is not served on the request channel of '{model}'")
        versions = self._runners.get(model)
        if not versions:
            raise ModelNotFound(f"model '{model}' is not loaded")
        if not request.model_version:
            return versions[max(versions)]
        try:
            return versions[int(request.model_version)]
        except (ValueError, KeyError):
            raise ModelNotFound(f"model '{model}' has no version '{request.model_version}' loaded") from None

    async def _reject(self, delivery: Delivery, reason: str) -> None:
        target = peek_reply_to(delivery.payload)
        if target is not None:
            request_id, reply_to = target
            error = ErrorInfo("invalid_argument", f"malformed request envelope: {reason}")
            await self._transport.publish(reply_to, encode_response(Response(id=request_id, model="", error=error)))
        else:
            await self._transport.publish(
                channels.dead_letter_channel(self._settings.channel_prefix),
                encode_dead_letter(delivery, reason),
            )
        log.warning("worker.bad_message", channel=delivery.channel, message_id=delivery.message_id,
                    reason=reason, answered=target is not None)
        await self._transport.ack(delivery)


    async def _give_up(self, delivery: Delivery) -> None:
        reason = dead_letter_reason(delivery)
        await self._transport.publish(
            channels.dead_letter_channel(self._settings.channel_prefix), encode_dead_letter(delivery, reason)
        )
        target = peek_reply_to(delivery.payload)
        if target is not None:
            request_id, reply_to = target
            error = exhausted_error(delivery, self._settings.recovery)
            await self._transport.publish(reply_to, encode_response(Response(id=request_id, model="", error=error)))
        log.warning("worker.dead_lettered", channel=delivery.channel, message_id=delivery.message_id,
                    reason=reason, answered=target is not None)
        await self._transport.ack(delivery)


def encode_dead_letter(delivery: Delivery, reason: str) -> bytes:
    return msgpack.packb({
        "v": 1,
        "kind": "dead_letter",
        "channel": delivery.channel,
        "message_id": delivery.message_id,
        "attempts": delivery.attempts,
        "reason": reason,
        "payload": delivery.payload,
    }, use_bin_type=True)


def _wire(name: str, array: np.ndarray) -> WireTensor:
    datatype, data = encode_array(array)
    return WireTensor(name=name, datatype=datatype, shape=tuple(array.shape), data=data)
