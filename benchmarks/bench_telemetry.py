"""What metrics and tracing cost: ``ferry serve`` on ``cnn`` with them off, metrics on, and
metrics on plus tracing sampled at 1%.

The three servers run side by side for the whole benchmark (idle ones cost nothing), and
the measurement rounds alternate between them, each round starting with the next one (off,
metrics, tracing; metrics, tracing, off; ...), so slow drift on a shared machine falls on all
three alike. Each configuration's figure is its
median over the rounds; the key figure is its throughput over the "off" server's, within
this run. Spans go to a JSON-lines file (a real exporter, writing on a background thread).

    python benchmarks/bench_telemetry.py            # 6 rounds at concurrency 16 and 64, ~4 min
    python benchmarks/bench_telemetry.py --quick    # a smoke run
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
if str(REPO_ROOT) not in sys.path:  # run as a script, benchmarks/ is on the path but not the repository
    sys.path.insert(0, str(REPO_ROOT))

from benchmarks.bench_embedded import MODEL_DIR, _measure_point, _target  # noqa: E402
from benchmarks.loadgen import LoadSpec, event_loop_runner  # noqa: E402
from benchmarks.server import RunningServer, copy_model, ferry_server  # noqa: E402
from benchmarks.stats import Summary, int_list  # noqa: E402
from benchmarks.table import Column, print_table  # noqa: E402

OFF, METRICS, TRACING = "off", "metrics", "metrics + tracing 1%"
TARGET_LOSS = 0.05
DEFAULT_OUT = REPO_ROOT / "benchmarks" / "results" / "telemetry.json"
COLUMNS = (Column("mode", 24, align="<"), Column("concurrency", 11), Column("images/s (median)", 18, ".1f"),
           Column("p99 ms", 8, ".2f"), Column("ratio to off", 13, ".3f"), Column("server CPU ms/image", 20, ".3f"))


@dataclass(frozen=True, slots=True)
class BenchSettings:
    rounds: int = 6
    duration_s: float = 4.0
    warmup_s: float = 1.5
    concurrency: tuple[int, ...] = (16, 64)
    trace_rate: float = 0.01
    out: Path = DEFAULT_OUT


def settings_from_args(argv: Sequence[str] | None) -> BenchSettings:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--duration", type=float, default=4.0, help="measured seconds per point")
    parser.add_argument("--warmup", type=float, default=1.5, help="unmeasured seconds before each point")
    parser.add_argument("--concurrency", type=int_list, default=(16, 64))
    parser.add_argument("--trace-rate", type=float, default=0.01)
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument("--quick", action="store_true", help="2 short rounds at concurrency 16")
    args = parser.parse_args(argv)
    if args.quick:
        return BenchSettings(2, 1.0, 0.5, (16,), args.trace_rate, args.out)
    return BenchSettings(args.rounds, args.duration, args.warmup, args.concurrency, args.trace_rate, args.out)


def server_args(mode: str, scratch: Path, rate: float) -> list[str]:
    if mode == OFF:
        return ["--no-metrics"]
    if mode == METRICS:
        return []
    return ["--trace-exporter", "jsonl", "--trace-file", str(scratch / "spans.jsonl"), "--trace-rate", str(rate)]


def measure(settings: BenchSettings, scratch: Path) -> dict[str, dict[int, list[Summary]]]:
    results: dict[str, dict[int, list[Summary]]] = {mode: {c: [] for c in settings.concurrency}
                                                    for mode in (OFF, METRICS, TRACING)}
    with contextlib.ExitStack() as stack, event_loop_runner() as runner:
        servers: dict[str, RunningServer] = {}
        for mode in results:
            repository = scratch / mode.replace(" ", "-").replace("%", "pct").replace("+", "")
            repository.mkdir()
            copy_model(MODEL_DIR, repository, dynamic_batching=True)
            log = scratch / f"{repository.name}.log"
            servers[mode] = stack.enter_context(
                ferry_server(repository, log, extra_args=server_args(mode, scratch, settings.trace_rate)))
        for round_index in range(settings.rounds):
            for concurrency in settings.concurrency:
                # Each round starts with the next configuration, so none is always measured first or last.
                order = list(servers.items())
                shift = round_index % len(order)
                for mode, server in order[shift:] + order[:shift]:
                    spec = LoadSpec(concurrency, settings.warmup_s, settings.duration_s)
                    summary = runner.run(_measure_point(mode, _target(server), spec, server.pid))
                    results[mode][concurrency].append(summary)
                    print(f"  round {round_index + 1} {mode:<22} c={concurrency:<3} "
                          f"{summary.images_per_s:9.1f} img/s  p99 {summary.p99_ms or 0:7.2f} ms"
                          + (f"  ({summary.errors} errors)" if summary.errors else ""), flush=True)
    return results


def micro_costs(rate: float, scratch: Path, calls: int = 20_000) -> dict[str, float]:
    """Microseconds per request of each telemetry step, timed in this process: what the
    throughput rows, noisy on a shared machine, can only bound."""
    from broker.envelope import Response
    from gateway.metrics import HttpBook, HttpCounting
    from gateway.tracing import GatewayTracer
    from workers.telemetry.settings import TraceSettings
    from workers.telemetry.stats import StatsBook
    from workers.telemetry.timeline import BatchRecord, Timeline
    from workers.telemetry.tracing.provider import Tracing
    from workers.telemetry.tracing.worker_spans import TracingObserver

    async def app(scope: object, receive: object, send: object) -> None:
        await send({"type": "http.response.start", "status": 200})  # type: ignore[operator]

    async def send(message: object) -> None:
        return None

    counting = HttpCounting(app, HttpBook().record)
    scope = {"type": "http", "path": "/v2/models/cnn/infer"}
    stats = StatsBook()
    tracing = Tracing.open(TraceSettings("jsonl", file=scratch / "micro-spans.jsonl", rate=rate), "bench")
    gateway, observer = GatewayTracer(tracing), TracingObserver(tracing)
    reply = Response(id="r", model="cnn", model_version="1")
    batch = BatchRecord("cnn", "1", "b-1", 32, 32, 4, 5)

    def timeline(trace: dict[str, str]) -> Timeline:
        return Timeline("r", "cnn", "1", "w", trace, 1, 2, 3, 4, 5, 6)

    def metrics_step() -> None:
        record = timeline({})
        stats.received(record)
        stats.batch_ran(batch)
        stats.finished(record)

    def tracing_step() -> None:
        with gateway.span("cnn", "r", None) as span:
            span.answered(reply)
        observer.finished(timeline(span.trace))

    loop = asyncio.new_event_loop()
    try:
        costs = {
            "http_counting_us": _per_call_us(lambda: loop.run_until_complete(counting(scope, None, send)), calls)
            - _per_call_us(lambda: loop.run_until_complete(app(scope, None, send)), calls),
            "stats_book_us": _per_call_us(metrics_step, calls),
            "tracing_us": _per_call_us(tracing_step, calls),
        }
    finally:
        loop.close()
        asyncio.run(tracing.aclose())
    return costs


def _per_call_us(step: Callable[[], object], calls: int) -> float:
    started = time.perf_counter()
    for _ in range(calls):
        step()
    return (time.perf_counter() - started) / calls * 1e6


def median_rate(summaries: list[Summary]) -> float:
    return statistics.median(s.images_per_s for s in summaries)


def table(results: dict[str, dict[int, list[Summary]]]) -> list[dict[str, object]]:
    rows = []
    for concurrency in results[OFF]:
        base = median_rate(results[OFF][concurrency])
        for mode, by_concurrency in results.items():
            summaries = by_concurrency[concurrency]
            rate = median_rate(summaries)
            rows.append({
                "mode": mode, "concurrency": concurrency, "images_per_s": rate,
                "p99_ms": statistics.median(s.p99_ms or 0.0 for s in summaries),
                # Server CPU per image: less at the mercy of other work on the machine than throughput.
                "server_cpu_ms_per_image": statistics.median(s.compute_ms_per_image or 0.0 for s in summaries),
                "ratio_to_off": rate / base if base else None,
                "rounds": [s.images_per_s for s in summaries],
                "errors": sum(s.errors for s in summaries),
            })
    return rows


def main(argv: Sequence[str] | None = None) -> int:
    settings = settings_from_args(argv)
    print(f"ferry serve on {MODEL_DIR.name}: {OFF} / {METRICS} / {TRACING}, {settings.rounds} alternating rounds",
          flush=True)
    with tempfile.TemporaryDirectory(prefix="ferry-bench-telemetry-") as scratch:
        results = measure(settings, Path(scratch))
        spans_file = Path(scratch) / "spans.jsonl"
        spans = len(spans_file.read_text().splitlines()) if spans_file.exists() else 0
        costs = micro_costs(settings.trace_rate, Path(scratch))
    rows = table(results)
    print()
    print_table(COLUMNS, [[row[key] for key in ("mode", "concurrency", "images_per_s", "p99_ms", "ratio_to_off",
                                                "server_cpu_ms_per_image")] for row in rows])
    off_cpu_us = statistics.median(row["server_cpu_ms_per_image"] for row in rows if row["mode"] == OFF) * 1e3
    metrics_us = costs["http_counting_us"] + costs["stats_book_us"]
    shares = {"metrics": metrics_us / off_cpu_us, "tracing": costs["tracing_us"] / off_cpu_us}
    print(f"\nper request, timed in-process: HTTP counting {costs['http_counting_us']:.1f} us, stats book "
          f"{costs['stats_book_us']:.1f} us, tracing at rate {settings.trace_rate} {costs['tracing_us']:.1f} us; "
          f"against {off_cpu_us:.0f} us of server CPU per image with both off: metrics {shares['metrics']:.2%}, "
          f"tracing {shares['tracing']:.2%}")
    worst = min(row["ratio_to_off"] or 0.0 for row in rows if row["mode"] == TRACING)
    worst_metrics = min(row["ratio_to_off"] or 0.0 for row in rows if row["mode"] == METRICS)
    print(f"\nspans exported at rate {settings.trace_rate}: {spans}")
    print(f"key figure: worst throughput loss, metrics on {1 - worst_metrics:.1%}, "
          f"metrics + tracing {1 - worst:.1%} (target < {TARGET_LOSS:.0%})")
    settings.out.parent.mkdir(parents=True, exist_ok=True)
    settings.out.write_text(json.dumps({
        "benchmark": "telemetry", "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "settings": {"rounds": settings.rounds, "duration_s": settings.duration_s, "warmup_s": settings.warmup_s,
                     "concurrency": list(settings.concurrency), "trace_rate": settings.trace_rate},
        "results": rows, "spans_exported": spans,
        "per_request_us": costs, "share_of_server_cpu_per_image": shares,
        "key_figure": {"metrics_loss": 1 - worst_metrics, "metrics_tracing_loss": 1 - worst,
                       "target": TARGET_LOSS, "met": 1 - worst < TARGET_LOSS and 1 - worst_metrics < TARGET_LOSS},
    }, indent=2) + "\n")
    print(f"wrote {settings.out}")
    return 1 if any(row["errors"] for row in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
