"""The baseline: ONNX Runtime called directly in this process, no server in the way."""

from __future__ import annotations

import gc
from collections.abc import Sequence
from pathlib import Path
from time import perf_counter, process_time

import numpy as np

from benchmarks.stats import Summary, summarize

MODE = "onnxruntime in-process"


def measure_ort(model_path: Path, batch_sizes: Sequence[int], warmup_s: float, duration_s: float,
                image_shape: Sequence[int]) -> list[Summary]:
    """Images/s and per-call latency at each batch size, with default session options on CPU."""
    import onnxruntime as ort

    session = ort.InferenceSession(str(model_path), providers=["CPUExecutionProvider"])
    try:
        input_name = session.get_inputs()[0].name
        rng = np.random.default_rng(0)
        summaries = []
        for batch in batch_sizes:
            feed = {input_name: rng.random((batch, *image_shape), dtype=np.float32)}
            _run_for(session, feed, warmup_s)
            cpu_before = process_time()
            latencies, elapsed = _run_for(session, feed, duration_s)
            cores = (process_time() - cpu_before) / elapsed
            summaries.append(summarize(MODE, f"batch {batch}", latencies, batch * len(latencies), elapsed,
                                       compute_cores=cores))
        return summaries
    finally:
        # Release ORT's thread pool before the HTTP runs, so it cannot compete with the server.
        del session
        gc.collect()


def _run_for(session: object, feed: dict[str, np.ndarray], duration_s: float,
             min_calls: int = 3) -> tuple[list[float], float]:
    latencies: list[float] = []
    began = perf_counter()
    deadline = began + duration_s
    while len(latencies) < min_calls or perf_counter() < deadline:
        start = perf_counter()
        session.run(None, feed)  # type: ignore[attr-defined]
        latencies.append(perf_counter() - start)
    return latencies, perf_counter() - began
