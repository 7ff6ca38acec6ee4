"""One process's OpenTelemetry tracer provider: sampler, exporter, propagation.

The provider is never made global (no ``trace.set_tracer_provider``): whoever
traces is handed this object, so two in one process (tests) do not meet.

Sampling is ``ParentBased(ControlledSampler(TraceControl))``: a caller's sampled flag is
followed either way, and ``TraceControl`` (Triton's trace settings, which
``GET/POST /v2/trace/setting`` change) decides only for new traces. Spans
leave through a ``BatchSpanProcessor``, on its own thread; ``aclose`` flushes it.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Mapping

from opentelemetry import trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter, SpanExporter
from opentelemetry.sdk.trace.sampling import ParentBased
from opentelemetry.trace import Span, Status, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from workers.telemetry.settings import TraceSettings
from workers.telemetry.tracing.control import TraceControl
from workers.telemetry.tracing.jsonl import JsonlSpanExporter
from workers.telemetry.tracing.sampler import ControlledSampler

Attributes = Mapping[str, str | int | float | bool]
Parent = Mapping[str, str] | Span | None  # a W3C carrier (traceparent, tracestate), a span, or a new root


class TracingError(ValueError):
    """Trace settings that cannot make an exporter."""


def build_exporter(settings: TraceSettings) -> SpanExporter:
    if settings.exporter == "jsonl":
        if settings.file is None:
            raise TracingError("trace exporter 'jsonl' needs a file (--trace-file)")
        return JsonlSpanExporter(settings.file)
    if settings.exporter == "console":
        return ConsoleSpanExporter(out=sys.stdout)  # today's stdout, not the one at its import
    if settings.exporter == "otlp":
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        # None lets the exporter read OTEL_EXPORTER_OTLP_(TRACES_)ENDPOINT, else localhost:4318.
        return OTLPSpanExporter(endpoint=settings.endpoint or None)
    raise TracingError(f"unknown trace exporter '{settings.exporter}'")


class Tracing:
    def __init__(self, provider: TracerProvider, control: TraceControl) -> None:
        self._provider = provider
        self.control = control
        self._tracer = provider.get_tracer("ferry")
        self._propagator = TraceContextTextMapPropagator()

    @classmethod
    def open(cls, settings: TraceSettings, service: str, exporter: SpanExporter | None = None) -> Tracing:
        control = TraceControl(True, settings.rate, str(settings.file or ""))
        provider = TracerProvider(resource=Resource.create({"service.name": service}),
                                  sampler=ParentBased(root=ControlledSampler(control)))
        provider.add_span_processor(BatchSpanProcessor(exporter or build_exporter(settings)))
        return cls(provider, control)

    def start(self, name: str, parent: Parent, attributes: Attributes | None = None,
              start_ns: int | None = None) -> Span:
        """A span (non-recording when not sampled: ``is_recording()`` says which)."""
        if isinstance(parent, Span):
            context = trace.set_span_in_context(parent)
        else:
            context = self._propagator.extract(parent or {})
        return self._tracer.start_span(name, context=context, attributes=attributes, start_time=start_ns)

    def carrier(self, span: Span) -> dict[str, str]:
        """``span``'s context as W3C headers, so what it causes elsewhere becomes its children."""
        headers: dict[str, str] = {}
        self._propagator.inject(headers, context=trace.set_span_in_context(span))
        return headers

    @staticmethod
    def end(span: Span, end_ns: int | None = None, error: str = "") -> None:
        if error:
            span.set_status(Status(StatusCode.ERROR, error))
        span.end(end_time=end_ns)

    async def aclose(self) -> None:
        """Export what is still buffered, then stop the exporter (off the event loop: it may wait on the network)."""
        await asyncio.to_thread(self._provider.shutdown)
