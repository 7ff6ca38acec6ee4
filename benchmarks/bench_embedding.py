"""The text-embedding ensemble through ferry against its three stages called in-process.

Contender: ``ferry serve`` on the ``embed`` ensemble and its step models
(tokenizer, MiniLM in ONNX Runtime, pooling; each dynamically batched), one
sentence per HTTP request, a closed loop at concurrency 16. Every request makes
three hops over the in-memory broker.

Baselines, in this process, on the same sentence and the same model files (ONNX
Runtime with spinning off, as ferry's backend runs it):
- 16 threads, each embedding one sentence at a time (the same concurrency, no batching);
- one thread embedding batches of 16 (the batching ferry's batchers may form at best).

Prints a table (throughput, p50/p99 latency, ratio to the best baseline) and the
ensemble's per-step latency as its response parameters report it, and writes JSON.

    python benchmarks/bench_embedding.py            # about half a minute
    python benchmarks/bench_embedding.py --quick    # a smoke run
"""

from __future__ import annotations

import argparse
import json
import platform
import shutil
import struct
import sys
import tempfile
import threading
from dataclasses import asdict, dataclass, replace
from datetime import datetime, timezone
from pathlib import Path
from time import perf_counter

import numpy as np

REPO_ROOT = Path(__file__).resolve().parent.parent
if str(REPO_ROOT) not in sys.path:  # run as a script, benchmarks/ is on the path but not the repository
    sys.path.insert(0, str(REPO_ROOT))

from benchmarks.loadgen import LoadSpec, Target, TensorSpec, event_loop_runner, infer_request, probe, run_load  # noqa: E402
from benchmarks.server import ferry_server  # noqa: E402
from benchmarks.stats import Summary, summarize  # noqa: E402

MODEL_REPO = REPO_ROOT / "model_repo"
MODELS = ("minilm_tokenizer", "minilm", "minilm_pooling", "embed")
SENTENCE = "ferry turns a message queue into an inference server for sentence embeddings."
EMBEDDING_BYTES = 384 * 4
CONCURRENCY = 16
DEFAULT_OUT = REPO_ROOT / "benchmarks" / "results" / "embedding.json"
FERRY = "ferry serve, ensemble"
THREADS = f"in-process, {CONCURRENCY} threads x 1"
BATCHED = f"in-process, batch {CONCURRENCY}"


@dataclass(frozen=True, slots=True)
class Settings:
    warmup_s: float = 2.0
    duration_s: float = 6.0
    out: Path = DEFAULT_OUT


class Stages:
    """The ensemble's three steps, called directly: the step models' own code and files."""

    def __init__(self) -> None:
        import onnxruntime as ort
        from tokenizers import Tokenizer

        self._tokenizer = Tokenizer.from_file(str(MODEL_REPO / "minilm_tokenizer" / "1" / "tokenizer.json"))
        self._tokenizer.enable_truncation(256)
        self._tokenizer.enable_padding(pad_id=0, pad_token="[PAD]")
        options = ort.SessionOptions()
        # As ferry's ONNX Runtime backend sets it, so both sides compute alike.
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
        self._session = ort.InferenceSession(str(MODEL_REPO / "minilm" / "1" / "model.onnx"), options,
                                             providers=["CPUExecutionProvider"])
        self._pool = _load_pooling()

    def embed(self, sentences: list[str]) -> np.ndarray:
        encodings = self._tokenizer.encode_batch(sentences)
        feed = {
            "input_ids": np.array([e.ids for e in encodings], dtype=np.int64),
            "attention_mask": np.array([e.attention_mask for e in encodings], dtype=np.int64),
            "token_type_ids": np.array([e.type_ids for e in encodings], dtype=np.int64),
        }
        (tokens,) = self._session.run(None, feed)
        return self._pool(tokens, feed["attention_mask"])


def _load_pooling():  # type: ignore[no-untyped-def]
    import importlib.util

    spec = importlib.util.spec_from_file_location("minilm_pooling", MODEL_REPO / "minilm_pooling" / "1" / "model.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.pool


def measure_threads(stages: Stages, settings: Settings) -> Summary:
    latencies: list[float] = []
    lock = threading.Lock()
    start = perf_counter()
    window = (start + settings.warmup_s, start + settings.warmup_s + settings.duration_s)

    def loop() -> None:
        while (began := perf_counter()) < window[1]:
            stages.embed([SENTENCE])
            ended = perf_counter()
            if window[0] <= ended <= window[1]:
                with lock:
                    latencies.append(ended - began)

    threads = [threading.Thread(target=loop) for _ in range(CONCURRENCY)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return summarize(THREADS, f"concurrency {CONCURRENCY}", latencies, len(latencies), settings.duration_s)


def measure_batched(stages: Stages, settings: Settings) -> Summary:
    batch = [SENTENCE] * CONCURRENCY
    deadline = perf_counter() + settings.warmup_s
    while perf_counter() < deadline:
        stages.embed(batch)
    latencies: list[float] = []
    began = perf_counter()
    while perf_counter() - began < settings.duration_s:
        start = perf_counter()
        stages.embed(batch)
        latencies.append(perf_counter() - start)
    elapsed = perf_counter() - began
    return summarize(BATCHED, f"batch {CONCURRENCY}", latencies, CONCURRENCY * len(latencies), elapsed)


def measure_ferry(settings: Settings, scratch: Path) -> tuple[Summary, dict[str, float]]:
    repository = scratch / "repo"
    for name in MODELS:
        shutil.copytree(MODEL_REPO / name, repository / name, ignore=shutil.ignore_patterns("__pycache__"))
    text = SENTENCE.encode()
    tensor = TensorSpec("TEXT", "BYTES", (1, 1), struct.pack("<I", len(text)) + text)
    with ferry_server(repository, scratch / "serve.log") as server, event_loop_runner() as runner:
        target = Target(server.host, server.port, infer_request(server.host, server.port, "embed", tensor),
                        EMBEDDING_BYTES)
        runner.run(probe(target))
        result = runner.run(run_load(target, LoadSpec(CONCURRENCY, settings.warmup_s, settings.duration_s)))
        # One more request, alone, for the per-step breakdown the ensemble reports.
        breakdown = runner.run(probe(target)).get("parameters", {})
    if result.first_error is not None:
        print(f"  {FERRY}: {result.errors} errors, first: {result.first_error}")
    summary = summarize(FERRY, f"concurrency {CONCURRENCY}", result.latencies_s, len(result.latencies_s),
                        settings.duration_s, result.errors)
    return summary, {k: float(v) for k, v in breakdown.items() if k.startswith("ensemble_")}


def with_ratios(summaries: list[Summary]) -> list[Summary]:
    best = max(s.images_per_s for s in summaries if s.mode != FERRY)
    return [replace(s, ratio_to_best_ort=s.images_per_s / best if best else None) for s in summaries]


def print_table(summaries: list[Summary], breakdown: dict[str, float]) -> None:
    print(f"\n{'mode':<30} {'point':<16} {'sentences/s':>11} {'p50 ms':>8} {'p99 ms':>8} {'vs best in-process':>19}")
    for s in summaries:
        ratio = "-" if s.ratio_to_best_ort is None else f"{s.ratio_to_best_ort:.2f}"
        p50 = "-" if s.p50_ms is None else f"{s.p50_ms:.2f}"
        p99 = "-" if s.p99_ms is None else f"{s.p99_ms:.2f}"
        print(f"{s.mode:<30} {s.point:<16} {s.images_per_s:>11.1f} {p50:>8} {p99:>8} {ratio:>19}"
              + (f"  ({s.errors} errors)" if s.errors else ""))
    print("\nensemble latency parameters of one unloaded request (ms):")
    for key, value in breakdown.items():
        print(f"  {key:<40} {value:>8.3f}")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="short durations, for a smoke run")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = parser.parse_args(argv)
    settings = Settings(0.5, 1.5, args.out) if args.quick else Settings(out=args.out)
    import subprocess

    subprocess.run([sys.executable, str(MODEL_REPO / "convert_minilm.py")], check=True)
    stages = Stages()
    print(f"in-process baselines ({settings.duration_s:g} s each)...", flush=True)
    baselines = [measure_threads(stages, settings), measure_batched(stages, settings)]
    del stages
    print(f"ferry serve at concurrency {CONCURRENCY}...", flush=True)
    with tempfile.TemporaryDirectory(prefix="ferry-bench-embedding-") as scratch:
        ferry, breakdown = measure_ferry(settings, Path(scratch))
    summaries = with_ratios([*baselines, ferry])
    print_table(summaries, breakdown)
    settings.out.parent.mkdir(parents=True, exist_ok=True)
    settings.out.write_text(json.dumps({
        "benchmark": "embedding",
        "when": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "machine": {"python": platform.python_version(), "cpus": __import__("os").cpu_count()},
        "settings": {**asdict(settings), "out": str(settings.out), "concurrency": CONCURRENCY,
                     "sentence": SENTENCE},
        "results": [s.to_json() for s in summaries],
        "ensemble_latency_ms": breakdown,
        "key_figure": {"name": f"{FERRY} / best in-process, sentences/s",
                       "value": summaries[-1].ratio_to_best_ort},
    }, indent=2))
    print(f"\nwrote {settings.out}")


if __name__ == "__main__":
    main()
