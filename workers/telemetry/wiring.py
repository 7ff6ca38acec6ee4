"""What watches a worker's requests, assembled once per process."""

from __future__ import annotations

from typing import TYPE_CHECKING

from workers.telemetry.observer import Observer, Observers
from workers.telemetry.settings import TelemetrySettings
from workers.telemetry.stats import StatsBook
from workers.telemetry.tracing.worker_spans import TracingObserver

if TYPE_CHECKING:
    from workers.telemetry.tracing.provider import Tracing


def worker_observers(settings: TelemetrySettings, stats: StatsBook | None,
                     tracing: Tracing | None = None) -> Observer:
    """The worker's observers: its ``StatsBook`` (absent with ``--no-metrics``), then any tracer
    (the one alone when there is only one: every request tells it three times)."""
    observers: list[Observer] = []
    if stats is not None:
        observers.append(stats)
    if tracing is not None:
        observers.append(TracingObserver(tracing))
    return observers[0] if len(observers) == 1 else Observers(observers)
