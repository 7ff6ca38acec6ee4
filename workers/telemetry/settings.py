"""How a process reports on itself: metrics, tracing. Built once at the CLI."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

TRACE_EXPORTERS = ("none", "otlp", "console", "jsonl")


@dataclass(frozen=True, slots=True)
class TraceSettings:
    exporter: str = "none"  # one of TRACE_EXPORTERS; "none" turns tracing off
    endpoint: str = ""  # otlp: the OTLP/HTTP traces URL (default: OTEL_EXPORTER_OTLP_* or localhost:4318)
    file: Path | None = None  # jsonl: one span per line, appended
    rate: float = 1.0  # share of new traces sampled; a caller's sampled flag is followed

    @property
    def enabled(self) -> bool:
        return self.exporter != "none"


@dataclass(frozen=True, slots=True)
class TelemetrySettings:
    metrics: bool = True
    metrics_host: str = "0.0.0.0"
    metrics_port: int = 8002  # ferry worker only: its /metrics and health endpoints (0: none)
    backlog_interval_s: float = 5.0  # how often queue depth and lag are read from the broker
    trace: TraceSettings = field(default_factory=TraceSettings)
