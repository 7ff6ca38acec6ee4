"""The sequence batcher on ``model_repo/stateful_gru``, against ONNX Runtime called directly.

    python benchmarks/bench_sequences.py            # about 30 s
    python benchmarks/bench_sequences.py --quick

For each batch size B (1, 8, 32), B sequences of ``--steps`` steps run at once:

- **onnxruntime in-process**: the B sequences stacked into one batch per step,
  the hidden state threaded by hand: the best a batching server could do.
- **ferry sequence batcher**: a ``ModelRunner`` (the worker's model runner,
  no transport) with the committed config (oldest strategy, preferred batch
  sizes 8 and 32, 2 ms queue delay); B concurrent clients each send their
  sequence's steps one after another, state kept by ferry.

It prints sequences/s, steps/s, the mean batch ferry formed, p50/p95 step
latency, and ferry's throughput as a ratio of ORT's at the same B.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.stats import int_list, percentile  # noqa: E402
from benchmarks.table import Column, print_table  # noqa: E402
from broker.envelope import Request, WireTensor  # noqa: E402
from workers.repository.layout import ModelRepository  # noqa: E402
from workers.runner import ModelRunner  # noqa: E402

MODEL_DIR = ROOT / "model_repo" / "stateful_gru"
FRAMES, FEATURES, HIDDEN = 3, 16, 32
COLUMNS = (Column("B", 3), Column("ORT seq/s", 10, ".1f"), Column("ferry seq/s", 12, ".1f"), Column("ratio", 6, ".2f"),
           Column("ferry steps/s", 14, ".1f"), Column("mean batch", 10, ".1f"), Column("p50 ms", 7, ".2f"),
           Column("p95 ms", 7, ".2f"))


def features(rng: np.random.Generator, batch: int) -> np.ndarray:
    return rng.standard_normal((batch, FRAMES, FEATURES)).astype(np.float32)


def measure_ort(batch: int, steps: int, duration_s: float) -> dict[str, float]:
    import onnxruntime as ort

    session = ort.InferenceSession(str(MODEL_DIR / "1" / "model.onnx"), providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(0)
    sequences, calls, began = 0, 0, time.perf_counter()
    while time.perf_counter() - began < duration_s or sequences == 0:
        hidden = np.zeros((batch, HIDDEN), np.float32)
        for _ in range(steps):
            hidden = session.run(["HIDDEN_OUT"], {"FEATURES": features(rng, batch), "HIDDEN_IN": hidden})[0]
            calls += 1
        sequences += batch
    elapsed = time.perf_counter() - began
    return {"sequences_per_s": sequences / elapsed, "steps_per_s": calls * batch / elapsed, "mean_batch": batch}


async def measure_ferry(batch: int, steps: int, duration_s: float) -> dict[str, float]:
    runner = ModelRunner(ModelRepository(MODEL_DIR.parent).entry("stateful_gru"), 1)
    await runner.start()
    latencies: list[float] = []
    next_id = iter(range(1, 1 << 62))

    async def one_sequence(rng: np.random.Generator) -> None:
        sequence_id = next(next_id)
        for t in range(steps):
            data = features(rng, 1)
            request = Request(id=f"{sequence_id}-{t}", model="stateful_gru", reply_to="",
                              inputs=(WireTensor("FEATURES", "FP32", data.shape, data.tobytes()),),
                              sequence_id=sequence_id, sequence_start=t == 0, sequence_end=t == steps - 1)
            start = time.perf_counter()
            await runner.infer(request)
            latencies.append(time.perf_counter() - start)

    async def client(index: int, deadline: float) -> int:
        rng, done = np.random.default_rng(index), 0
        while time.perf_counter() < deadline or done == 0:
            await one_sequence(rng)
            done += 1
        return done

    try:
        began = time.perf_counter()
        batches_before = runner.sequence_batches
        done = await asyncio.gather(*(client(i, began + duration_s) for i in range(batch)))
        elapsed = time.perf_counter() - began
        batches = runner.sequence_batches - batches_before
    finally:
        await runner.aclose()
    ordered = sorted(latencies)
    return {"sequences_per_s": sum(done) / elapsed, "steps_per_s": len(latencies) / elapsed,
            "mean_batch": len(latencies) / max(1, batches),
            "p50_ms": (percentile(ordered, 0.5) or 0) * 1e3, "p95_ms": (percentile(ordered, 0.95) or 0) * 1e3}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch-sizes", type=int_list, default=(1, 8, 32))
    parser.add_argument("--steps", type=int, default=20, help="steps per sequence")
    parser.add_argument("--duration-s", type=float, default=5.0)
    parser.add_argument("--quick", action="store_true", help="1 s per point")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "sequences.json")
    args = parser.parse_args(argv)
    duration = 1.0 if args.quick else args.duration_s
    rows = []
    for batch in args.batch_sizes:
        ort_row = measure_ort(batch, args.steps, duration)
        ferry_row = asyncio.run(measure_ferry(batch, args.steps, duration))
        rows.append({"batch": batch, "ort": ort_row, "ferry": ferry_row,
                     "ratio": ferry_row["sequences_per_s"] / ort_row["sequences_per_s"]})
    print(f"stateful_gru, {args.steps} steps per sequence, {FRAMES} frames per step")
    print_table(COLUMNS, [(row["batch"], row["ort"]["sequences_per_s"], row["ferry"]["sequences_per_s"], row["ratio"],
                           *(row["ferry"][key] for key in ("steps_per_s", "mean_batch", "p50_ms", "p95_ms")))
                          for row in rows])
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"steps": args.steps, "rows": rows}, indent=2))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
