"""Summaries of latency samples: throughput and percentiles, nothing else."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class Summary:
    mode: str
    point: str          # "batch 8" or "concurrency 64"
    images_per_s: float
    p50_ms: float | None          # None when no call completed
    p99_ms: float | None
    calls: int
    errors: int = 0
    ratio_to_best_ort: float | None = None
    compute_cores: float | None = None   # cores busy in the process running the model
    client_cores: float | None = None    # cores busy in the load generator

    @property
    def compute_ms_per_image(self) -> float | None:
        if self.compute_cores is None or self.images_per_s == 0:
            return None
        return self.compute_cores * 1e3 / self.images_per_s

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "compute_ms_per_image": self.compute_ms_per_image}


def percentile(sorted_values: Sequence[float], fraction: float) -> float | None:
    """Nearest-rank percentile of already sorted values; None when there are none."""
    if not sorted_values:
        return None
    rank = max(1, math.ceil(fraction * len(sorted_values)))
    return sorted_values[rank - 1]


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else seconds * 1e3


def summarize(mode: str, point: str, latencies_s: Sequence[float], images: int,
              elapsed_s: float, errors: int = 0, compute_cores: float | None = None,
              client_cores: float | None = None) -> Summary:
    ordered = sorted(latencies_s)
    return Summary(
        mode=mode,
        point=point,
        images_per_s=images / elapsed_s if elapsed_s > 0 else 0.0,
        p50_ms=_ms(percentile(ordered, 0.50)),
        p99_ms=_ms(percentile(ordered, 0.99)),
        calls=len(ordered),
        errors=errors,
        compute_cores=compute_cores,
        client_cores=client_cores,
    )


def int_list(text: str) -> tuple[int, ...]:
    """A command-line list of positive integers: ``1,16,64`` or ``1 16 64``."""
    import argparse

    values = tuple(int(part) for part in text.replace(" ", ",").split(",") if part)
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"expected positive integers, got {text!r}")
    return values
