"""Which runtime should serve tree models on the CPU, and what ferry adds on top.

Part 1, in this process: for an XGBoost, a LightGBM and a scikit-learn random-forest
classifier of realistic size, the library's own predict against Treelite's GTIL, a
TL2cgen-compiled shared library (gcc; compile time reported) and an ONNX conversion run by
ONNX Runtime (ferry's own Treelite-to-ONNX conversion; for the forest also skl2onnx's),
at several batch sizes. Part 2: the XGBoost model served by ``ferry serve``
(backend "fil", its default runtime) against the library's own predict, same rows.

    python benchmarks/bench_trees.py            # full run, about five minutes (mostly gcc)
    python benchmarks/bench_trees.py --quick    # a smoke run on smaller models
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np

REPO_ROOT = Path(__file__).resolve().parent.parent
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

from benchmarks.loadgen import LoadSpec, Target, TensorSpec, event_loop_runner, infer_request, probe, run_load  # noqa: E402
from benchmarks.server import ferry_server  # noqa: E402
from benchmarks.stats import int_list  # noqa: E402
from workers.backends.tree_runtimes import ForestFile, open_runtime  # noqa: E402
from workers.offline.trees_export import export_sklearn  # noqa: E402

DEFAULT_OUT = REPO_ROOT / "benchmarks" / "results" / "trees.json"
BATCH_SIZES = (1, 16, 256, 4096)
THREADS = os.cpu_count() or 1
Predict = Callable[[np.ndarray], Any]


@dataclass(frozen=True, slots=True)
class ModelSize:
    trees: int
    depth: int
    features: int
    rows: int


FULL = ModelSize(trees=300, depth=8, features=50, rows=20_000)
QUICK = ModelSize(trees=50, depth=6, features=20, rows=2_000)


@dataclass(frozen=True, slots=True)
class Point:
    model: str
    runtime: str
    batch: int
    rows_per_s: float
    p50_ms: float
    calls: int
    ratio_to_native: float | None = None


def time_calls(predict: Predict, features: np.ndarray, budget_s: float) -> tuple[float, float, int]:
    """Rows/s, median ms per call and calls, calling ``predict`` for about ``budget_s``."""
    for _ in range(3):
        predict(features)
    latencies: list[float] = []
    end = time.perf_counter() + budget_s
    while time.perf_counter() < end or len(latencies) < 5:
        start = time.perf_counter()
        predict(features)
        latencies.append(time.perf_counter() - start)
    total = sum(latencies)
    return features.shape[0] * len(latencies) / total, float(np.median(latencies)) * 1e3, len(latencies)


def train(size: ModelSize, out: Path) -> dict[str, tuple[Path, str, Predict, Predict | None]]:
    """{model: (file, model_type, native predict, ONNX predict made outside the backend or None)}."""
    import lightgbm
    import xgboost
    from sklearn.datasets import make_classification
    from sklearn.ensemble import RandomForestClassifier

    features, labels = make_classification(size.rows, size.features, n_informative=size.features // 2,
                                           random_state=0)
    features = features.astype(np.float32)
    xgb = xgboost.XGBClassifier(n_estimators=size.trees, max_depth=size.depth, tree_method="hist",
                                n_jobs=THREADS).fit(features, labels)
    xgb.get_booster().save_model(out / "xgboost.json")
    lgb = lightgbm.LGBMClassifier(n_estimators=size.trees, max_depth=size.depth, num_leaves=2 ** size.depth - 1,
                                  verbose=-1, n_jobs=THREADS).fit(features, labels)
    lgb.booster_.save_model(out / "model.txt")
    forest = RandomForestClassifier(size.trees, max_depth=size.depth, n_jobs=THREADS,
                                    random_state=0).fit(features, labels)
    export_sklearn(forest, out / "checkpoint.tl")
    booster = xgb.get_booster()
    return {
        "xgboost": (out / "xgboost.json", "xgboost_json",
                    lambda x: booster.inplace_predict(x, validate_features=False), None),
        "lightgbm": (out / "model.txt", "lightgbm", lambda x: lgb.booster_.predict(x, num_threads=THREADS), None),
        "sklearn_rf": (out / "checkpoint.tl", "treelite_checkpoint", forest.predict_proba,
                       _skl2onnx_predict(forest, size.features)),
    }


def _skl2onnx_predict(forest: Any, features: int) -> Predict:
    # For comparison with the backend's own Treelite-to-ONNX conversion of the checkpoint:
    # skl2onnx converting the fitted estimator (which needs the estimator, so a pickle).
    import onnxruntime as ort
    from skl2onnx import to_onnx

    onnx_model = to_onnx(forest, np.zeros((1, features), np.float32), options={"zipmap": False})
    options = ort.SessionOptions()
    options.intra_op_num_threads = THREADS
    session = ort.InferenceSession(onnx_model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    return lambda x: session.run(["probabilities"], {"X": x})


def measure_runtimes(models: dict[str, Any], batches: Sequence[int], budget_s: float,
                     cache: Path) -> tuple[list[Point], dict[str, float]]:
    rng = np.random.default_rng(1)
    points: list[Point] = []
    compile_s: dict[str, float] = {}
    for name, (path, model_type, native, onnx_predict) in models.items():
        runtimes: dict[str, Predict] = {"native": native}
        if onnx_predict is not None:
            runtimes["onnx (skl2onnx)"] = onnx_predict
        for runtime in ("gtil", "tl2cgen", "onnx"):
            start = time.perf_counter()
            loaded = open_runtime(runtime, ForestFile(model_type, path, THREADS, cache))
            if runtime in ("tl2cgen", "onnx"):
                compile_s[f"{name} {runtime}"] = time.perf_counter() - start
            runtimes[runtime] = loaded.predict
        width = _features_of(path, model_type)
        for batch in batches:
            features = rng.normal(size=(batch, width)).astype(np.float32)
            for runtime, predict in runtimes.items():
                rows_s, p50, calls = time_calls(predict, features, budget_s)
                points.append(Point(name, runtime, batch, rows_s, p50, calls))
                print(f"  {_row(points[-1])}", flush=True)
    return with_ratios(points), compile_s


def _features_of(path: Path, model_type: str) -> int:
    return open_runtime("gtil", ForestFile(model_type, path, 1)).num_features


def with_ratios(points: list[Point]) -> list[Point]:
    native = {(p.model, p.batch): p.rows_per_s for p in points if p.runtime == "native"}
    return [Point(**{**asdict(p), "ratio_to_native": p.rows_per_s / native[(p.model, p.batch)]}) for p in points]


def fastest(points: list[Point]) -> dict[str, dict[int, str]]:
    """{model: {batch: the fastest runtime that the backend can serve}}."""
    best: dict[str, dict[int, str]] = {}
    for p in points:
        if p.runtime in ("native", "onnx (skl2onnx)") and p.model == "sklearn_rf":
            continue   # not servable without a pickle, or not through the fil backend
        current = best.setdefault(p.model, {}).get(p.batch)
        rival = next((q for q in points if (q.model, q.batch, q.runtime) == (p.model, p.batch, current)), None)
        if rival is None or p.rows_per_s > rival.rows_per_s:
            best[p.model][p.batch] = p.runtime
    return best


# --- part 2: served through ferry ------------------------------------------

CONFIG = """backend: "fil"
max_batch_size: 4096
input [{{ name: "input__0" data_type: TYPE_FP32 dims: [ {features} ] }}]
output [{{ name: "output__0" data_type: TYPE_FP32 dims: [ 1 ] }}]
instance_group [{{ kind: KIND_CPU }}]
parameters [
  {{ key: "model_type" value: {{ string_value: "xgboost_json" }} }},
  {{ key: "output_class" value: {{ string_value: "true" }} }},
  {{ key: "predict_proba" value: {{ string_value: "true" }} }}
]
dynamic_batching {{ max_queue_delay_microseconds: 1000 }}
"""


def measure_served(model_file: Path, native: Predict, features: int, scratch: Path,
                   loads: Sequence[tuple[int, int]], duration_s: float) -> list[dict[str, Any]]:
    repository = scratch / "repo"
    (repository / "trees" / "1").mkdir(parents=True)
    (repository / "trees" / "1" / "xgboost.json").write_bytes(model_file.read_bytes())
    (repository / "trees" / "config.pbtxt").write_text(CONFIG.format(features=features))
    rng = np.random.default_rng(2)
    rows: list[dict[str, Any]] = []
    with ferry_server(repository, scratch / "ferry.log") as server, event_loop_runner() as runner:
        for batch, concurrency in loads:
            data = rng.normal(size=(batch, features)).astype(np.float32)
            tensor = TensorSpec("input__0", "FP32", data.shape, data.tobytes())
            target = Target(server.host, server.port, infer_request(server.host, server.port, "trees", tensor),
                            batch * 4)
            runner.run(probe(target))
            result = runner.run(run_load(target, LoadSpec(concurrency, min(1.0, duration_s), duration_s)))
            served = batch * len(result.latencies_s) / duration_s
            native_rows, _, _ = time_calls(native, data, duration_s)
            rows.append({"batch": batch, "concurrency": concurrency, "ferry_rows_per_s": served,
                         "native_rows_per_s": native_rows, "ratio": served / native_rows,
                         "p50_ms": float(np.median(result.latencies_s)) * 1e3 if result.latencies_s else None,
                         "errors": result.errors})
            print(f"  ferry batch {batch:>5} x concurrency {concurrency:>3}: {served:>12.0f} rows/s, "
                  f"native {native_rows:>12.0f} rows/s, ratio {served / native_rows:.3f}"
                  f"{f'  ({result.errors} errors: {result.first_error})' if result.errors else ''}", flush=True)
    return rows


def _row(p: Point) -> str:
    ratio = "-" if p.ratio_to_native is None else f"{p.ratio_to_native:.2f}"
    return f"{p.model:<11} {p.runtime:<16} {p.batch:>6} {p.rows_per_s:>14.0f} {p.p50_ms:>10.3f} {ratio:>8}"


def print_table(points: list[Point], compile_s: dict[str, float]) -> None:
    print(f"\n{'model':<11} {'runtime':<16} {'batch':>6} {'rows/s':>14} {'p50 ms':>10} {'x native':>8}")
    for p in points:
        print(_row(p))
    print("\nload time (tl2cgen: gcc compile, cached afterwards; onnx: conversion): "
          + ", ".join(f"{m} {s:.1f} s" for m, s in compile_s.items()))


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="small models, short points")
    parser.add_argument("--batch-sizes", type=int_list, default=BATCH_SIZES)
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument("--skip-serve", action="store_true", help="part 1 only")
    args = parser.parse_args(argv)
    size, budget = (QUICK, 0.2) if args.quick else (FULL, 0.8)
    with tempfile.TemporaryDirectory(prefix="ferry-bench-trees-") as scratch_name:
        scratch = Path(scratch_name)
        print(f"training: {size}", flush=True)
        models = train(size, scratch)
        points, compile_s = measure_runtimes(models, args.batch_sizes, budget, scratch / "tl2cgen")
        print_table(points, compile_s)
        best = fastest(points)
        print("\nfastest servable runtime per batch size:", json.dumps(best))
        served: list[dict[str, Any]] = []
        if not args.skip_serve:
            print("\nserved through ferry serve (xgboost, backend fil, default runtime) vs xgboost in-process:")
            path, _, native, _ = models["xgboost"]
            loads = [(1, 16), (256, 4), (4096, 2)]
            served = measure_served(path, native, size.features, scratch, loads, 1.0 if args.quick else 3.0)
    report = {
        "benchmark": "trees", "when": datetime.now(timezone.utc).isoformat(), "machine": platform.node(),
        "cpus": os.cpu_count(), "threads": THREADS, "model_size": asdict(size),
        "points": [asdict(p) for p in points], "load_s": compile_s, "fastest": best, "served": served,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2))
    print(f"\nwrote {args.out}")


if __name__ == "__main__":
    main()
