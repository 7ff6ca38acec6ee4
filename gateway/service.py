"""The gateway's one core object: turn a parsed V2 request into an envelope,
put it on the model's request channel, and wait for its reply.

A model with priority levels has one request channel per level; the request
goes to the channel of its ``priority`` parameter, or of the model's
``default_priority_level``. A model with ``max_queue_size`` is first asked
for room (``gateway.admission``).

``stream`` is for decoupled models, which answer 0..N times: it publishes
the request, then yields every reply up to the final one. On a Redis fleet
a sequence's steps are published in order through ``SequenceHomes``.

Each request runs inside a span of the ``RequestTracer`` (``gateway.tracing``;
none by default), whose context the envelope carries to the worker.

A request is held to the envelope's ``Limits`` here, before it is published:
one the workers could not decode would otherwise be dead-lettered while its
client waited out the reply timeout.

Given a ``LocalWorker`` (``ferry serve`` on its embedded broker, where the
broker is only a queue in this same process), a plain request goes straight
to that worker and its reply comes straight back: no envelope is encoded, no
message is published, read, acked or replied to. A sequence's step, a job, a
decoupled model's request and one for a model with a ``max_queue_size`` (its
queue is the broker's) still travel the broker, as do requests for a model
the worker does not take directly (see ``Worker.takes_directly``)."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from functools import partial
from typing import Protocol

from structlog.contextvars import bind_contextvars, reset_contextvars

from broker import channels
from broker.claims.check import Claims, NoClaims
from broker.errors import BrokerError
from broker.envelope import DEFAULT_LIMITS, Limits, Request, Response, WireTensor, encode_request
from broker.request_ids import new_request_id
from broker.transport import Transport
from gateway.admission import QueueLimits
from gateway.catalog import ModelCatalog
from gateway.deadlines import Deadlines
from gateway.errors import InvalidRequest, ModelUnavailable, PayloadTooLarge, UpstreamTimeout
from broker.replies import ReplyRouter
from gateway.sequence_homes import SequenceHomes
from gateway.shared_memory.refs import RegionInput
from gateway.tracing import UNTRACED, RequestSpan, RequestTracer
from gateway.v2_codec import ParsedInfer


@dataclass(frozen=True, slots=True)
class ServiceSettings:
    reply_timeout_s: float = 300.0
    channel_prefix: str = channels.PREFIX
    route_sequences: bool = False  # publish a sequence's steps to its worker's session channel (Redis)
    direct: bool = True  # ferry serve on the embedded broker: give its service the worker as a LocalWorker
    direct_on_shared_broker: bool = False  # ferry serve --worker-per-http: on a shared broker too


Answered = Callable[[Response | None], None]


class LocalWorker(Protocol):
    """A worker in this process that computes a request handed to it."""

    def takes_directly(self, model: str) -> bool: ...

    async def answer(self, request: Request) -> Response: ...


def _ignore(response: Response | None) -> None:
    return None


class InferenceService:
    def __init__(
        self,
        transport: Transport,
        router: ReplyRouter,
        catalog: ModelCatalog,
        settings: ServiceSettings = ServiceSettings(),
        wall_ns: Callable[[], int] = time.time_ns,
        limits: QueueLimits | None = None,
        tracer: RequestTracer | None = None,
        claims: Claims = NoClaims(),
        local: LocalWorker | None = None,
    ) -> None:
        self._transport = transport
        self._local = local
        self._claims = claims
        self.tracer: RequestTracer = tracer or UNTRACED
        self._limits = limits
        self._router = router
        self.catalog = catalog
        self._settings = settings
        self._wall_ns = wall_ns
        self._homes = SequenceHomes() if settings.route_sequences else None
        self._deadlines = Deadlines(settings.reply_timeout_s)  # one timer for every request's reply timeout

    async def infer(self, model: str, version: str, parsed: ParsedInfer,
                    trace: dict[str, str] | None = None) -> Response:
        request_id = new_request_id()
        # Every log line about this request carries these. Reset by token, not with structlog's
        # bound_contextvars, which copies and scans the whole context on each request.
        tokens = bind_contextvars(request_id=request_id, model=model)
        try:
            with self.tracer.span(model, request_id, trace) as span:
                response = await self._infer(model, version, parsed, span.trace, request_id)
                span.answered(response)
                return response.with_id(parsed.id)
        finally:
            reset_contextvars(**tokens)

    async def _infer(self, model: str, version: str, parsed: ParsedInfer, trace: dict[str, str],
                     request_id: str) -> Response:
        request = self.envelope(model, version, parsed, trace, self._router.channel, request_id)
        config = self.catalog.entry(request.model).config
        if config.decoupled:
            raise InvalidRequest(f"model '{model}' is decoupled (it may send many responses): use "
                                 f"/v2/models/{model}/generate_stream, /infer_stream or the WebSocket")
        local = self._local
        if local is not None and request.sequence_id is None and config.queue_policy.max_queue_size <= 0 \
                and local.takes_directly(request.model):
            try:
                with self._deadlines.watch():
                    return await local.answer(request)
            except TimeoutError:
                raise self._no_reply(model) from None
        future = self._router.expect(request.id)
        answered: Answered = _ignore
        response: Response | None = None
        try:
            answered = await self._publish_step(request, resendable=True)
            with self._deadlines.watch():
                response = await future
        except TimeoutError:
            raise self._no_reply(model) from None
        finally:
            self._router.forget(request.id)
            answered(response)
        return response

    async def stream(self, model: str, version: str, parsed: ParsedInfer,
                     trace: dict[str, str] | None = None) -> AsyncIterator[Response]:
        """Publish now; the returned iterator yields each reply, the final one last."""
        request_id = new_request_id()
        span = self.tracer.span(model, request_id, trace)
        try:
            request = self.envelope(model, version, parsed, span.trace, self._router.channel, request_id)
            queue = self._router.expect_stream(request.id)
            answered = await self._publish_step(request, resendable=False)
        except BaseException as exc:
            self._router.forget(request_id)
            span.end(exc)
            raise
        return self._replies(request, parsed.id, queue, answered, span)

    async def _replies(self, request: Request, client_id: str, queue: asyncio.Queue[Response],
                       answered: Answered, span: RequestSpan) -> AsyncIterator[Response]:
        first: Response | None = None
        failure: Exception | None = None
        try:
            while True:
                try:
                    with self._deadlines.watch():
                        response = await queue.get()
                except TimeoutError:
                    raise self._no_reply(request.model) from None
                if first is None:
                    first = response
                    answered(response)
                    span.answered(response)
                yield response.with_id(client_id)
                if response.final:
                    return
        except Exception as exc:
            failure = exc
            raise
        finally:
            self._router.forget(request.id)
            if first is None:
                answered(None)
            span.end(failure)

    def _no_reply(self, model: str) -> UpstreamTimeout:
        return UpstreamTimeout(f"no reply for model '{model}' within {self._settings.reply_timeout_s:g} s")

    async def _publish_step(self, request: Request, resendable: bool) -> Answered:
        """Publish; for a sequence step on a Redis fleet, in order and to the
        sequence's session channel once known. Call the result with the reply.

        Should the broker lose it, a ``resendable`` request that is no sequence's step is
        published again, and a stream or a step published to its sequence's session channel
        is answered with an error (``broker.lost_requests``): a step changes its sequence's
        state, and a stream's replies would interleave. A step published to the model's
        channel is not looked for: the worker that reads it may forward it to its sequence's
        home and ack it, so its absence there proves nothing."""
        sequence_id = request.sequence_id
        if self._homes is None or sequence_id is None:
            channel, message_id = await self.publish(request)
            if sequence_id is None:
                resend = partial(self.resend, channel, request) if resendable else None
                self._router.sent(request.id, channel, message_id, request.model, resend)
            return _ignore
        homes, model = self._homes, request.model
        async with homes.ordered(model, sequence_id):
            home = await homes.channel(model, sequence_id)
            channel, message_id = await self.publish(request, home)
            done = homes.published(model, sequence_id)
        if home is not None:  # read there by the home itself, never forwarded
            self._router.sent(request.id, channel, message_id, model, None)
        return lambda response: homes.answered(model, sequence_id, request.sequence_end, response, done)

    def envelope(self, model: str, version: str, parsed: ParsedInfer, trace: dict[str, str] | None,
                 reply_to: str, request_id: str = "") -> Request:
        """The request envelope for a ready model; ``request_id`` defaults to a fresh one."""
        entry, number = self.catalog.version(model, version)
        if not self.catalog.is_ready(entry.name, number):
            raise ModelUnavailable(f"model '{model}' {'version ' + version + ' ' if version else ''}is not ready")
        canonical = "" if number is None else str(number)  # '007' names version 7
        request = build_request(parsed, entry.name, canonical, reply_to, request_id or new_request_id(),
                                self._wall_ns(), trace or {})
        entry.config.priority_level(request.priority)  # a level the model lacks is refused here
        return request

    async def publish(self, request: Request, channel: str | None = None) -> tuple[str, str]:
        """Onto the model's request channel, or onto ``channel`` when given: that channel,
        and the message id the broker gave it."""
        config = self.catalog.entry(request.model).config
        channel = channel or channels.request_channel(request.model, self._settings.channel_prefix,
                                                      config.priority_level(request.priority))
        if self._limits is None:
            return channel, await self._send(channel, request)
        async with self._limits.admission(request.model, config):
            return channel, await self._send(channel, request)

    async def resend(self, channel: str, request: Request) -> str:
        """Publish ``request`` onto ``channel`` again (the broker lost it), past admission,
        which it passed the first time; its new message id."""
        return await self._send(channel, request)

    async def _send(self, channel: str, request: Request) -> str:
        """Large inputs claim-checked, then the envelope published. Its reply comes back
        claim-checked only where this gateway reads it itself (not a job's)."""
        stashed = await self._claims.stash_request(request, claim_outputs=request.reply_to == self._router.channel)
        try:
            return await self._transport.publish(channel, _encoded(stashed), key=_key(request))
        except BaseException:
            with contextlib.suppress(BrokerError):  # else they expire
                await self._claims.release(stashed)
            raise


def _encoded(request: Request, limits: Limits = DEFAULT_LIMITS) -> bytes:
    payload = encode_request(request)
    if len(payload) > limits.max_message_bytes:
        raise PayloadTooLarge(f"request of {len(payload)} bytes as an envelope exceeds the "
                              f"{limits.max_message_bytes}-byte message limit")
    return payload


def _key(request: Request) -> str | None:
    """The partition key: a sequence stays on one partition (Kafka); other
    requests go without one, so the transport spreads them evenly."""
    return str(request.sequence_id) if request.sequence_id is not None else None


def build_request(parsed: ParsedInfer, model: str, version: str, reply_to: str, request_id: str,
                  now_ns: int, trace: dict[str, str] | None = None, limits: Limits = DEFAULT_LIMITS) -> Request:
    """The envelope for a parsed V2 request: the parameters Triton gives meaning
    to (``timeout`` in µs, ``priority``, ``sequence_*``) become envelope fields."""
    _check_length(version, "model version", limits)
    inputs = _envelope_inputs(parsed)
    outputs = tuple([o.name for o in parsed.outputs])
    if not parsed.parameters:  # most requests: every envelope field its default
        return Request(id=request_id, model=model, model_version=version, reply_to=reply_to, inputs=inputs,
                       outputs=outputs, trace=trace or {}, created_ns=now_ns)
    params = dict(parsed.parameters)
    timeout_us = _int_param(params, "timeout", limits.max_timeout_us)
    priority = _int_param(params, "priority")
    sequence_id = _sequence_id(params.pop("sequence_id", None), limits)
    sequence_start = _bool_param(params, "sequence_start")
    sequence_end = _bool_param(params, "sequence_end")
    parameters = {k: v for k, v in params.items() if isinstance(v, (str, int, float, bool))}
    if len(parameters) > limits.max_params:
        raise InvalidRequest(f"request field 'parameters' holds {len(parameters)} entries, more than "
                             f"the {limits.max_params} allowed")
    return Request(
        id=request_id,
        model=model,
        model_version=version,
        reply_to=reply_to,
        inputs=inputs,
        outputs=outputs,
        priority=priority,
        timeout_us=timeout_us,
        deadline_ns=now_ns + timeout_us * 1000 if timeout_us else 0,
        sequence_id=sequence_id,
        sequence_start=sequence_start,
        sequence_end=sequence_end,
        parameters=parameters,
        trace=trace or {},
        created_ns=now_ns,
    )


def _envelope_inputs(parsed: ParsedInfer) -> tuple[WireTensor, ...]:
    """Only the HTTP infer route reads and writes shared memory (``gateway.shared_memory``);
    a region still named here came through another door."""
    named = [(f"input '{t.name}'", t.slice) for t in parsed.inputs if isinstance(t, RegionInput)]
    named += [(f"requested output '{o.name}'", o.region) for o in parsed.outputs if o.region is not None]
    if named:
        where, region = named[0]
        raise InvalidRequest(f"{where}: shared memory region '{region.region}' can be used only "
                             f"through POST /v2/models/<model>/infer")
    return tuple(t for t in parsed.inputs if isinstance(t, WireTensor))


def _int_param(params: dict[str, object], name: str, maximum: int | None = None) -> int:
    value = params.pop(name, 0)
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise InvalidRequest(f"parameter '{name}' must be a non-negative integer")
    if maximum is not None and value > maximum:
        raise InvalidRequest(f"parameter '{name}' is {value}, more than the {maximum} allowed")
    return value


def _sequence_id(value: object, limits: Limits) -> int | str | None:
    if value is not None and (isinstance(value, bool) or not isinstance(value, (int, str))):
        raise InvalidRequest("parameter 'sequence_id' must be an integer or a string")
    if isinstance(value, str):
        _check_length(value, "parameter 'sequence_id'", limits)
    return value


def _check_length(text: str, what: str, limits: Limits) -> None:
    if len(text) > limits.max_name_len:
        raise InvalidRequest(f"{what} is {len(text)} characters long, more than the {limits.max_name_len} allowed")


def _bool_param(params: dict[str, object], name: str) -> bool:
    value = params.pop(name, False)
    if not isinstance(value, bool):
        raise InvalidRequest(f"parameter '{name}' must be true or false")
    return value
