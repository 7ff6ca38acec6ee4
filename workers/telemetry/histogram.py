"""A fixed-bucket histogram: cheap to observe, exact to export, and able to
estimate a quantile the way Prometheus's ``histogram_quantile`` does."""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field
from typing import Any

# Seconds, from half a millisecond to a minute.
DURATION_BOUNDS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
# Rows in a batch.
BATCH_BOUNDS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)


@dataclass(slots=True)
class Histogram:
    bounds: tuple[float, ...]
    counts: list[int] = field(default_factory=list)  # per bucket, the last one is +Inf
    total: float = 0.0
    count: int = 0

    def __post_init__(self) -> None:
        if not self.counts:
            self.counts = [0] * (len(self.bounds) + 1)

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.bounds, value)] += 1
        self.total += value
        self.count += 1

    def cumulative(self) -> list[tuple[float, int]]:
        """(upper bound, observations at or below it), ending with +Inf."""
        running, out = 0, []
        for bound, count in zip((*self.bounds, float("inf")), self.counts):
            running += count
            out.append((bound, running))
        return out

    def quantile(self, q: float) -> float:
        """Linear interpolation inside the bucket holding the q-th observation
        (0.0 when empty; the highest finite bound when it falls in +Inf)."""
        if self.count == 0:
            return 0.0
        rank = q * self.count
        lower = 0.0
        for (bound, seen), count in zip(self.cumulative(), self.counts):
            if seen >= rank and count:
                if bound == float("inf"):
                    return float(self.bounds[-1])
                return lower + (bound - lower) * (rank - (seen - count)) / count
            lower = bound if bound != float("inf") else lower
        return float(self.bounds[-1])

    def to_wire(self) -> dict[str, Any]:
        return {"counts": list(self.counts), "sum": self.total, "count": self.count}
