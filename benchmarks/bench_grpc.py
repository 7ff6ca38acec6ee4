"""gRPC against HTTP on ``ferry serve``'s embedded CNN, side by side in one run.

One ``ferry serve`` (``model_repo/cnn`` with its dynamic batching as configured), both doors
open; at each client concurrency the HTTP row (binary tensor extension, ``loadgen``) and the
gRPC row (``raw_input_contents``, ``grpc_load``) are measured one after the other against the
same server, one FP32 image per request. Both clients are as light as their protocol allows
and share the machine with the server, so the server's CPU per request is shown beside
throughput and latency.

    python benchmarks/bench_grpc.py            # the full run, about a minute
    python benchmarks/bench_grpc.py --quick    # a smoke run
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np

REPO_ROOT = Path(__file__).resolve().parent.parent
if str(REPO_ROOT) not in sys.path:  # run as a script, benchmarks/ is on the path but not the repository
    sys.path.insert(0, str(REPO_ROOT))

from benchmarks import grpc_load, side_by_side  # noqa: E402
from benchmarks.bench_embedded import IMAGE_SHAPE, MODEL_DIR, MODEL_NAME, OUTPUT_BYTES, measure_point  # noqa: E402
from benchmarks.loadgen import (  # noqa: E402
    LoadResult, LoadSpec, Target, TensorSpec, event_loop_runner, infer_request, probe, run_clients, run_load,
)
from benchmarks.server import copy_model, ferry_server, free_port  # noqa: E402
from benchmarks.stats import Summary, int_list  # noqa: E402
from benchmarks.table import print_table  # noqa: E402
from benchmarks.window import Window, WindowOptions  # noqa: E402

HTTP, GRPC = "HTTP (binary)", "gRPC (raw)"
DEFAULT_OUT = REPO_ROOT / "benchmarks" / "results" / "grpc.json"
WINDOWS = WindowOptions(full=Window(duration_s=5.0, warmup_s=2.0), quick=Window(duration_s=1.0, warmup_s=0.5))
DEFAULT_CONCURRENCY = (1, 16, 64)
COLUMNS = side_by_side.columns("protocol", 14)


@dataclass(frozen=True, slots=True)
class BenchSettings:
    duration_s: float
    warmup_s: float
    concurrency: tuple[int, ...]
    out: Path


def settings_from_args(argv: Sequence[str] | None = None) -> BenchSettings:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    WINDOWS.add_to(parser)
    parser.add_argument("--concurrency", type=int_list, default=DEFAULT_CONCURRENCY,
                        help="client concurrencies, comma-separated (default 1,16,64)")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="where the JSON goes")
    args = parser.parse_args(argv)
    window = WINDOWS.chosen(args)
    return BenchSettings(window.duration_s, window.warmup_s, args.concurrency, args.out)


Load = Callable[[LoadSpec], Coroutine[Any, Any, LoadResult]]


async def _measure_both(http: Target, grpc_target: grpc_load.GrpcTarget, settings: BenchSettings,
                        server_pid: int) -> list[Summary]:
    await probe(http)
    await grpc_load.probe(grpc_target)
    loads: dict[str, Load] = {
        HTTP: lambda spec: run_load(http, spec),
        GRPC: lambda spec: run_clients(grpc_load.client(grpc_target), spec),
    }
    summaries = []
    for concurrency in settings.concurrency:
        for protocol, load in loads.items():
            spec = LoadSpec(concurrency, settings.warmup_s, settings.duration_s)
            summaries.append(await measure_point(protocol, load(spec), spec, server_pid))
            print("  " + side_by_side.line(COLUMNS, summaries[-1]), flush=True)
    return summaries


def run(settings: BenchSettings) -> list[Summary]:
    image = np.random.default_rng(1).random((1, *IMAGE_SHAPE), dtype=np.float32)
    tensor = TensorSpec("IMAGE", "FP32", image.shape, image.tobytes())
    grpc_port = free_port()
    with tempfile.TemporaryDirectory(prefix="ferry-bench-grpc-") as scratch:
        repository = Path(scratch) / "repo"
        repository.mkdir()
        copy_model(MODEL_DIR, repository, dynamic_batching=True)
        with ferry_server(repository, Path(scratch) / "ferry.log", extra_args=["--grpc-port", str(grpc_port)]) \
                as server, event_loop_runner() as runner:
            http = Target(server.host, server.port,
                          infer_request(server.host, server.port, MODEL_NAME, tensor), OUTPUT_BYTES)
            grpc_target = grpc_load.GrpcTarget(f"{server.host}:{grpc_port}",
                                               grpc_load.model_infer_request(MODEL_NAME, tensor), OUTPUT_BYTES)
            return runner.run(_measure_both(http, grpc_target, settings, server.pid))


def ratios(summaries: list[Summary]) -> list[dict[str, object]]:
    """gRPC over HTTP at each concurrency: throughput, p50 and p99."""
    return side_by_side.ratios(summaries, GRPC, HTTP)


def write_json(path: Path, settings: BenchSettings, summaries: list[Summary]) -> None:
    import grpc
    import onnxruntime

    path.parent.mkdir(parents=True, exist_ok=True)
    document = {
        "benchmark": "grpc_vs_http",
        "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "model": MODEL_NAME,
        "versions": {"grpcio": grpc.__version__, "onnxruntime": onnxruntime.__version__},
        "settings": {"duration_s": settings.duration_s, "warmup_s": settings.warmup_s,
                     "concurrency": list(settings.concurrency)},
        "results": [summary.to_json() for summary in summaries],
        "grpc_over_http": ratios(summaries),
    }
    path.write_text(json.dumps(document, indent=2, allow_nan=False) + "\n")


def main(argv: Sequence[str] | None = None) -> int:
    settings = settings_from_args(argv)
    print("ferry serve, cnn with dynamic batching, one FP32 image per request", flush=True)
    summaries = run(settings)
    print()
    print_table(COLUMNS, [side_by_side.values(summary) for summary in summaries])
    side_by_side.print_ratios("gRPC / HTTP", ratios(summaries))
    write_json(settings.out, settings, summaries)
    print(f"\nwrote {settings.out}")
    return 1 if any(summary.errors for summary in summaries) else 0


if __name__ == "__main__":
    sys.exit(main())
