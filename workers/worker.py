"""The worker loop: consume a model's request channel, infer, reply, then ack.

A message is acked only after its reply is published, so a worker that dies
mid-batch leaves the message pending for another to claim. Bytes that are not
a request are answered with an error when a reply channel can still be read
from them, and otherwise go to the dead-letter channel; either way the loop
keeps consuming.

A model with priority levels has a request channel per level; the worker
drains the highest level first. Each model may hold at most ``prefetch``
rounds of its instances' capacity in flight, so on a shared broker the queue
stays on the broker for idle workers instead of piling up on a busy one.

Every ``recovery.interval_s`` the worker claims deliveries a dead consumer
left pending and handles them like fresh ones (see ``workers.recovery``), and
trims what every group has acked from its request channels.

A job request (one that replies to the job channel) is first passed to the
``JobGate``, which marks it running, or says it was cancelled or expired and
must not be computed.

A step of a stateful model's sequence is handled under its sequence's lock,
so one sequence's steps keep their order; ``SessionRouting`` says whether it
is handled here or forwarded to the worker holding the sequence (see
``workers.sessions``). Such steps are never released for a retry elsewhere:
their state is here.

``drain()`` stops fetching and waits for what is in flight to be answered and
acked, for a clean shutdown.

``load_model`` and ``unload_model`` change what is served while the worker
runs (``workers.model_loader`` builds the runners, ``workers.model_set``
hands them over and drains the old ones); the control mode in
``WorkerSettings.control`` says which models load at start.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
import uuid
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass, field

from typing import Protocol

import numpy as np
import structlog
from structlog.contextvars import bind_contextvars

from broker import channels
from broker.envelope import ErrorInfo, ParamValue, Request, Response, WireTensor
from broker.errors import EnvelopeError, TransportClosed, TransportError
from broker.transport import Delivery, Reclaiming, Transport
from workers.control import ControlSettings
from workers.datatypes import encode_array
from workers.deadletter import DeadLetters, DeadLetterSettings
from workers.ensemble.broker_caller import BrokerStepCaller
from workers.ensemble.runner import EnsembleRunner
from workers.errors import ModelNotFound
from workers.formats import EnvelopeFormat, MessageFormat
from workers.model_loader import ModelLoader
from workers.model_set import ModelSet, Served
from workers.overrides import LoadOverrides
from workers.recovery import (
    RETRIABLE_CODES, RecoverySettings, dead_letter_reason, exhausted, exhausted_error,
)
from workers.repository import ModelEntry, ModelRepository, RepositoryIndex
from workers.runner import ModelRunner, error_of
from workers.sessions import CHANNEL_PARAMETER, LocalSessions, SequenceLocks, SessionRouting
from workers.telemetry import NO_OBSERVER, Observer, Timeline
from workers.telemetry.timeline import CANCELLED, EXHAUSTED, REJECTED, RELEASED

log = structlog.get_logger("ferry.worker")

FINAL_FLAG = "triton_final_response"  # Triton's name for the flag on a decoupled model's responses


@dataclass(frozen=True, slots=True)
class WorkerSettings:
    worker_id: str = field(default_factory=lambda: uuid.uuid4().hex[:12])
    models: tuple[str, ...] = ()  # empty: every model in the repository
    fetch_count: int = 64
    max_in_flight: int = 512
    prefetch: int = 2  # rounds of a model's instance capacity held in flight
    poll_timeout_s: float = 1.0
    channel_prefix: str = channels.PREFIX
    recovery: RecoverySettings = RecoverySettings()
    control: ControlSettings = ControlSettings()
    dead_letters: DeadLetterSettings = DeadLetterSettings()


RunnerFactory = Callable[[ModelEntry, int], ModelRunner]


class JobGate(Protocol):
    async def begin(self, job_id: str) -> bool:
        """Mark a job running, again on a redelivery; False if it was cancelled,
        has finished or has expired."""


class _Credit:
    """How many more deliveries one model may take."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.used = 0
        self.freed = asyncio.Event()

    @property
    def room(self) -> int:
        return max(0, self.limit - self.used)


class Worker:
    def __init__(
        self,
        transport: Transport,
        repository: ModelRepository,
        settings: WorkerSettings = WorkerSettings(),
        runner_factory: RunnerFactory | None = None,
        job_gate: JobGate | None = None,
        message_format: MessageFormat = EnvelopeFormat(),
        sessions: SessionRouting | None = None,
        observer: Observer = NO_OBSERVER,
        wall_ns: Callable[[], int] = time.time_ns,
    ) -> None:
        self._transport = transport
        self._observer = observer
        self._wall_ns = wall_ns
        self._sessions = sessions or LocalSessions()
        self._locks = SequenceLocks()
        self._format = message_format
        self._dead_letters = DeadLetters(transport, settings.channel_prefix, message_format, settings.dead_letters,
                                         observer)
        self._job_gate = job_gate
        self._job_channel = channels.job_reply_channel(settings.channel_prefix)
        self._repository = repository
        self._settings = settings
        self._runner_factory = runner_factory or self._new_runner
        self._models = ModelSet()
        self._loader = ModelLoader(repository, self._runner_factory)
        self._model_locks: dict[str, asyncio.Lock] = {}
        self._consumers: dict[str, asyncio.Task[None]] = {}
        self._unloading: set[str] = set()
        self._reclaimer: asyncio.Task[None] | None = None
        self._stopping = asyncio.Event()
        self._handlers: set[asyncio.Task[None]] = set()
        self._credits: dict[str, _Credit] = {}
        # Ensembles' steps go to their models over the broker; replies come back here.
        self._steps = BrokerStepCaller(transport, settings.worker_id, settings.channel_prefix)

    @property
    def worker_id(self) -> str:
        return self._settings.worker_id

    async def __aenter__(self) -> Worker:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def start(self, index: RepositoryIndex | None = None) -> None:
        """Load the models the control mode starts with; ``index`` spares a
        second scan when the caller has one."""
        index = index or self._repository.scan()
        served = self._settings.models or tuple(sorted(index.entries))
        for name in self._settings.control.startup_models(served):
            if name not in index.entries:
                log.error("worker.model_unavailable", model=name, worker_id=self.worker_id,
                          reason=str(index.errors.get(name, "not in the repository")))
                continue
            try:
                await self.load_model(name)
            except Exception as exc:
                log.error("worker.load_failed", model=name, worker_id=self.worker_id, error=str(exc))

    def ready_models(self) -> dict[str, tuple[int, ...]]:
        return self._models.ready()

    def serves(self, model: str) -> bool:
        """Whether this worker may serve ``model`` (``WorkerSettings.models``)."""
        return not self._settings.models or model in self._settings.models

    async def load_model(self, model: str, overrides: LoadOverrides = LoadOverrides()) -> tuple[int, ...]:
        """Load or reload ``model``; return once its versions are ready, after
        the versions it replaced have answered what they were computing."""
        async with self._model_locks.setdefault(model, asyncio.Lock()):
            served = await self._loader.build(model, overrides, self._models.get(model))
            retired = self._models.install(model, served)
            self._serve(model, served)
            await self._models.retire(retired)
        return tuple(sorted(served.runners))

    async def unload_model(self, model: str) -> bool:
        """Stop consuming ``model``, answer what was taken, then unload it. False if it was not loaded."""
        async with self._model_locks.setdefault(model, asyncio.Lock()):
            if self._models.get(model) is None:
                return False
            self._unloading.add(model)
            credit = self._credits[model]
            credit.freed.set()
            try:
                await asyncio.gather(self._consumers.pop(model), return_exceptions=True)
                while credit.used:
                    credit.freed.clear()
                    await credit.freed.wait()
                await self._models.retire(self._models.remove(model))
            finally:
                self._unloading.discard(model)
                self._credits.pop(model, None)
            return True

    def _serve(self, model: str, served: Served) -> None:
        """Size the model's credit to its runners and make sure it is consumed."""
        capacity = max(runner.capacity for runner in served.runners.values())
        limit = max(1, min(self._settings.max_in_flight, capacity * max(1, self._settings.prefetch)))
        credit = self._credits.setdefault(model, _Credit(limit))
        credit.limit = limit
        credit.freed.set()
        if model not in self._consumers and not self._stopping.is_set():
            self._consumers[model] = asyncio.create_task(self._consume(model), name=f"consume-{model}")
        if self._reclaimer is None and not self._stopping.is_set():
            self._reclaimer = asyncio.create_task(self._maintain(), name="maintain")

    async def drain(self) -> None:
        """Stop fetching; return once every delivery taken so far is answered and acked."""
        self._stopping.set()
        for credit in self._credits.values():
            credit.freed.set()
        await self._stop_reclaiming()
        # Each consumer finishes the fetch it is in (at most poll_timeout_s), so
        # nothing Redis already handed this consumer is left unhandled.
        await asyncio.gather(*self._consumers.values(), return_exceptions=True)
        await asyncio.gather(*self._handlers, return_exceptions=True)

    async def aclose(self) -> None:
        self._stopping.set()
        await self._stop_reclaiming()
        for task in self._consumers.values():
            task.cancel()
        await asyncio.gather(*self._consumers.values(), return_exceptions=True)
        # An ensemble's steps may wait on models no longer consumed: end those waits.
        await self._steps.aclose()
        await asyncio.gather(*self._handlers, return_exceptions=True)
        await self._models.aclose()

    def _new_runner(self, entry: ModelEntry, version: int) -> ModelRunner | EnsembleRunner:
        if entry.config.ensemble_scheduling is not None:
            return EnsembleRunner(entry, version, self._steps, lambda name: self._repository.entry(name).config,
                                  self._settings.channel_prefix)
        return ModelRunner(entry, version, state_store=self._sessions.state_store, observer=self._observer)

    def _request_channels(self, model: str) -> tuple[str, ...]:
        levels = max(runner.priority_levels for runner in self._models.runners(model).values())
        return channels.request_channels(model, levels, self._settings.channel_prefix)

    def _stateful(self, model: str) -> bool:
        return any(r.config.sequence_batching is not None for r in self._models.runners(model).values())

    def _decoupled(self, model: str) -> bool:
        return any(r.config.decoupled for r in self._models.runners(model).values())

    def _ensemble(self, model: str) -> bool:
        return any(isinstance(r, EnsembleRunner) for r in self._models.runners(model).values())

    def _channels(self, model: str) -> tuple[str, ...]:
        """Session channels first: they carry sequences already under way."""
        sessions = self._sessions.channels(model) if self._stateful(model) else ()
        return (*sessions, *self._request_channels(model))

    async def _consume(self, model: str) -> None:
        group = channels.worker_group(model, self._settings.channel_prefix)
        credit = self._credits[model]
        while not self._stopping.is_set() and model not in self._unloading:
            names = self._channels(model)  # grows when a dead worker's sessions are adopted
            while credit.room == 0 and not self._stopping.is_set() and model not in self._unloading:
                credit.freed.clear()
                await credit.freed.wait()
            if self._stopping.is_set() or model in self._unloading:
                return
            limit = min(self._settings.fetch_count, credit.room)
            try:
                deliveries = await self._transport.fetch_first(
                    names, group, self.worker_id, limit, self._settings.poll_timeout_s
                )
            except TransportClosed:
                return
            except Exception as exc:
                log.warning("worker.fetch_failed", channels=names, error=str(exc))
                await asyncio.sleep(0.5)
                continue
            self._dispatch(model, deliveries)

    async def _maintain(self) -> None:
        recovery = self._settings.recovery
        while True:
            await asyncio.sleep(recovery.interval_s)
            for model in self._models.names():
                if model in self._unloading:
                    continue
                # Only request channels: what sits pending on a session channel is
                # this worker's own work, already being handled in sequence order.
                for channel in self._request_channels(model):
                    if isinstance(self._transport, Reclaiming):
                        await self._reclaim(self._transport, model, channel, recovery.idle_s)
                for channel in self._channels(model):
                    await self._trim(channel)
            await self._adopt_sessions()

    async def _adopt_sessions(self) -> None:
        """Take over dead workers' session channels, handling what they left
        pending before reading anything new there."""
        try:
            adopted = await self._sessions.maintain([m for m in self._models.names() if self._stateful(m)])
        except TransportError as exc:
            log.warning("worker.sessions_failed", error=str(exc))
            return
        if not isinstance(self._transport, Reclaiming):
            return
        for model, adopted_channels in adopted.items():
            for channel in adopted_channels:
                await self._reclaim(self._transport, model, channel, 0.0, limit=self._settings.max_in_flight)

    async def _reclaim(self, transport: Reclaiming, model: str, channel: str, idle_s: float,
                       limit: int | None = None) -> None:
        credit = self._credits.get(model)
        if credit is None or model in self._unloading:
            return
        room = limit if limit is not None else min(self._settings.fetch_count, credit.room)
        if room <= 0:
            return
        group = channels.worker_group(model, self._settings.channel_prefix)
        try:
            deliveries = await transport.claim_stale(channel, group, self.worker_id, idle_s, room)
        except TransportClosed:
            return
        except Exception as exc:
            log.warning("worker.claim_failed", channel=channel, error=str(exc))
            return
        if deliveries:
            log.info("worker.claimed", channel=channel, count=len(deliveries), worker_id=self.worker_id)
        self._dispatch(model, deliveries)

    async def _trim(self, channel: str) -> None:
        try:
            await self._transport.trim(channel)
        except TransportClosed:
            return
        except Exception as exc:
            log.warning("worker.trim_failed", channel=channel, error=str(exc))

    async def _stop_reclaiming(self) -> None:
        if self._reclaimer is not None:
            self._reclaimer.cancel()
            await asyncio.gather(self._reclaimer, return_exceptions=True)
            self._reclaimer = None

    def _dispatch(self, model: str, deliveries: list[Delivery]) -> None:
        credit = self._credits[model]
        for delivery in deliveries:
            credit.used += 1
            task = asyncio.create_task(self._handle(model, delivery))
            self._handlers.add(task)
            task.add_done_callback(lambda done: self._handler_done(done, credit))

    def _handler_done(self, task: asyncio.Task[None], credit: _Credit) -> None:
        self._handlers.discard(task)
        credit.used -= 1
        credit.freed.set()
        error = None if task.cancelled() else task.exception()
        if isinstance(error, TransportError):
            # The broker went away mid-delivery; what was not acked is claimed again once idle.
            log.warning("worker.handler_interrupted", error=str(error),
                        retry_after_s=self._settings.recovery.idle_s)
        elif error is not None:
            log.error("worker.handler_failed", error=repr(error))

    async def _handle(self, model: str, delivery: Delivery) -> None:
        received = self._wall_ns()
        # Every log line about this delivery (this task's) carries these, and its ids once known.
        bind_contextvars(model=model, worker_id=self.worker_id)
        if exhausted(delivery, self._settings.recovery):
            await self._dead_letters.give_up(
                delivery, dead_letter_reason(delivery), exhausted_error(delivery, self._settings.recovery)
            )
            await self._transport.ack(delivery)
            self._unread(model, received, EXHAUSTED)
            return
        try:
            request = self._format.decode(delivery, model)
        except EnvelopeError as exc:
            await self._dead_letters.reject(delivery, str(exc))
            await self._transport.ack(delivery)
            self._unread(model, received, REJECTED)
            return
        bind_contextvars(request_id=request.id)
        timeline = Timeline.of(request, self.worker_id, received)
        self._observer.received(timeline)
        try:
            await self._handle_request(model, delivery, request, timeline)
        finally:
            timeline.done_ns = self._wall_ns()
            self._observer.finished(timeline)

    def _unread(self, model: str, received: int, outcome: str) -> None:
        timeline = Timeline.unread(model, self.worker_id, received)
        self._observer.received(timeline)
        timeline.outcome, timeline.done_ns = outcome, self._wall_ns()
        self._observer.finished(timeline)

    async def _handle_request(self, model: str, delivery: Delivery, request: Request, timeline: Timeline) -> None:
        if self._decoupled(model):
            await self._stream(model, delivery, request, timeline)
            return
        if request.sequence_id is not None and self._stateful(model):
            async with self._locks.hold(model, request.sequence_id):
                await self._serve_step(model, delivery, request, timeline)
            return
        if not await self._may_start(request):
            log.info("worker.job_skipped", model=model, request_id=request.id)
            await self._transport.ack(delivery)
            timeline.outcome = CANCELLED
            return
        response = await self._respond(model, request, timeline)
        # An ensemble's steps were retried where they ran; retrying it would repeat them all.
        if response.error is not None and not self._ensemble(model) and await self._retry_or_give_up(
                delivery, response.error, timeline):
            return
        await self._reply(model, delivery, request, response)

    async def _serve_step(self, model: str, delivery: Delivery, request: Request, timeline: Timeline) -> None:
        """One step of a sequence: here, or forwarded to the worker holding it."""
        try:
            route = await self._sessions.route(model, request, delivery.channel)
        except TransportError as exc:
            log.warning("worker.route_failed", model=model, request_id=request.id, error=str(exc))
            timeline.outcome = RELEASED
            return  # left pending; claimed again once idle
        if route.forward_to is not None:
            await self._forward(delivery, route.forward_to)
            timeline.outcome = RELEASED
            return
        if not await self._may_start(request):
            await self._transport.ack(delivery)
            timeline.outcome = CANCELLED
            return
        response = await self._respond(model, request, timeline)
        if route.home is not None:
            response = dataclasses.replace(response, parameters={**response.parameters, CHANNEL_PARAMETER: route.home})
        await self._reply(model, delivery, request, response)

    async def _stream(self, model: str, delivery: Delivery, request: Request, timeline: Timeline) -> None:
        """A decoupled model: publish each response as it comes, then a final,
        empty one (or the error), then ack. Every response is tagged with
        ``triton_final_response`` so a client knows which one ends the stream."""
        if not await self._may_start(request):
            await self._transport.ack(delivery)
            timeline.outcome = CANCELLED
            return
        try:
            with self._runner(model, request) as runner:
                timeline.version = str(runner.version)
                timeline.compute_start_ns = self._wall_ns()
                async for outputs in runner.infer_stream(request):
                    await self._reply(model, delivery, request, _stream_response(runner, request, outputs),
                                      ack=False)
            final = Response(id=request.id, model=runner.entry.name, model_version=str(runner.version),
                             parameters={FINAL_FLAG: True})
            timeline.compute_end_ns = self._wall_ns()
        except Exception as exc:
            final = self._error_response(request, exc, parameters={FINAL_FLAG: True})
            timeline.outcome = final.error.code if final.error else timeline.outcome
        await self._reply(model, delivery, request, final)

    async def _forward(self, delivery: Delivery, channel: str) -> None:
        try:
            await self._transport.publish(channel, delivery.payload, headers=delivery.headers)
            await self._transport.ack(delivery)
        except TransportError as exc:
            log.warning("worker.forward_failed", channel=channel, message_id=delivery.message_id, error=str(exc))

    async def _reply(self, model: str, delivery: Delivery, request: Request, response: Response,
                     ack: bool = True) -> None:
        reply = self._format.reply(delivery, request, response)
        try:
            if reply is not None:
                await self._transport.publish(reply.channel, reply.payload, key=reply.key, headers=reply.headers)
            if ack:
                await self._transport.ack(delivery)
        except TransportError as exc:
            # Left unacked, so it is claimed and computed again once idle (the broker may be back by then).
            log.warning("worker.reply_failed", model=model, request_id=request.id, message_id=delivery.message_id,
                        error=str(exc), retry_after_s=self._settings.recovery.idle_s)

    async def _may_start(self, request: Request) -> bool:
        if self._job_gate is None or request.reply_to != self._job_channel:
            return True
        return await self._job_gate.begin(request.id)

    async def _retry_or_give_up(self, delivery: Delivery, error: ErrorInfo, timeline: Timeline) -> bool:
        """For a failed request: True if it was released for another try or
        dead-lettered (and answered), False if its error is the answer."""
        recovery = self._settings.recovery
        if not recovery.retry_failures or error.code not in RETRIABLE_CODES:
            return False
        if delivery.attempts < recovery.max_deliveries and isinstance(self._transport, Reclaiming):
            await self._transport.release(delivery)
            timeline.outcome = RELEASED
            log.info("worker.released", channel=delivery.channel, message_id=delivery.message_id,
                     attempts=delivery.attempts, error=error.message)
            return True
        await self._dead_letters.give_up(
            delivery, dead_letter_reason(delivery, error), exhausted_error(delivery, recovery, error)
        )
        await self._transport.ack(delivery)
        return True

    async def _respond(self, model: str, request: Request, timeline: Timeline) -> Response:
        response = await self._compute(model, request, timeline)
        _bind_batch(timeline)
        if response.error is not None:
            timeline.outcome = response.error.code
        return response

    async def _compute(self, model: str, request: Request, timeline: Timeline) -> Response:
        try:
            with self._runner(model, request) as runner:
                timeline.version = str(runner.version)
                if isinstance(runner, EnsembleRunner):
                    timeline.compute_start_ns = self._wall_ns()
                    response = await runner.respond(request)
                    timeline.compute_end_ns = self._wall_ns()
                    return response
                outputs = await runner.infer(request, timeline)
            return Response(
                id=request.id,
                model=runner.entry.name,
                model_version=str(runner.version),
                outputs=tuple(_wire(name, array) for name, array in outputs.items()),
            )
        except Exception as exc:
            _bind_batch(timeline)  # its batch, if one ran, is known now
            return self._error_response(request, exc)

    def _error_response(self, request: Request, exc: Exception, parameters: dict[str, ParamValue] | None = None) -> Response:
        error = error_of(exc)
        log.info("worker.request_failed", model=request.model, request_id=request.id,
                 code=error.code, error=str(error))
        return Response(id=request.id, model=request.model, model_version=request.model_version,
                        error=ErrorInfo(error.code, str(error)), parameters=parameters or {})

    def _runner(self, model: str, request: Request) -> AbstractContextManager[ModelRunner]:
        """The runner for the request, counted in flight while the ``with`` block runs."""
        if request.model != model:
            raise ModelNotFound(f"model '{request.model}' is not served on the request channel of '{model}'")
        return self._models.use(model, request.model_version)


def _bind_batch(timeline: Timeline) -> None:
    if timeline.batch_id:
        bind_contextvars(batch_id=timeline.batch_id)


def _stream_response(runner: ModelRunner, request: Request, outputs: dict[str, np.ndarray]) -> Response:
    return Response(id=request.id, model=runner.entry.name, model_version=str(runner.version),
                    outputs=tuple(_wire(name, array) for name, array in outputs.items()),
                    parameters={FINAL_FLAG: False}, final=False)


def _wire(name: str, array: np.ndarray) -> WireTensor:
    datatype, data = encode_array(array)
    return WireTensor(name=name, datatype=datatype, shape=tuple(array.shape), data=data)
