"""The gateway's span per request: ``ferry.gateway.infer``.

It is a child of the caller's ``traceparent`` (or a new root, subject to the
sampler), covers publishing the request and waiting for its reply, and its
own context goes into the envelope's ``trace``, so the worker's spans are its
children. An unsampled span still passes its context on, so the workers
follow the gateway's decision instead of sampling again.

``InferenceService`` takes a ``GatewayTracer``; without one it uses
``UNTRACED``, which hands the caller's context through and records nothing.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import TracebackType
from typing import TYPE_CHECKING, Protocol

from broker.envelope import Response
from workers.formats.envelope import TRACE_HEADERS
from workers.telemetry.tracing import names

if TYPE_CHECKING:
    from opentelemetry.trace import Span

    from workers.telemetry.tracing.provider import Tracing


class RequestSpan(Protocol):
    trace: dict[str, str]  # the context for the envelope

    def __enter__(self) -> RequestSpan: ...

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None: ...

    def answered(self, response: Response | None) -> None:
        """The reply came (None: none did)."""

    def end(self, error: BaseException | None = None) -> None:
        """Done (leaving the ``with`` calls it); ``error``: what failed the request."""


class RequestTracer(Protocol):
    def span(self, model: str, request_id: str, caller: Mapping[str, str] | None,
             job: bool = False) -> RequestSpan: ...


class GatewayTracer:
    def __init__(self, tracing: Tracing) -> None:
        self._tracing = tracing

    def span(self, model: str, request_id: str, caller: Mapping[str, str] | None,
             job: bool = False) -> RequestSpan:
        attributes: dict[str, str | bool] = {names.MODEL: model, names.REQUEST_ID: request_id}
        if job:
            attributes[names.ASYNC_JOB] = True
        return _Span(self._tracing, self._tracing.start(names.GATEWAY_INFER, caller, attributes))


class _Span:
    def __init__(self, tracing: Tracing, span: Span) -> None:
        self._tracing = tracing
        self._span = span
        self._error = ""
        self.trace = tracing.carrier(span)

    def __enter__(self) -> _Span:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.end(exc)

    def end(self, error: BaseException | None = None) -> None:
        if error is not None:
            self._span.set_attribute(names.OUTCOME, type(error).__name__)
            self._error = f"{type(error).__name__}: {error}"
        self._tracing.end(self._span, error=self._error)

    def answered(self, response: Response | None) -> None:
        if response is None:
            return
        if response.model_version:
            self._span.set_attribute(names.VERSION, response.model_version)
        outcome = response.error.code if response.error is not None else "success"
        self._span.set_attribute(names.OUTCOME, outcome)
        if response.error is not None:
            self._error = response.error.message


class _Untraced:
    """Records nothing; the caller's context goes on unchanged."""

    def __init__(self, caller: Mapping[str, str] | None) -> None:
        self.trace = dict(caller) if caller else {}

    def __enter__(self) -> _Untraced:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        return None

    def answered(self, response: Response | None) -> None:
        return None

    def end(self, error: BaseException | None = None) -> None:
        return None


class Untraced:
    def span(self, model: str, request_id: str, caller: Mapping[str, str] | None,
             job: bool = False) -> RequestSpan:
        return _Untraced(caller)


UNTRACED = Untraced()


def caller_context(headers: Mapping[str, str]) -> dict[str, str]:
    """The W3C trace context an HTTP caller sent (``traceparent``, ``tracestate``)."""
    return {name: headers[name] for name in TRACE_HEADERS if name in headers}


def gateway_tracer(tracing: Tracing | None) -> RequestTracer | None:
    return GatewayTracer(tracing) if tracing is not None else None
