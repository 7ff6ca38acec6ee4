"""What Redis, Kafka and separate processes cost ferry, and how throughput grows with workers.

Part 1, on ``model_repo/cnn``: ``ferry serve`` on its in-memory broker (the baseline), then for
each broker (Redis, Kafka) the same with ``--broker`` pointing at it (one process, the broker
in the middle), and ``ferry gateway`` plus one ``ferry worker`` over it, at the same client
concurrencies. Part 2, for each broker: one gateway and 1, 2 and 4 workers, serving a Python
model that sleeps a fixed time per batch (a stand-in for a GPU-bound worker), against the
ideal of every worker running full batches back to back; on Kafka the request topic has 4
partitions. Prints tables and writes JSON.

    python benchmarks/bench_fleet.py            # the full run, a few minutes
    python benchmarks/bench_fleet.py --quick    # a smoke run
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import sys
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

REPO_ROOT = Path(__file__).resolve().parent.parent
if str(REPO_ROOT) not in sys.path:  # run as a script, benchmarks/ is on the path but not the repository
    sys.path.insert(0, str(REPO_ROOT))

from benchmarks import cpu, fleet_procs, sleep_model  # noqa: E402
from benchmarks.fleet_procs import Broker, Fleet  # noqa: E402
from benchmarks.fleet_report import (  # noqa: E402
    EMBEDDED, TARGET_SCALING, Report, Row, key_figures, print_scaling, print_throughput, scaling_line, throughput_line,
    write_json,
)
from benchmarks.loadgen import LoadSpec, Target, TensorSpec, event_loop_runner, infer_request, probe, run_load  # noqa: E402
from benchmarks.server import copy_model, ferry_server  # noqa: E402
from benchmarks.sleep_model import BatchCount, SleepModel  # noqa: E402
from benchmarks.interrupt import run_main, stop_on_signals  # noqa: E402
from benchmarks.stats import Summary, int_list, summarize  # noqa: E402
from benchmarks.window import Window, WindowOptions  # noqa: E402

CNN_DIR = REPO_ROOT / "model_repo" / "cnn"
CNN_NAME, CNN_SHAPE, CNN_OUTPUT_BYTES = "cnn", (3, 128, 128), 10 * 4
BROKERS = ("redis", "kafka")   # measured unless --brokers says otherwise
# redis-cluster: three masters with a replica each; kafka-cluster: three brokers, three replicas
KNOWN_BROKERS = ("redis", "redis-cluster", "kafka", "kafka-cluster")
SCALING = "gateway + N workers"
DEFAULT_OUT = REPO_ROOT / "benchmarks" / "results" / "fleet.json"
WINDOWS = WindowOptions(full=Window(duration_s=5.0, warmup_s=2.0), quick=Window(duration_s=1.5, warmup_s=1.0))

Pids = dict[str, tuple[int, ...]]   # role ("server", "gateway", "workers", "broker") -> its processes


def serve_mode(kind: str) -> str:
    return f"serve, {kind} broker"


def split_mode(kind: str) -> str:
    return f"gateway + worker, {kind}"


@dataclass(frozen=True, slots=True)
class BenchSettings:
    duration_s: float = WINDOWS.full.duration_s
    warmup_s: float = WINDOWS.full.warmup_s
    out: Path = DEFAULT_OUT
    concurrency: tuple[int, ...] = (16, 64)
    workers: tuple[int, ...] = (1, 2, 4)
    brokers: tuple[str, ...] = BROKERS
    sleep_ms: float = 100.0
    max_batch_size: int = 8
    queue_delay_us: int = 2000
    scaling_concurrency: int | None = None   # None: enough to keep every batch of the most workers full
    skip_throughput: bool = False
    skip_scaling: bool = False

    @property
    def sleep_model(self) -> SleepModel:
        return SleepModel(self.sleep_ms, self.max_batch_size, self.queue_delay_us)

    @property
    def clients_for_scaling(self) -> int:
        # Two full batches per worker: one running, one queued behind it.
        return self.scaling_concurrency or 2 * self.max_batch_size * max(self.workers)

    def to_json(self) -> dict[str, object]:
        return {"duration_s": self.duration_s, "warmup_s": self.warmup_s,
                "concurrency": list(self.concurrency), "workers": list(self.workers),
                "brokers": list(self.brokers),
                "sleep_ms": self.sleep_ms, "max_batch_size": self.max_batch_size,
                "queue_delay_us": self.queue_delay_us,
                "scaling_concurrency": self.clients_for_scaling}


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    WINDOWS.add_to(parser)
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="where the JSON goes")
    parser.add_argument("--concurrency", type=int_list, default=(16, 64),
                        help="client concurrencies for part 1, comma-separated (default 16,64)")
    parser.add_argument("--workers", type=int_list, default=(1, 2, 4),
                        help="worker counts for part 2, comma-separated (default 1,2,4)")
    parser.add_argument("--brokers", type=_broker_list, default=BROKERS,
                        help="shared brokers to measure, comma-separated, among redis, redis-cluster, kafka and "
                             "kafka-cluster "
                             "(default redis,kafka)")
    parser.add_argument("--sleep-ms", type=float, default=100.0, help="the sleep model's time per batch")
    parser.add_argument("--max-batch-size", type=int, default=8, help="the sleep model's max_batch_size")
    parser.add_argument("--queue-delay-us", type=int, default=2000, help="the sleep model's max_queue_delay")
    parser.add_argument("--scaling-concurrency", type=int,
                        help="client concurrency for part 2 (default 2 x max batch x most workers)")
    parser.add_argument("--skip-throughput", action="store_true", help="leave out part 1")
    parser.add_argument("--skip-scaling", action="store_true", help="leave out part 2")
    return parser


def settings_from_args(argv: Sequence[str] | None = None) -> BenchSettings:
    args = _parser().parse_args(argv)
    return BenchSettings(
        **asdict(WINDOWS.chosen(args)), out=args.out, concurrency=args.concurrency, workers=args.workers,
        brokers=args.brokers, sleep_ms=args.sleep_ms,
        max_batch_size=args.max_batch_size, queue_delay_us=args.queue_delay_us,
        scaling_concurrency=args.scaling_concurrency,
        skip_throughput=args.skip_throughput, skip_scaling=args.skip_scaling,
    )


def _broker_list(text: str) -> tuple[str, ...]:
    kinds = tuple(kind.strip() for kind in text.split(",") if kind.strip())
    unknown = [kind for kind in kinds if kind not in KNOWN_BROKERS]
    if unknown or not kinds:
        raise argparse.ArgumentTypeError(f"brokers are among {', '.join(KNOWN_BROKERS)}, not {text!r}")
    return kinds


# --- measuring ---------------------------------------------------------------


def _target(host: str, port: int, model: str, tensor: TensorSpec, output_bytes: int) -> Target:
    return Target(host, port, infer_request(host, port, model, tensor), output_bytes)


def cnn_target(host: str, port: int) -> Target:
    image = np.random.default_rng(1).random((1, *CNN_SHAPE), dtype=np.float32)
    return _target(host, port, CNN_NAME, TensorSpec("IMAGE", "FP32", image.shape, image.tobytes()),
                   CNN_OUTPUT_BYTES)


def sleep_target(host: str, port: int) -> Target:
    row = np.arange(sleep_model.ROW_FLOATS, dtype=np.float32).reshape(1, -1)
    return _target(host, port, sleep_model.NAME, TensorSpec(sleep_model.INPUT, "FP32", row.shape, row.tobytes()),
                   sleep_model.ROW_BYTES)


def _cpu_seconds(pids: Pids) -> dict[str, float | None]:
    seconds: dict[str, float | None] = {}
    for role, members in pids.items():
        each = [cpu.process_cpu_s(pid) for pid in members]
        seconds[role] = None if None in each else sum(s for s in each if s is not None)
    return seconds


def _cores(before: dict[str, float | None], after: dict[str, float | None], elapsed_s: float) -> dict[str, float | None]:
    return {role: None if before[role] is None or after[role] is None else (after[role] - before[role]) / elapsed_s
            for role in before}


async def measure(mode: str, target: Target, spec: LoadSpec, pids: Pids,
                  counts: Callable[[], list[BatchCount]] = list) -> tuple[Summary, dict[str, float | None],
                                                                       list[BatchCount]]:
    """One closed-loop point; CPU per role and ``counts()`` are read at both edges of the window."""
    load = asyncio.create_task(run_load(target, spec))
    await asyncio.sleep(spec.warmup_s)
    client_before, cpu_before, counts_before = cpu.sample(os.getpid()).client_s, _cpu_seconds(pids), counts()
    await asyncio.sleep(spec.duration_s)
    client_after, cpu_after, counts_after = cpu.sample(os.getpid()).client_s, _cpu_seconds(pids), counts()
    result = await load
    if result.first_error is not None:
        print(f"  {mode}, concurrency {spec.concurrency}: {result.errors} errors, first: {result.first_error}")
    cores = {"client": (client_after - client_before) / spec.duration_s,
             **_cores(cpu_before, cpu_after, spec.duration_s)}
    server_side = [value for role, value in cores.items() if role != "client" and value is not None]
    summary = summarize(mode, f"concurrency {spec.concurrency}", result.latencies_s, len(result.latencies_s),
                        spec.duration_s, result.errors, compute_cores=sum(server_side) if server_side else None,
                        client_cores=cores["client"])
    return summary, cores, [after - before for after, before in zip(counts_after, counts_before)]


async def _check(target: Target) -> None:
    await probe(target)   # raises LoadError when the answer is not what the load generator expects


async def _points(mode: str, broker: str, target: Target, settings: BenchSettings, pids: Pids) -> list[Row]:
    await _check(target)
    rows = []
    for concurrency in settings.concurrency:
        summary, cores, _ = await measure(mode, target, LoadSpec(concurrency, settings.warmup_s, settings.duration_s),
                                          pids)
        rows.append(Row(summary, broker, cores))
        print(f"  {throughput_line(rows[-1])}", flush=True)
    return rows


# --- part 1: each broker against the embedded one, on cnn ------------------------------


def run_throughput(settings: BenchSettings, brokers: Sequence[Broker], scratch: Path) -> list[Row]:
    repository = scratch / "cnn-repo"
    repository.mkdir()
    copy_model(CNN_DIR, repository, dynamic_batching=True)
    rows: list[Row] = []
    with event_loop_runner() as runner:
        print(f"{EMBEDDED}: ferry serve", flush=True)
        with ferry_server(repository, scratch / "serve-memory.log") as server:
            rows += runner.run(_points(EMBEDDED, "memory", cnn_target(server.host, server.port), settings,
                                       {"server": (server.pid,)}))
        for broker in brokers:
            url = fleet_procs.fresh_url(broker)
            print(f"{serve_mode(broker.kind)}: ferry serve --broker {url}", flush=True)
            with ferry_server(repository, scratch / f"serve-{broker.kind}.log", extra_args=("--broker", url)) as server:
                pids: Pids = {"server": (server.pid,), "broker": (broker.pid,)}
                rows += runner.run(_points(serve_mode(broker.kind), broker.kind,
                                           cnn_target(server.host, server.port), settings, pids))
            print(f"{split_mode(broker.kind)}: ferry gateway + 1 ferry worker", flush=True)
            url = fleet_procs.fresh_url(broker)
            with fleet_procs.fleet(repository, url, 1, CNN_NAME, _logs(scratch, f"split-{broker.kind}")) as split:
                rows += runner.run(_points(split_mode(broker.kind), broker.kind, cnn_target(split.host, split.port),
                                           settings, _fleet_pids(split, broker)))
    return _with_ratios_to(rows, EMBEDDED)


def _fleet_pids(running: Fleet, broker: Broker) -> Pids:
    return {"gateway": (running.gateway_pid,), "workers": running.worker_pids, "broker": (broker.pid,)}


def _logs(scratch: Path, name: str) -> Path:
    path = scratch / name
    path.mkdir()
    return path


def _with_ratios_to(rows: list[Row], baseline_mode: str) -> list[Row]:
    baseline = {row.summary.point: row.summary.images_per_s for row in rows if row.summary.mode == baseline_mode}
    return [Row(row.summary, row.broker, row.cores, _ratio(row.summary.images_per_s, baseline.get(row.summary.point)))
            for row in rows]


def _ratio(value: float, baseline: float | None) -> float | None:
    return value / baseline if baseline else None


# --- part 2: scaling with workers, on the sleep model ---------------------------------


def run_scaling(settings: BenchSettings, broker: Broker, scratch: Path) -> list[Row]:
    model = settings.sleep_model
    repository, stats_dir = scratch / f"sleep-repo-{broker.kind}", scratch / f"sleep-stats-{broker.kind}"
    sleep_model.write_sleep_model(repository, model, stats_dir)
    spec = LoadSpec(settings.clients_for_scaling, settings.warmup_s, settings.duration_s)
    rows: list[Row] = []
    with event_loop_runner() as runner:
        for workers in settings.workers:
            print(f"{SCALING} over {broker.kind}: {workers} worker(s), sleep model {model.sleep_ms:g} ms per "
                  f"batch of {model.max_batch_size}", flush=True)
            url = fleet_procs.fresh_url(broker)
            logs = _logs(scratch, f"{broker.kind}-n{workers}")
            with fleet_procs.fleet(repository, url, workers, sleep_model.NAME, logs) as running:
                rows.append(runner.run(_scaling_point(running, broker, url, spec, model, stats_dir)))
            print(f"  {scaling_line(rows[-1])}", flush=True)
    base = rows[0].summary.images_per_s if rows and len(rows[0].worker_counts) == 1 else None
    return [Row(r.summary, r.broker, r.cores, _ratio(r.summary.images_per_s, base), r.worker_counts, r.ideal_per_s,
                r.held) for r in rows]


async def _scaling_point(running: Fleet, broker: Broker, url: str, spec: LoadSpec, model: SleepModel,
                         stats_dir: Path) -> Row:
    target = sleep_target(running.host, running.port)
    await _check(target)

    def counts() -> list[BatchCount]:
        return list(sleep_model.read_counts(stats_dir, running.worker_pids).values())

    async def held_mid_window() -> list[int]:
        await asyncio.sleep(spec.warmup_s + spec.duration_s / 2)
        return await asyncio.to_thread(fleet_procs.held_by_worker, url, sleep_model.NAME)

    mode = f"{broker.kind}, {len(running.worker_pids)} worker(s)"
    held = asyncio.create_task(held_mid_window())
    summary, cores, per_worker = await measure(mode, target, spec, _fleet_pids(running, broker), counts)
    return Row(summary, broker.kind, cores, None, tuple(per_worker), model.ideal_rows_per_s(len(running.worker_pids)),
               tuple(await held))


def main(argv: Sequence[str] | None = None) -> int:
    settings = settings_from_args(argv)
    stop_on_signals()  # every process started here is stopped on the way out
    report = Report()
    starters = {"redis": fleet_procs.redis_server, "redis-cluster": fleet_procs.redis_cluster,
                "kafka": fleet_procs.kafka_server, "kafka-cluster": fleet_procs.kafka_cluster}
    with tempfile.TemporaryDirectory(prefix="ferry-fleet-") as scratch, contextlib.ExitStack() as stack:
        brokers = [stack.enter_context(starters[kind]()) for kind in settings.brokers]
        for broker in brokers:
            print(f"{broker.kind} on {broker.url} (pid {broker.pid})", flush=True)
        if not settings.skip_throughput:
            report.throughput = run_throughput(settings, brokers, Path(scratch))
        if not settings.skip_scaling:
            for broker in brokers:
                report.scaling += run_scaling(settings, broker, Path(scratch))
    if report.throughput:
        print_throughput(report.throughput)
    if report.scaling:
        print_scaling(report.scaling)
    for figure in key_figures(report).values():
        if isinstance(figure, dict) and figure["value"] is not None:
            print(f"\nkey figure: {figure['name']} = {figure['value']:.2f} (target >= {TARGET_SCALING})")
    print(f"\nload average (1 min) {report.load_start[0]:.2f} at the start, {os.getloadavg()[0]:.2f} at the end, "
          f"on {os.cpu_count()} CPUs")
    write_json(settings.out, settings.to_json(), report)
    print(f"wrote {settings.out}")
    return 1 if report.errors else 0


if __name__ == "__main__":
    run_main(main)
