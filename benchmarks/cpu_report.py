"""What ``bench_cpu.py`` found: one point per row and body, the table it prints and the JSON it writes."""

from __future__ import annotations

import json
import os
import platform
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

from benchmarks.identity_models import Payload
from benchmarks.table import Column, line, print_table

FLOOR = "floor"
TARGET_X_FLOOR = 2.0
CLIENT_BOUND_CORES = 0.9   # the client is one Python thread: near a full core, it sets the pace

ROW_LABELS = {
    FLOOR: "floor: starlette",
    "embedded": "ferry serve, embedded",
    "redis": "gateway+worker, redis",
    "kafka": "gateway+worker, kafka",
    "redis-cluster": "gateway+worker, cluster",
}

COLUMNS = (
    Column("row", 23, align="<"), Column("body", 23, align="<"), Column("req/s", 8, ".0f"),
    Column("server µs/req", 13, ".0f"), Column("x floor", 7, ".2f"), Column("broker µs/req", 13, ".0f"),
    Column("client µs/req", 13, ".0f"), Column("server cores", 12, ".2f"), Column("client cores", 12, ".2f"),
)


@dataclass(frozen=True, slots=True)
class Point:
    row: str                            # "floor", "embedded", "redis", "kafka" or "redis-cluster"
    payload: Payload
    answered: int                       # requests answered right inside the measured window
    errors: int
    duration_s: float                   # the measured window
    elapsed_s: float                    # between the two CPU samples (the window, give or take a wake-up)
    server_s: dict[str, float | None]   # role ("floor", "serve", "gateway", "worker") -> CPU s in the window
    broker_s: float | None              # redis-server or the Kafka JVM; None on rows without one
    client_s: float                     # this process: the load generator
    p50_ms: float | None
    p99_ms: float | None
    first_error: str | None = None
    x_floor: float | None = None

    @property
    def requests_per_s(self) -> float:
        return self.answered / self.duration_s

    def cores(self, seconds: float | None) -> float | None:
        return None if seconds is None else seconds / self.elapsed_s

    def us_per_request(self, seconds: float | None) -> float | None:
        # Rates, not totals: the CPU samples and the request window are a few ms apart at most.
        cores = self.cores(seconds)
        return None if cores is None or not self.answered else cores / self.requests_per_s * 1e6

    @property
    def server_total_s(self) -> float | None:
        values = list(self.server_s.values())
        return None if None in values else sum(v for v in values if v is not None)

    @property
    def server_us(self) -> float | None:
        return self.us_per_request(self.server_total_s)

    @property
    def client_bound(self) -> bool:
        cores = self.cores(self.client_s)
        return cores is not None and cores >= CLIENT_BOUND_CORES

    def cells(self) -> tuple[object, ...]:
        return (ROW_LABELS[self.row], self.payload.label, self.requests_per_s, self.server_us, self.x_floor,
                self.us_per_request(self.broker_s), self.us_per_request(self.client_s),
                self.cores(self.server_total_s), self.cores(self.client_s))

    def to_json(self) -> dict[str, object]:
        return {
            "row": self.row, "body": self.payload.key, "model": self.payload.model,
            "body_tensor_bytes": self.payload.nbytes, "requests_per_s": self.requests_per_s,
            "answered": self.answered, "errors": self.errors, "first_error": self.first_error,
            "p50_ms": self.p50_ms, "p99_ms": self.p99_ms,
            "server_cpu_us_per_request": self.server_us, "x_floor": self.x_floor,
            "server_cpu_us_per_request_by_role": {role: self.us_per_request(s) for role, s in self.server_s.items()},
            "broker_cpu_us_per_request": self.us_per_request(self.broker_s),
            "client_cpu_us_per_request": self.us_per_request(self.client_s),
            "server_cores": self.cores(self.server_total_s), "broker_cores": self.cores(self.broker_s),
            "client_cores": self.cores(self.client_s), "client_bound": self.client_bound,
        }


@dataclass(slots=True)
class Report:
    points: list[Point] = field(default_factory=list)
    # Other work on the machine skews every figure; the 1-minute load says how much there was.
    load_start: tuple[float, float, float] = field(default_factory=os.getloadavg)

    @property
    def errors(self) -> int:
        return sum(point.errors for point in self.points)

    def with_ratios(self) -> list[Point]:
        """Each point's server CPU per request over the floor's, for the same body."""
        floors = {p.payload.key: p.server_us for p in self.points if p.row == FLOOR}
        return [replace(p, x_floor=_ratio(p.server_us, floors.get(p.payload.key))) for p in self.points]

    def key_figures(self) -> dict[str, dict[str, object]]:
        return {f"embedded_{p.payload.key}_x_floor": {"value": p.x_floor, "target": TARGET_X_FLOOR,
                                                       "met": p.x_floor is not None and p.x_floor <= TARGET_X_FLOOR}
                for p in self.with_ratios() if p.row == "embedded"}


def _ratio(value: float | None, baseline: float | None) -> float | None:
    return None if value is None or not baseline else value / baseline


def point_line(point: Point) -> str:
    return line(COLUMNS, point.cells()) + _notes(point)


def _notes(point: Point) -> str:
    notes = [f"{point.errors} errors"] if point.errors else []
    notes += ["client-bound"] if point.client_bound else []
    return f"  ({', '.join(notes)})" if notes else ""


def print_report(report: Report) -> None:
    print()
    print_table(COLUMNS, [point.cells() for point in report.with_ratios()])
    for name, figure in report.key_figures().items():
        if figure["value"] is not None:
            print(f"key figure: {name} = {figure['value']:.2f} (target <= {TARGET_X_FLOOR:g})")
    print(f"load average (1 min) {report.load_start[0]:.2f} at the start, {os.getloadavg()[0]:.2f} at the end, "
          f"on {os.cpu_count()} CPUs")


def _version(package: str) -> str | None:
    try:
        return version(package)
    except PackageNotFoundError:
        return None


def write_json(path: Path, settings: dict[str, object], report: Report) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    document = {
        "benchmark": "cpu",
        "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform(), "python": platform.python_version(),
                    **{name: _version(name) for name in ("uvicorn", "starlette", "httptools", "uvloop",
                                                         "onnxruntime")}},
        "settings": settings,
        "load_average_1min": {"start": report.load_start[0], "end": os.getloadavg()[0]},
        "results": [point.to_json() for point in report.with_ratios()],
        "key_figures": report.key_figures(),
    }
    path.write_text(json.dumps(document, indent=2, allow_nan=False) + "\n")
