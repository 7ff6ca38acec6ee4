"""The response cache on against off, on ``ferry serve``'s embedded CNN, under a load
where most requests repeat.

Two ``ferry serve`` runs of ``model_repo/cnn`` with ``response_cache { enable: true }``, one
with ``--cache-config local,size=...`` and one without, one after the other in one run. Each
client sends one FP32 image per request: with probability ``--repeat`` (0.9) one of
``--hot`` (16) images, else an image never sent before (a counter written into its first
pixel). So with the cache, about that share of requests are hits once the hot images were seen.

    python benchmarks/bench_cache.py            # the full run, about half a minute
    python benchmarks/bench_cache.py --quick    # a smoke run
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import struct
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from time import perf_counter

import numpy as np

REPO_ROOT = Path(__file__).resolve().parent.parent
if str(REPO_ROOT) not in sys.path:  # run as a script, benchmarks/ is on the path but not the repository
    sys.path.insert(0, str(REPO_ROOT))

from benchmarks import side_by_side  # noqa: E402
from benchmarks.bench_embedded import IMAGE_SHAPE, MODEL_DIR, MODEL_NAME, OUTPUT_BYTES, measure_point  # noqa: E402
from benchmarks.loadgen import (  # noqa: E402
    LoadResult, LoadSpec, Target, TensorSpec, Window, event_loop_runner, infer_request, probe, read_response,
    record, run_clients,
)
from benchmarks.server import copy_model, ferry_server  # noqa: E402
from benchmarks.stats import Summary, int_list  # noqa: E402
from benchmarks.table import print_table  # noqa: E402
from benchmarks.window import Window as WindowSetting, WindowOptions  # noqa: E402

CACHE_ON, CACHE_OFF = "cache on", "cache off"
CACHE_BYTES = 256 << 20
DEFAULT_OUT = REPO_ROOT / "benchmarks" / "results" / "cache.json"
WINDOWS = WindowOptions(full=WindowSetting(duration_s=6.0, warmup_s=2.0),
                        quick=WindowSetting(duration_s=1.0, warmup_s=0.5))
DEFAULT_CONCURRENCY = (1, 16)
COLUMNS = side_by_side.columns("cache", 9)


@dataclass(frozen=True, slots=True)
class BenchSettings:
    duration_s: float
    warmup_s: float
    concurrency: tuple[int, ...]
    repeat: float
    hot: int
    out: Path


def settings_from_args(argv: Sequence[str] | None = None) -> BenchSettings:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    WINDOWS.add_to(parser)
    parser.add_argument("--concurrency", type=int_list, default=DEFAULT_CONCURRENCY,
                        help="client concurrencies, comma-separated (default 1,16)")
    parser.add_argument("--repeat", type=float, default=0.9, help="share of requests for a hot image (0.9)")
    parser.add_argument("--hot", type=int, default=16, help="how many distinct hot images (16)")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="where the JSON goes")
    args = parser.parse_args(argv)
    window = WINDOWS.chosen(args)
    return BenchSettings(window.duration_s, window.warmup_s, args.concurrency, args.repeat, args.hot, args.out)


class Images:
    """The requests: a few hot ones, sent again and again, and fresh ones made on demand."""

    def __init__(self, host: str, port: int, hot: int, repeat: float) -> None:
        rng = np.random.default_rng(7)
        self._host, self._port, self._repeat = host, port, repeat
        self._base = rng.random((1, *IMAGE_SHAPE), dtype=np.float32).tobytes()
        self.hot = [self._request(rng.random((1, *IMAGE_SHAPE), dtype=np.float32).tobytes()) for _ in range(hot)]
        self._fresh = 0
        self._choice = random.Random(11)

    def _request(self, data: bytes) -> bytes:
        return infer_request(self._host, self._port, MODEL_NAME, TensorSpec("IMAGE", "FP32", (1, *IMAGE_SHAPE), data))

    def next(self) -> bytes:
        if self._choice.random() < self._repeat:
            return self._choice.choice(self.hot)
        self._fresh += 1
        return self._request(struct.pack("<f", float(self._fresh)) + self._base[4:])


def client(images: Images, target: Target):  # type: ignore[no-untyped-def]
    async def run(window: Window, result: LoadResult) -> None:
        reader, writer = await asyncio.open_connection(target.host, target.port)
        try:
            while (start := perf_counter()) < window.end:
                writer.write(images.next())
                await writer.drain()
                reply = await read_response(reader)
                record(result, window, start, lambda: None if reply.status == 200 else f"HTTP {reply.status}")
        finally:
            writer.close()
    return run


async def _measure(mode: str, target: Target, images: Images, settings: BenchSettings,
                   server_pid: int) -> list[Summary]:
    await probe(target)
    summaries = []
    for concurrency in settings.concurrency:
        spec = LoadSpec(concurrency, settings.warmup_s, settings.duration_s)
        summaries.append(await measure_point(mode, run_clients(client(images, target), spec), spec, server_pid))
        print("  " + side_by_side.line(COLUMNS, summaries[-1]), flush=True)
    return summaries


def run(settings: BenchSettings) -> list[Summary]:
    summaries: list[Summary] = []
    for mode, extra in ((CACHE_OFF, []), (CACHE_ON, ["--cache-config", f"local,size={CACHE_BYTES}"])):
        with tempfile.TemporaryDirectory(prefix="ferry-bench-cache-") as scratch:
            repository = Path(scratch) / "repo"
            repository.mkdir()
            model = copy_model(MODEL_DIR, repository, dynamic_batching=True)
            config = model / "config.pbtxt"
            config.write_text(config.read_text() + "\nresponse_cache { enable: true }\n")
            with ferry_server(repository, Path(scratch) / "ferry.log", extra_args=extra) as server, \
                    event_loop_runner() as runner:
                images = Images(server.host, server.port, settings.hot, settings.repeat)
                target = Target(server.host, server.port, images.hot[0], OUTPUT_BYTES)
                summaries += runner.run(_measure(mode, target, images, settings, server.pid))
    return summaries


def ratios(summaries: list[Summary]) -> list[dict[str, object]]:
    """Cache on over cache off at each concurrency: throughput, p50 and p99."""
    return side_by_side.ratios(summaries, CACHE_ON, CACHE_OFF)


def main(argv: Sequence[str] | None = None) -> int:
    settings = settings_from_args(argv)
    print(f"ferry serve, cnn with dynamic batching, {settings.repeat:.0%} of requests one of {settings.hot} "
          "hot images", flush=True)
    summaries = run(settings)
    print()
    print_table(COLUMNS, [side_by_side.values(summary) for summary in summaries])
    side_by_side.print_ratios("on / off", ratios(summaries))
    settings.out.parent.mkdir(parents=True, exist_ok=True)
    settings.out.write_text(json.dumps({
        "benchmark": "response_cache",
        "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "model": MODEL_NAME,
        "settings": {"duration_s": settings.duration_s, "warmup_s": settings.warmup_s, "repeat": settings.repeat,
                     "hot": settings.hot, "concurrency": list(settings.concurrency), "cache_bytes": CACHE_BYTES},
        "results": [summary.to_json() for summary in summaries],
        "on_over_off": ratios(summaries),
    }, indent=2, allow_nan=False) + "\n")
    print(f"\nwrote {settings.out}")
    return 1 if any(summary.errors for summary in summaries) else 0


if __name__ == "__main__":
    sys.exit(main())
