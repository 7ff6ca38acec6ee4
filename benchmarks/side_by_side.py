"""Two ways of serving measured at the same client concurrencies, and the one over the other.

``bench_grpc.py`` (gRPC against HTTP) and ``bench_cache.py`` (cache on against off) each
measure a ``Summary`` per mode and concurrency; this prints their rows and the ratios of
throughput and latency between the two modes at each concurrency.
"""

from __future__ import annotations

from collections.abc import Sequence

from benchmarks.stats import Summary
from benchmarks.table import Column

RATIOS = (("throughput", "images_per_s"), ("p50", "p50_ms"), ("p99", "p99_ms"))


def columns(mode_header: str, width: int) -> tuple[Column, ...]:
    return (Column(mode_header, width, align="<"), Column("clients", 7), Column("images/s", 10, ".1f"),
            Column("p50 ms", 8, ".2f"), Column("p99 ms", 8, ".2f"), Column("server CPU ms/image", 19, ".2f"),
            Column("errors", 6))


def values(summary: Summary) -> list[object]:
    return [summary.mode, clients(summary.point), summary.images_per_s, summary.p50_ms, summary.p99_ms,
            summary.compute_ms_per_image, summary.errors]


def line(table: Sequence[Column], summary: Summary) -> str:
    return " ".join(column.cell(value) for column, value in zip(table, values(summary), strict=True))


def clients(point: str) -> int:
    """The client count of a point named ``concurrency N``."""
    return int(point.split()[-1])


def ratios(summaries: list[Summary], top: str, bottom: str) -> list[dict[str, object]]:
    """Mode ``top`` over mode ``bottom`` at each concurrency both were measured at."""
    rows: list[dict[str, object]] = []
    for point in sorted({s.point for s in summaries}, key=clients):
        pair = {s.mode: s for s in summaries if s.point == point}
        over, under = pair.get(top), pair.get(bottom)
        if over is None or under is None:
            continue
        row: dict[str, object] = {"clients": clients(point)}
        for name, field in RATIOS:
            a, b = getattr(over, field), getattr(under, field)
            row[name] = None if a is None or not b else a / b
        rows.append(row)
    return rows


def print_ratios(title: str, rows: list[dict[str, object]]) -> None:
    width = max(len(title), 9)
    print(f"\n{title:<{width}} {'clients':>7} {'throughput':>10} {'p50':>8} {'p99':>8}")
    for row in rows:
        cells = " ".join(f"{'-' if row[k] is None else format(row[k], '.2f'):>{w}}"
                         for k, w in (("throughput", 10), ("p50", 8), ("p99", 8)))
        print(f"{'':<{width}} {row['clients']:>7} {cells}")
