"""How close ``ferry serve`` comes to calling ONNX Runtime directly, on the ``cnn`` model.

Baseline: ``model_repo/cnn/1/model.onnx`` run in this process at several batch sizes.
Contender: ``ferry serve`` over HTTP, one image per request, at several client
concurrencies, with the model's ``dynamic_batching`` on (its config as is) and off (the
block removed, so every request runs alone). Prints a table and writes JSON; the key figure
is ferry with batching at the highest concurrency over the best in-process throughput.

With ``--mlserver PYTHON`` (a Python whose environment has MLServer; see
``mlserver_rival.py``), ferry and MLServer also serve the same image as a KServe V2 JSON body
(each element written with four decimals), both running at once and measured in turn at each
concurrency; the second key figure is ferry's JSON throughput over MLServer's at the highest.

    python benchmarks/bench_embedded.py            # the full run, about a minute
    python benchmarks/bench_embedded.py --quick    # a smoke run
    python -m venv /tmp/mlserver && /tmp/mlserver/bin/pip install mlserver==1.7.1 onnxruntime 'uvloop<0.22'
    python benchmarks/bench_embedded.py --mlserver /tmp/mlserver/bin/python
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import sys
import tempfile
from collections.abc import Coroutine, Sequence
from dataclasses import asdict, dataclass, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np

REPO_ROOT = Path(__file__).resolve().parent.parent
if str(REPO_ROOT) not in sys.path:  # run as a script, benchmarks/ is on the path but not the repository
    sys.path.insert(0, str(REPO_ROOT))

from benchmarks import cpu, mlserver_rival, profiling  # noqa: E402
from benchmarks.loadgen import (  # noqa: E402
    LoadResult, LoadSpec, Target, TensorSpec, event_loop_runner, http_request, infer_request, probe, run_load,
)
from benchmarks.ort_inprocess import MODE as ORT_MODE, measure_ort  # noqa: E402
from benchmarks.server import RunningServer, copy_model, ferry_server  # noqa: E402
from benchmarks.stats import Summary, int_list, summarize  # noqa: E402
from benchmarks.window import Window, WindowOptions  # noqa: E402
from workers.repository.config_file import parse_config_file  # noqa: E402

MODEL_DIR = REPO_ROOT / "model_repo" / "cnn"
MODEL_NAME = "cnn"
IMAGE_SHAPE = (3, 128, 128)
OUTPUT_BYTES = 10 * 4          # PROBS: FP32 [1, 10]
TARGET_RATIO = 0.9
MLSERVER_TARGET_RATIO = 2.0
BATCHING, NO_BATCHING = "ferry, batching", "ferry, no batching"
FERRY_JSON, MLSERVER_JSON = "ferry, JSON", "MLServer, JSON"
DEFAULT_OUT = REPO_ROOT / "benchmarks" / "results" / "embedded.json"
WINDOWS = WindowOptions(full=Window(duration_s=4.0, warmup_s=2.0), quick=Window(duration_s=1.0, warmup_s=0.5))
DEFAULT_BATCH_SIZES = (1, 8, 32, 64)
DEFAULT_CONCURRENCY = (1, 16, 64)


@dataclass(frozen=True, slots=True)
class BenchSettings:
    duration_s: float = WINDOWS.full.duration_s
    warmup_s: float = WINDOWS.full.warmup_s
    out: Path = DEFAULT_OUT
    skip_ort: bool = False
    batch_sizes: tuple[int, ...] = DEFAULT_BATCH_SIZES
    concurrency: tuple[int, ...] = DEFAULT_CONCURRENCY
    profile: bool = False
    mlserver: Path | None = None


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    WINDOWS.add_to(parser)
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="where the JSON goes")
    parser.add_argument("--skip-ort", action="store_true", help="skip the in-process ONNX Runtime baseline")
    parser.add_argument("--concurrency", type=int_list, default=DEFAULT_CONCURRENCY,
                        help="client concurrencies, comma-separated (default 1,16,64)")
    parser.add_argument("--batch-sizes", type=int_list, default=DEFAULT_BATCH_SIZES,
                        help="in-process batch sizes, comma-separated (default 1,8,32,64)")
    parser.add_argument("--profile", action="store_true",
                        help="afterwards, sample the server with py-spy during one more batching run "
                             "at the highest concurrency (needs py-spy; not part of the table)")
    parser.add_argument("--mlserver", type=Path, metavar="PYTHON",
                        help="also serve JSON bodies with ferry and with MLServer from this Python's environment")
    return parser


def settings_from_args(argv: Sequence[str] | None = None) -> BenchSettings:
    args = _parser().parse_args(argv)
    return BenchSettings(
        **asdict(WINDOWS.chosen(args)), out=args.out, skip_ort=args.skip_ort, batch_sizes=args.batch_sizes,
        concurrency=args.concurrency, profile=args.profile, mlserver=args.mlserver,
    )


def _image() -> np.ndarray:
    return np.random.default_rng(1).random((1, *IMAGE_SHAPE), dtype=np.float32)


def _json_target(server: RunningServer) -> Target:
    data = [round(value, 4) for value in _image().ravel().tolist()]
    body = json.dumps({"inputs": [{"name": "IMAGE", "datatype": "FP32", "shape": [1, *IMAGE_SHAPE], "data": data}]},
                      separators=(",", ":")).encode()
    request = http_request(server.host, server.port, "POST", f"/v2/models/{MODEL_NAME}/infer", body,
                           {"Content-Type": "application/json"})
    return Target(server.host, server.port, request, None)


def _target(server: RunningServer) -> Target:
    image = _image()
    tensor = TensorSpec("IMAGE", "FP32", image.shape, image.tobytes())
    return Target(server.host, server.port, infer_request(server.host, server.port, MODEL_NAME, tensor),
                  OUTPUT_BYTES)


async def _measure_point(mode: str, target: Target, spec: LoadSpec, server_pid: int) -> Summary:
    return await measure_point(mode, run_load(target, spec), spec, server_pid)


async def measure_point(mode: str, running: Coroutine[Any, Any, LoadResult], spec: LoadSpec,
                        server_pid: int) -> Summary:
    """Run ``running`` (a load of ``spec``) and summarise its window, with the server's CPU."""
    load = asyncio.create_task(running)
    await asyncio.sleep(spec.warmup_s)
    before = cpu.sample(server_pid)
    await asyncio.sleep(spec.duration_s)
    client_cores, server_cores = cpu.cores_used(before, cpu.sample(server_pid), spec.duration_s)
    result = await load
    if result.first_error is not None:
        print(f"  {mode}, concurrency {spec.concurrency}: {result.errors} errors, first: {result.first_error}")
    return summarize(mode, f"concurrency {spec.concurrency}", result.latencies_s, len(result.latencies_s),
                     spec.duration_s, result.errors, compute_cores=server_cores, client_cores=client_cores)


async def _measure_http(mode: str, target: Target, settings: BenchSettings, server_pid: int) -> list[Summary]:
    header = await probe(target)
    outputs = {output["name"]: output for output in header["outputs"]}
    if outputs.get("PROBS", {}).get("parameters", {}).get("binary_data_size") != OUTPUT_BYTES:
        raise SystemExit(f"unexpected response header from ferry: {header}")
    summaries = []
    for concurrency in settings.concurrency:
        spec = LoadSpec(concurrency, settings.warmup_s, settings.duration_s)
        summaries.append(await _measure_point(mode, target, spec, server_pid))
        print(f"  {_row(summaries[-1])}", flush=True)
    return summaries


async def _profile_http(server: RunningServer, target: Target, settings: BenchSettings,
                        out_dir: Path) -> profiling.Profile | None:
    concurrency = max(settings.concurrency)
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"profile-batching-c{concurrency}.txt"
    recording = asyncio.create_task(profiling.record(server.pid, settings.warmup_s, settings.duration_s, path))
    await run_load(target, LoadSpec(concurrency, settings.warmup_s, settings.duration_s))
    recorded = await recording
    return profiling.read_profile(recorded, settings.duration_s) if recorded is not None else None


def run_ferry(mode: str, settings: BenchSettings, scratch: Path) -> tuple[list[Summary], profiling.Profile | None]:
    repository = scratch / mode.replace(", ", "-").replace(" ", "-")
    repository.mkdir()
    copy_model(MODEL_DIR, repository, dynamic_batching=mode == BATCHING)
    profile = None
    with ferry_server(repository, scratch / f"{repository.name}.log") as server, event_loop_runner() as runner:
        target = _target(server)
        summaries = runner.run(_measure_http(mode, target, settings, server.pid))
        if settings.profile and mode == BATCHING:
            if profiling.py_spy_available():
                profile = runner.run(_profile_http(server, target, settings, settings.out.parent))
            else:
                print("  --profile: py-spy is not installed (pip install py-spy); skipped")
    return summaries, profile


def run_json(python: Path, settings: BenchSettings, scratch: Path) -> list[Summary]:
    """ferry and MLServer, both up at once, measured in turn at each concurrency on JSON bodies."""
    found = mlserver_rival.version(python)
    if found is None:
        raise SystemExit(f"--mlserver {python}: no mlserver in that environment")
    print(f"{FERRY_JSON} against MLServer {found}, JSON: both serving, measured in turn", flush=True)
    repository = scratch / "json"
    repository.mkdir()
    copy_model(MODEL_DIR, repository, dynamic_batching=True)
    config = parse_config_file(MODEL_DIR / "config.pbtxt")  # MLServer batches as ferry does
    assert config.dynamic_batching is not None, "the cnn model batches dynamically"
    delay_s = config.dynamic_batching.max_queue_delay_microseconds / 1e6
    with (ferry_server(repository, scratch / "ferry-json.log") as ferry,
          mlserver_rival.mlserver_server(python, scratch / "mlserver", MODEL_NAME, MODEL_DIR / "1" / "model.onnx",
                                         scratch / "mlserver.log", max_batch_size=config.max_batch_size,
                                         max_delay_s=delay_s) as rival,
          event_loop_runner() as runner):
        targets = {FERRY_JSON: (_json_target(ferry), ferry.pid), MLSERVER_JSON: (_json_target(rival), rival.pid)}
        for target, _ in targets.values():
            runner.run(probe(target))
        summaries = []
        for concurrency in settings.concurrency:
            spec = LoadSpec(concurrency, settings.warmup_s, settings.duration_s)
            for mode, (target, pid) in targets.items():
                summaries.append(runner.run(_measure_point(mode, target, spec, pid)))
                print(f"  {_row(summaries[-1])}", flush=True)
    return summaries


def with_ratios(summaries: list[Summary]) -> tuple[list[Summary], float | None]:
    ort = [summary.images_per_s for summary in summaries if summary.mode == ORT_MODE]
    best = max(ort) if ort else None
    if not best:
        return summaries, None
    return [replace(summary, ratio_to_best_ort=summary.images_per_s / best) for summary in summaries], best


def _row(summary: Summary) -> str:
    ratio = _maybe(summary.ratio_to_best_ort, ".2f")
    errors = f"  ({summary.errors} errors)" if summary.errors else ""
    return (f"{summary.mode:<24} {summary.point:<16} {summary.images_per_s:>10.1f} "
            f"{_maybe(summary.p50_ms, '.2f'):>9} {_maybe(summary.p99_ms, '.2f'):>9} {ratio:>17}{errors}")


def print_table(summaries: list[Summary]) -> None:
    print()
    print(f"{'mode':<24} {'batch/concurrency':<16} {'images/s':>10} {'p50 ms':>9} {'p99 ms':>9} "
          f"{'ratio to best ORT':>17}")
    for summary in summaries:
        print(_row(summary))


def print_cpu_table(summaries: list[Summary]) -> None:
    # "model side": the process running the model, this one for ORT, the server for ferry.
    print(f"\n{'CPU':<24} {'batch/concurrency':<16} {'model-side cores':>16} "
          f"{'client cores':>12} {'model-side CPU ms/image':>23}")
    for s in summaries:
        print(f"{s.mode:<24} {s.point:<16} {_maybe(s.compute_cores, '.2f'):>16} "
              f"{_maybe(s.client_cores, '.2f'):>12} {_maybe(s.compute_ms_per_image, '.2f'):>23}")


def _maybe(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def json_figure(summaries: list[Summary], settings: BenchSettings) -> dict[str, object] | None:
    point = f"concurrency {max(settings.concurrency)}"
    pair = {s.mode: s for s in summaries if s.point == point and s.mode in (FERRY_JSON, MLSERVER_JSON)}
    if len(pair) < 2 or not pair[MLSERVER_JSON].images_per_s:
        return None
    ratio = pair[FERRY_JSON].images_per_s / pair[MLSERVER_JSON].images_per_s
    return {"name": f"{FERRY_JSON} / {MLSERVER_JSON} at {point}", "value": ratio,
            "target": MLSERVER_TARGET_RATIO, "met": ratio >= MLSERVER_TARGET_RATIO}


def key_figure(summaries: list[Summary], settings: BenchSettings) -> dict[str, object]:
    point = f"concurrency {max(settings.concurrency)}"
    ferry = next((s for s in summaries if s.mode == BATCHING and s.point == point), None)
    ratio = ferry.ratio_to_best_ort if ferry else None
    return {
        "name": f"{BATCHING} at {point} / best {ORT_MODE}",
        "value": ratio,
        "target": TARGET_RATIO,
        "met": ratio is not None and ratio >= TARGET_RATIO,
    }


def _machine() -> dict[str, object]:
    import onnxruntime

    return {"cpus": os.cpu_count(), "platform": platform.platform(), "python": platform.python_version(),
            "onnxruntime": onnxruntime.__version__, "numpy": np.__version__}


def write_json(path: Path, settings: BenchSettings, summaries: list[Summary], best: float | None,
               profile: profiling.Profile | None) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    document = {
        "benchmark": "embedded",
        "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "model": MODEL_NAME,
        "machine": _machine(),
        "settings": {"duration_s": settings.duration_s, "warmup_s": settings.warmup_s,
                     "batch_sizes": list(settings.batch_sizes), "concurrency": list(settings.concurrency)},
        "results": [summary.to_json() for summary in summaries],
        "best_ort_images_per_s": best,
        "key_figure": key_figure(summaries, settings),
        "json_figure": json_figure(summaries, settings),
        "server_profile": profile.to_json() if profile is not None else None,
    }
    path.write_text(json.dumps(document, indent=2, allow_nan=False) + "\n")


def print_profile(profile: profiling.Profile | None) -> None:
    if profile is None:
        return
    print("\nserver, batching at the highest concurrency, sampled by py-spy (a separate run)")
    print("  threads busy: " + ", ".join(f"{name} {busy:.0%}" for name, busy in profile.threads_busy.items()))
    print("  top functions by self time (self %, total %, of all samples):")
    for share in profile.top:
        print(f"  {share.self_fraction:6.1%} {share.total_fraction:6.1%}  {share.function}")


def main(argv: Sequence[str] | None = None) -> int:
    settings = settings_from_args(argv)
    summaries: list[Summary] = []
    if not settings.skip_ort:
        print(f"{ORT_MODE}: {MODEL_DIR / '1' / 'model.onnx'}", flush=True)
        summaries += measure_ort(MODEL_DIR / "1" / "model.onnx", settings.batch_sizes,
                                 settings.warmup_s, settings.duration_s, IMAGE_SHAPE)
    profile = None
    with tempfile.TemporaryDirectory(prefix="ferry-bench-") as scratch:
        for mode in (BATCHING, NO_BATCHING):
            print(f"{mode}: ferry serve over HTTP, one image per request", flush=True)
            rows, mode_profile = run_ferry(mode, settings, Path(scratch))
            summaries += rows
            profile = profile or mode_profile
        if settings.mlserver is not None:
            summaries += run_json(settings.mlserver, settings, Path(scratch))
    summaries, best = with_ratios(summaries)
    print_table(summaries)
    print_cpu_table(summaries)
    figure = key_figure(summaries, settings)
    if figure["value"] is not None:
        print(f"\nkey figure: {figure['name']} = {figure['value']:.2f} (target >= {TARGET_RATIO})")
    versus = json_figure(summaries, settings)
    if versus is not None:
        print(f"JSON figure: {versus['name']} = {versus['value']:.2f} (target >= {MLSERVER_TARGET_RATIO})")
    print_profile(profile)
    write_json(settings.out, settings, summaries, best, profile)
    print(f"\nwrote {settings.out}")
    return 1 if any(summary.errors for summary in summaries) else 0


if __name__ == "__main__":
    sys.exit(main())
