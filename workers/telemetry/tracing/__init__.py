"""OpenTelemetry spans for the requests ferry serves; off unless an exporter is chosen.

``open_tracing`` is the one way in. With exporter "none" it returns None and
nothing from opentelemetry is imported, so a process without tracing pays
nothing per request. Otherwise it returns a ``Tracing`` (the process's
tracer provider, sampler and exporter): the gateway opens a span per request
with it (``gateway.tracing``), and a worker turns each sampled request's
``Timeline`` into spans after the fact (``TracingObserver``).

The trace context travels in the request envelope's ``trace`` map as W3C
``traceparent`` / ``tracestate``; a message put on a topic by another producer
may carry them as headers instead (``workers.formats.envelope``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from workers.telemetry.settings import TraceSettings

if TYPE_CHECKING:
    from workers.telemetry.tracing.provider import Tracing

# The ``service.name`` of each kind of process.
GATEWAY_SERVICE = "ferry-gateway"
WORKER_SERVICE = "ferry-worker"
SERVE_SERVICE = "ferry"


def open_tracing(settings: TraceSettings, service: str) -> Tracing | None:
    """The process's tracing, or None when ``settings`` turn it off; ``aclose`` it to flush."""
    if not settings.enabled:
        return None
    from workers.telemetry.tracing.provider import Tracing  # only now: opentelemetry is heavy

    return Tracing.open(settings, service)
