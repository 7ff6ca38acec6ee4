"""What ``bench_fleet.py`` found: its rows, the tables it prints and the JSON it writes."""

from __future__ import annotations

import json
import os
import platform
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

import numpy as np

from benchmarks.sleep_model import BatchCount
from benchmarks.stats import Summary
from benchmarks.table import Column, formatted, header, line

EMBEDDED = "serve, memory broker"
TARGET_SCALING, TARGET_SCALING_WORKERS = 3.5, 4

THROUGHPUT_COLUMNS = (
    Column("mode", 26, align="<"), Column("point", 16, align="<"), Column("images/s", 10, ".1f"),
    Column("p50 ms", 9, ".2f"), Column("p99 ms", 9, ".2f"), Column("x in-memory", 13, ".2f"))
CPU_COLUMNS = (
    Column("CPU (cores busy)", 26, align="<"), Column("point", 16, align="<"), Column("client", 7, ".2f"),
    Column("serve", 7, ".2f"), Column("gateway", 8, ".2f"), Column("workers", 8, ".2f"), Column("broker", 7, ".2f"),
    Column("server-side ms/image", 21, ".2f"))
SCALING_COLUMNS = (
    Column("broker", 6, align="<"), Column("workers", 7), Column("point", 16, align="<"),
    Column("requests/s", 10, ".1f"), Column("p50 ms", 9, ".1f"), Column("p99 ms", 9, ".1f"),
    Column("x 1 worker", 10, ".2f"), Column("ideal/s", 10, ".1f"), Column("of ideal", 11, ".0%"))


@dataclass(frozen=True, slots=True)
class Row:
    summary: Summary
    broker: str                                         # "memory", "redis" or "kafka"
    cores: dict[str, float | None]                      # role -> cores busy in the window
    ratio: float | None = None                          # to the row this part compares against
    worker_counts: tuple[BatchCount, ...] = ()          # part 2: each worker's batches in the window
    ideal_per_s: float | None = None
    held: tuple[int, ...] = ()                          # part 2, mid-window: each worker's unacked
                                                        # deliveries (Redis) or partitions (Kafka)

    def to_json(self) -> dict[str, object]:
        return {
            **self.summary.to_json(), "broker": self.broker, "cores": self.cores, "ratio": self.ratio,
            "ideal_per_s": self.ideal_per_s, "efficiency": self.efficiency, "held_mid_window": list(self.held),
            "workers": [{"batches": c.batches, "rows": c.rows, "mean_batch": c.mean_batch}
                        for c in self.worker_counts],
        }

    @property
    def efficiency(self) -> float | None:
        return self.summary.images_per_s / self.ideal_per_s if self.ideal_per_s else None


@dataclass(slots=True)
class Report:
    throughput: list[Row] = field(default_factory=list)
    scaling: list[Row] = field(default_factory=list)
    # Other work on the machine skews every figure; the 1-minute load says how much there was.
    load_start: tuple[float, float, float] = field(default_factory=os.getloadavg)

    @property
    def errors(self) -> int:
        return sum(row.summary.errors for row in self.throughput + self.scaling)


def _errors(summary: Summary) -> str:
    return f"  ({summary.errors} errors)" if summary.errors else ""


def throughput_line(row: Row) -> str:
    s = row.summary
    return line(THROUGHPUT_COLUMNS, (s.mode, s.point, s.images_per_s, s.p50_ms, s.p99_ms, row.ratio)) + _errors(s)


def print_throughput(rows: list[Row]) -> None:
    print(f"\n{header(THROUGHPUT_COLUMNS)}")
    for row in rows:
        print(throughput_line(row))
    print(f"\n{header(CPU_COLUMNS)}")
    for row in rows:
        roles = (row.cores.get(role) for role in ("client", "server", "gateway", "workers", "broker"))
        print(line(CPU_COLUMNS, (row.summary.mode, row.summary.point, *roles, row.summary.compute_ms_per_image)))


def scaling_line(row: Row) -> str:
    s = row.summary
    return line(SCALING_COLUMNS, (row.broker, len(row.worker_counts), s.point, s.images_per_s, s.p50_ms, s.p99_ms,
                          row.ratio, row.ideal_per_s, row.efficiency)) + _errors(s)


def _spread(row: Row) -> str:
    total = sum(count.rows for count in row.worker_counts) or 1
    return "  ".join(f"{count.rows / total:.0%} ({count.batches} b, mean {formatted(count.mean_batch, '.1f')})"
                     for count in row.worker_counts)


def print_scaling(rows: list[Row]) -> None:
    print(f"\n{header(SCALING_COLUMNS)}")
    for row in rows:
        print(scaling_line(row))
    print("\nshare of rows per worker in the window (batches, mean batch size); mid-window, what each "
          "worker held: unacked deliveries (redis) or partitions (kafka):")
    for row in rows:
        print(f"{row.broker:<6} {len(row.worker_counts):>7}  {_spread(row)}    held {list(row.held)}")


def key_figures(report: Report) -> dict[str, object]:
    figures: dict[str, object] = {}
    for row in report.throughput:
        if row.summary.mode != EMBEDDED:
            figures[f"{row.summary.mode} / {EMBEDDED}, {row.summary.point}"] = row.ratio
    for row in report.scaling:
        if len(row.worker_counts) == TARGET_SCALING_WORKERS:
            figures[f"scaling, {row.broker}"] = {
                "name": f"{TARGET_SCALING_WORKERS} workers / 1 worker over {row.broker}", "value": row.ratio,
                "target": TARGET_SCALING, "met": row.ratio is not None and row.ratio >= TARGET_SCALING,
            }
    return figures


def _machine() -> dict[str, object]:
    import kafka
    import redis

    return {"cpus": os.cpu_count(), "platform": platform.platform(), "python": platform.python_version(),
            "redis_py": redis.__version__, "kafka_python": kafka.__version__, "numpy": np.__version__}


def write_json(path: Path, settings: dict[str, object], report: Report) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    document = {
        "benchmark": "fleet",
        "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "machine": _machine(),
        "load_average": {"start": list(report.load_start), "end": list(os.getloadavg())},
        "settings": settings,
        "throughput": [row.to_json() for row in report.throughput],
        "scaling": [row.to_json() for row in report.scaling],
        "key_figures": key_figures(report),
    }
    path.write_text(json.dumps(document, indent=2, allow_nan=False) + "\n")
