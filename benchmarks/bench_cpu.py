"""Server CPU per request: ferry against the floor of its own HTTP stack, in one run.

For two bodies, 16 FP32s and one 3x224x224 FP16 image (301 KB), sent as KServe binary tensors
by 32 keep-alive clients to an ONNX ``Identity`` model: the CPU time (user + system) of every
server process over the requests answered, for a bare Starlette app on uvicorn that reads the
same body and answers a small JSON (the floor), ``ferry serve`` (embedded), and ``ferry
gateway`` plus ``ferry worker`` over Redis and over Kafka (broker CPU reported apart). The
target: embedded, at most twice the floor for both bodies. Prints a table and writes JSON.

    python benchmarks/bench_cpu.py                              # the full run, a few minutes
    python benchmarks/bench_cpu.py --quick                      # a smoke run
    python benchmarks/bench_cpu.py --rows floor,embedded        # no broker needed
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
if str(REPO_ROOT) not in sys.path:  # run as a script, benchmarks/ is on the path but not the repository
    sys.path.insert(0, str(REPO_ROOT))

from benchmarks import cpu, fleet_procs  # noqa: E402
from benchmarks.cpu_report import FLOOR, Point, Report, point_line, print_report, write_json  # noqa: E402
from benchmarks.identity_models import DEFAULT_SIZES, PAYLOADS, Payload, write_identity_models  # noqa: E402
from benchmarks.loadgen import LoadSpec, Target, event_loop_runner, infer_request, probe, run_load  # noqa: E402
from benchmarks.server import (  # noqa: E402
    HOST, ServerError, ferry_server, free_port, stop_process, wait_ready,
)
from benchmarks.interrupt import run_main, stop_on_signals  # noqa: E402
from benchmarks.stats import percentile  # noqa: E402
from benchmarks.window import Window, WindowOptions  # noqa: E402

ROWS = (FLOOR, "embedded", "redis", "kafka", "redis-cluster")
DEFAULT_ROWS = ROWS[:4]  # the cluster (six redis-servers) only when asked for
FLOOR_APP = REPO_ROOT / "benchmarks" / "floor_app.py"
DEFAULT_OUT = REPO_ROOT / "benchmarks" / "results" / "cpu.json"
WINDOWS = WindowOptions(full=Window(duration_s=10.0, warmup_s=3.0), quick=Window(duration_s=2.0, warmup_s=1.0))
READY_TIMEOUT_S = 90.0

Pids = dict[str, tuple[int, ...]]   # role -> the roots of its process trees


@dataclass(frozen=True, slots=True)
class BenchSettings:
    duration_s: float = WINDOWS.full.duration_s
    warmup_s: float = WINDOWS.full.warmup_s
    out: Path = DEFAULT_OUT
    rows: tuple[str, ...] = DEFAULT_ROWS
    sizes: tuple[str, ...] = DEFAULT_SIZES
    concurrency: int = 32
    batching: bool = False
    http_workers: int | None = None   # None: ferry's default
    ferry_args: tuple[str, ...] = ()  # for every ferry process: serve, gateway and worker

    @property
    def payloads(self) -> tuple[Payload, ...]:
        return tuple(p for p in PAYLOADS if p.key in self.sizes)

    @property
    def http_args(self) -> tuple[str, ...]:
        return () if self.http_workers is None else ("--http-workers", str(self.http_workers))

    @property
    def serve_args(self) -> tuple[str, ...]:
        return (*self.http_args, *self.ferry_args)

    def to_json(self) -> dict[str, object]:
        return {"duration_s": self.duration_s, "warmup_s": self.warmup_s, "rows": list(self.rows),
                "sizes": list(self.sizes), "concurrency": self.concurrency, "batching": self.batching,
                "http_workers": self.http_workers, "ferry_args": list(self.ferry_args),
                "models": {p.key: {"name": p.model, "datatype": p.datatype, "dims": list(p.dims),
                                   "tensor_bytes": p.nbytes} for p in self.payloads}}


def _choices(allowed: Sequence[str]) -> Callable[[str], tuple[str, ...]]:
    def parse(text: str) -> tuple[str, ...]:
        chosen = tuple(part.strip() for part in text.split(",") if part.strip())
        if not chosen or any(part not in allowed for part in chosen):
            raise argparse.ArgumentTypeError(f"choose among {','.join(allowed)}, not {text!r}")
        return tuple(part for part in allowed if part in chosen)   # in the run's own order
    return parse


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    WINDOWS.add_to(parser)
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="where the JSON goes")
    parser.add_argument("--rows", type=_choices(ROWS), default=DEFAULT_ROWS,
                        help=f"rows to run, comma-separated, of {','.join(ROWS)} (default {','.join(DEFAULT_ROWS)})")
    sizes = tuple(p.key for p in PAYLOADS)
    parser.add_argument("--sizes", type=_choices(sizes), default=DEFAULT_SIZES,
                        help="bodies to send: small (16 x FP32), large (3x224x224 FP16), huge (1024x1024 FP32, "
                             "4 MB); default small,large")
    parser.add_argument("--concurrency", type=int, default=32, help="keep-alive clients (default 32)")
    parser.add_argument("--batching", action="store_true",
                        help="models with max_batch_size 64 and dynamic batching (default: max_batch_size 0)")
    parser.add_argument("--http-workers", type=int, help="passed to ferry serve and ferry gateway")
    parser.add_argument("--ferry-args", default="", help="more options for every ferry process, space-separated "
                                                         "(e.g. '--claim-check-store none')")
    return parser


def settings_from_args(argv: Sequence[str] | None = None) -> BenchSettings:
    args = _parser().parse_args(argv)
    return BenchSettings(**asdict(WINDOWS.chosen(args)), out=args.out, rows=args.rows, sizes=args.sizes,
                         concurrency=args.concurrency, batching=args.batching, http_workers=args.http_workers,
                         ferry_args=tuple(args.ferry_args.split()))


# --- the servers --------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Running:
    host: str
    port: int
    server: Pids
    broker: tuple[int, ...] = ()


@contextlib.contextmanager
def floor_server(log_path: Path) -> Iterator[Running]:
    port = free_port()
    with log_path.open("wb") as log:
        process = subprocess.Popen([sys.executable, str(FLOOR_APP), "--host", HOST, "--port", str(port)],
                                   stdout=log, stderr=subprocess.STDOUT, cwd=REPO_ROOT)
    try:
        wait_ready(process, port, log_path, READY_TIMEOUT_S, name="floor app")
        yield Running(HOST, port, {FLOOR: (process.pid,)})
    finally:
        stop_process(process)


@contextlib.contextmanager
def embedded_server(repository: Path, scratch: Path, settings: BenchSettings) -> Iterator[Running]:
    with ferry_server(repository, scratch / "serve.log", READY_TIMEOUT_S, settings.serve_args) as server:
        yield Running(server.host, server.port, {"serve": (server.pid,)})


@contextlib.contextmanager
def fleet_server(kind: str, repository: Path, scratch: Path, settings: BenchSettings) -> Iterator[Running]:
    """A broker of its own, started for this row only (an idle JVM would tax the other rows),
    then one ``ferry gateway`` and one ``ferry worker`` over it, ready once the worker serves
    every model."""
    starter = {"redis": fleet_procs.redis_server, "kafka": fleet_procs.kafka_server,
               "redis-cluster": fleet_procs.redis_cluster}[kind]
    logs = scratch / kind
    logs.mkdir()
    models = [p.model for p in settings.payloads]
    with starter() as broker:
        url = fleet_procs.fresh_url(broker)
        with fleet_procs.fleet(repository, url, 1, models[0], logs, settings.http_args,
                               settings.ferry_args) as running:
            for model in models[1:]:
                _wait_serving(url, model)
            yield Running(running.host, running.port,
                          {"gateway": (running.gateway_pid,), "worker": running.worker_pids}, broker.pids)


def _wait_serving(url: str, model: str) -> None:
    deadline = time.monotonic() + READY_TIMEOUT_S
    while fleet_procs.serving_workers(url, model) < 1:
        if time.monotonic() > deadline:
            raise ServerError(f"no worker serves '{model}' after {READY_TIMEOUT_S:.0f} s")
        time.sleep(0.2)


def server_for(row: str, repository: Path, scratch: Path,
               settings: BenchSettings) -> contextlib.AbstractContextManager[Running]:
    if row == FLOOR:
        return floor_server(scratch / "floor.log")
    if row == "embedded":
        return embedded_server(repository, scratch, settings)
    return fleet_server(row, repository, scratch, settings)


# --- measuring ---------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Sample:
    at: float
    client_s: float
    server_s: dict[str, float | None]
    broker_s: float | None


def take_sample(running: Running) -> Sample:
    return Sample(time.perf_counter(), time.process_time(),
                  {role: cpu.tree_cpu_s(pids) for role, pids in running.server.items()},
                  cpu.tree_cpu_s(running.broker) if running.broker else None)


def _delta(after: float | None, before: float | None) -> float | None:
    return None if after is None or before is None else after - before


def target_for(running: Running, payload: Payload, settings: BenchSettings) -> Target:
    # The floor answers a small JSON: no binary output follows its header.
    output_bytes = 0 if FLOOR in running.server else payload.nbytes
    request = infer_request(running.host, running.port, payload.model, payload.tensor(settings.batching))
    return Target(running.host, running.port, request, output_bytes)


async def measure(row: str, running: Running, payload: Payload, settings: BenchSettings) -> Point:
    """One closed-loop window; CPU of every server process tree, the broker's and this process's
    are read at both of its edges."""
    target = target_for(running, payload, settings)
    await probe(target)   # raises LoadError when the answer is not what the load generator expects
    spec = LoadSpec(settings.concurrency, settings.warmup_s, settings.duration_s)
    load = asyncio.create_task(run_load(target, spec))
    await asyncio.sleep(spec.warmup_s)
    before = take_sample(running)
    await asyncio.sleep(spec.duration_s)
    after = take_sample(running)
    result = await load
    latencies = sorted(result.latencies_s)
    return Point(
        row, payload, len(latencies), result.errors, spec.duration_s, after.at - before.at,
        {role: _delta(after.server_s[role], before.server_s[role]) for role in before.server_s},
        _delta(after.broker_s, before.broker_s), after.client_s - before.client_s,
        _ms(percentile(latencies, 0.5)), _ms(percentile(latencies, 0.99)), result.first_error,
    )


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else seconds * 1e3


def run(settings: BenchSettings, scratch: Path) -> Report:
    repository = scratch / "models"
    write_identity_models(repository, settings.batching)
    report = Report()
    with event_loop_runner() as runner:
        for row in settings.rows:
            print(f"{row}: starting", flush=True)
            with server_for(row, repository, scratch, settings) as running:
                for payload in settings.payloads:
                    report.points.append(runner.run(measure(row, running, payload, settings)))
                    print(f"  {point_line(report.with_ratios()[-1])}", flush=True)
                    if report.points[-1].first_error is not None:
                        print(f"  first error: {report.points[-1].first_error}", flush=True)
    return report


def main(argv: Sequence[str] | None = None) -> int:
    settings = settings_from_args(argv)
    stop_on_signals()  # every process started here is stopped on the way out
    with tempfile.TemporaryDirectory(prefix="ferry-cpu-") as scratch:
        report = run(settings, Path(scratch))
    print_report(report)
    write_json(settings.out, settings.to_json(), report)
    print(f"wrote {settings.out}")
    return 1 if report.errors else 0


if __name__ == "__main__":
    run_main(main)
