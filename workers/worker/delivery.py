"""Handling one delivery, from its bytes to its reply and ack.

Bytes that are not a request are answered with an error when a reply channel
can still be read from them, and otherwise go to the dead-letter channel.

A job request (one that replies to the job channel) is first passed to the
``JobGate``, which marks it running, or says it was cancelled or expired and
must not be computed.

A step of a stateful model's sequence is handled under its sequence's lock,
so one sequence's steps keep their order; ``SessionRouting`` says whether it
is handled here or forwarded to the worker holding the sequence (see
``workers.sequences.sessions``). Such steps are never released for a retry elsewhere:
their state is here.

The handler sees the models only through ``ServedModels``: the runner a
request names, and four questions about a model. A model whose answers are
cached is looked up in the ``AnswerCache`` first (``workers.cache``); a
sequence's steps and a decoupled model's streams never are.

``answer`` computes a request handed over within the process (``ferry serve``
on its embedded broker): as a delivery's, with nothing to decode, redeem,
ack or retry.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from contextlib import AbstractContextManager
from types import TracebackType
from typing import Protocol

import structlog
from structlog.contextvars import bind_contextvars

from broker.claims.check import Claims, NoClaims
from broker.envelope import ErrorInfo, ParamValue, Request, Response
from broker.errors import ClaimMissing, EnvelopeError, TransportError
from broker.transport import Delivery
from workers.cache.cached import AnswerCache
from workers.errors import ModelNotFound
from workers.formats.envelope import MessageFormat
from workers.responder import FINAL_FLAG, Responder, error_of
from workers.sequences.sessions import CHANNEL_PARAMETER, SequenceLocks, SessionRouting
from workers.telemetry import Observer, Timeline
from workers.telemetry.timeline import CANCELLED, EXHAUSTED, REJECTED, RELEASED
from workers.worker.replies import Replier

log = structlog.get_logger("ferry.worker")


class ServedModels(Protocol):
    def use(self, model: str, version: str) -> AbstractContextManager[Responder]:
        """The runner for ``version`` ('' = the newest), counted in flight meanwhile."""
        ...

    def decoupled(self, model: str) -> bool: ...

    def stateful(self, model: str) -> bool: ...

    def retries_failures(self, model: str) -> bool: ...

    def cached(self, model: str) -> bool: ...


class JobGate(Protocol):
    async def begin(self, job_id: str) -> bool:
        """Mark a job running, again on a redelivery; False if it was cancelled,
        has finished or has expired."""
        ...


class JobStarts:
    """Whether a request may be computed: only a job request is asked about."""

    def __init__(self, gate: JobGate | None, job_channel: str) -> None:
        self._gate = gate
        self._job_channel = job_channel

    async def may_start(self, request: Request) -> bool:
        if self._gate is None or request.reply_to != self._job_channel:
            return True
        return await self._gate.begin(request.id)


class DeliveryHandler:
    def __init__(self, models: ServedModels, replier: Replier, message_format: MessageFormat,
                 sessions: SessionRouting, jobs: JobStarts, observer: Observer, worker_id: str,
                 wall_ns: Callable[[], int], claims: Claims = NoClaims(), cache: AnswerCache | None = None) -> None:
        self._models = models
        self._cache = cache
        self._replier = replier
        self._format = message_format
        self._sessions = sessions
        self._locks = SequenceLocks()
        self._jobs = jobs
        self._observer = observer
        self._worker_id = worker_id
        self._wall_ns = wall_ns
        self._claims = claims

    async def handle(self, model: str, delivery: Delivery, computed: Callable[[], None]) -> None:
        """Handle one delivery; ``computed`` is called once its response is computed, before
        the reply goes out (``workers.worker.credit``)."""
        received = self._wall_ns()
        # Every log line about this delivery (this task's) carries these, and its ids once known.
        bind_contextvars(model=model, worker_id=self._worker_id)
        if await self._replier.give_up_if_exhausted(delivery):
            self._unread(model, received, EXHAUSTED)
            return
        try:
            request = self._format.decode(delivery, model)
        except EnvelopeError as exc:
            await self._replier.reject(delivery, str(exc))
            self._unread(model, received, REJECTED)
            return
        bind_contextvars(request_id=request.id)
        with self._observed(request, received) as timeline:
            redeemed = await self._redeemed(model, delivery, request, timeline)
            if redeemed is not None:
                await self._handle_request(model, delivery, redeemed, timeline, computed)

    async def answer(self, request: Request) -> Response:
        """A plain request (neither a sequence's step nor a decoupled model's, not a job's)
        handed over within the process: its response, an error one if it failed."""
        with self._observed(request, self._wall_ns()) as timeline:
            return await self._respond(request.model, request, timeline)

    def _observed(self, request: Request, received: int) -> _Observed:
        timeline = Timeline.of(request, self._worker_id, received)
        self._observer.received(timeline)
        return _Observed(self, timeline)

    async def _redeemed(self, model: str, delivery: Delivery, request: Request, timeline: Timeline) -> Request | None:
        """``request`` with its claim-checked inputs' bytes; None when it was answered
        with an error instead (the bytes are gone) or left pending (the store is down)."""
        try:
            return await self._claims.redeem_request(request)
        except ClaimMissing as exc:
            response = Response(id=request.id, model=request.model, model_version=request.model_version,
                                error=ErrorInfo("unavailable", str(exc)))
            timeline.outcome = "unavailable"
            await self._replier.reply(model, delivery, request, response)
        except TransportError as exc:
            log.warning("worker.claims_unreadable", model=model, request_id=request.id, error=str(exc))
            timeline.outcome = RELEASED  # left pending; claimed again once idle
        return None

    def _unread(self, model: str, received: int, outcome: str) -> None:
        timeline = Timeline.unread(model, self._worker_id, received)
        self._observer.received(timeline)
        timeline.outcome, timeline.done_ns = outcome, self._wall_ns()
        self._observer.finished(timeline)

    async def _handle_request(self, model: str, delivery: Delivery, request: Request, timeline: Timeline,
                              computed: Callable[[], None]) -> None:
        if self._models.decoupled(model):
            await self._stream(model, delivery, request, timeline)
            return
        if request.sequence_id is not None and self._models.stateful(model):
            async with self._locks.hold(model, request.sequence_id):
                await self._serve_step(model, delivery, request, timeline, computed)
            return
        if not await self._may_start(delivery, request, timeline):
            log.info("worker.job_skipped", model=model, request_id=request.id)
            return
        response = await self._respond(model, request, timeline)
        computed()
        if response.error is not None and self._models.retries_failures(model) and \
                await self._replier.retry_or_give_up(delivery, response.error, timeline):
            return
        await self._replier.reply(model, delivery, request, response)

    async def _may_start(self, delivery: Delivery, request: Request, timeline: Timeline) -> bool:
        """False, with the delivery acked, for a job that must not be computed."""
        if await self._jobs.may_start(request):
            return True
        await self._replier.ack(delivery)
        timeline.outcome = CANCELLED
        return False

    async def _serve_step(self, model: str, delivery: Delivery, request: Request, timeline: Timeline,
                          computed: Callable[[], None]) -> None:
        """One step of a sequence: here, or forwarded to the worker holding it."""
        try:
            route = await self._sessions.route(model, request, delivery.channel)
        except TransportError as exc:
            log.warning("worker.route_failed", model=model, request_id=request.id, error=str(exc))
            timeline.outcome = RELEASED
            return  # left pending; claimed again once idle
        if route.forward_to is not None:
            await self._replier.forward(delivery, route.forward_to)
            timeline.outcome = RELEASED
            return
        if not await self._may_start(delivery, request, timeline):
            return
        response = await self._respond(model, request, timeline)
        computed()
        if route.home is not None:
            response = dataclasses.replace(response, parameters={**response.parameters, CHANNEL_PARAMETER: route.home})
        await self._replier.reply(model, delivery, request, response)

    async def _stream(self, model: str, delivery: Delivery, request: Request, timeline: Timeline) -> None:
        """A decoupled model: publish each response as it comes, then a final,
        empty one (or the error), then ack. Every response is tagged with
        ``triton_final_response`` so a client knows which one ends the stream."""
        if not await self._may_start(delivery, request, timeline):
            return
        try:
            with self._runner(model, request) as runner:
                timeline.version = str(runner.version)
                timeline.compute_start_ns = self._wall_ns()
                async for response in runner.respond_stream(request):
                    await self._replier.reply(model, delivery, request, response, ack=False)
            final = Response(id=request.id, model=runner.entry.name, model_version=str(runner.version),
                             parameters={FINAL_FLAG: True})
            timeline.compute_end_ns = self._wall_ns()
        except Exception as exc:
            final = self._error_response(request, exc, parameters={FINAL_FLAG: True})
            timeline.outcome = final.error.code if final.error else timeline.outcome
        await self._replier.reply(model, delivery, request, final)

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
                if self._cache is not None and self._models.cached(model):
                    return await self._cache.respond(runner, request, timeline)
                return await runner.respond(request, timeline)
        except Exception as exc:
            _bind_batch(timeline)  # its batch, if one ran, is known now
            return self._error_response(request, exc)

    def _error_response(self, request: Request, exc: Exception,
                        parameters: dict[str, ParamValue] | None = None) -> Response:
        error = error_of(exc)
        log.info("worker.request_failed", model=request.model, request_id=request.id,
                 code=error.code, error=str(error))
        return Response(id=request.id, model=request.model, model_version=request.model_version,
                        error=ErrorInfo(error.code, str(error)), parameters=parameters or {})

    def _runner(self, model: str, request: Request) -> AbstractContextManager[Responder]:
        """The runner for the request, counted in flight while the ``with`` block runs."""
        if request.model != model:
            raise ModelNotFound(f"model '{request.model}' is not served on the request channel of '{model}'")
        return self._models.use(model, request.model_version)


class _Observed:
    """A request's timeline, told to the observer as finished when the ``with`` block
    ends (a class, not a generator: every request enters one)."""

    __slots__ = ("_handler", "_timeline")

    def __init__(self, handler: DeliveryHandler, timeline: Timeline) -> None:
        self._handler = handler
        self._timeline = timeline

    def __enter__(self) -> Timeline:
        return self._timeline

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self._timeline.done_ns = self._handler._wall_ns()
        self._handler._observer.finished(self._timeline)


def _bind_batch(timeline: Timeline) -> None:
    if timeline.batch_id:
        bind_contextvars(batch_id=timeline.batch_id)
