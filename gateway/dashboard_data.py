"""What the dashboard's numbers are made of: pure functions over stats snapshots.

Workers keep cumulative counts only (``StatsBook.to_wire()``). A ``Sample``
holds every worker's snapshot at one moment; the numbers for a window are
differences between a worker's newest snapshot and its snapshot at the
window's start, taken per worker (each over its own clock, so a heartbeat's
age does not skew its rate) and then summed across workers:

    rate(model) = sum over workers of (count_new - count_old) / (taken_new - taken_old)

A worker that joined during the window counts from its first snapshot.
Latency quantiles and the batch-size distribution come from the summed
histogram differences. A worker whose counts went down restarted: it is left
out of that window rather than counted negative.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from workers.telemetry.histogram import BATCH_BOUNDS, DURATION_BOUNDS, Histogram
from workers.telemetry.wire import WorkerStats


@dataclass(frozen=True, slots=True)
class WorkerSnapshot:
    taken_s: float  # the worker's wall clock when it read its stats
    stats: WorkerStats


@dataclass(frozen=True, slots=True)
class Sample:
    at_s: float  # the gateway's wall clock when it took the sample
    workers: Mapping[str, WorkerSnapshot]


@dataclass(slots=True)
class ModelDelta:
    """What one model (all its versions) did on one worker between two snapshots."""

    requests: int = 0  # answered: successes and failures
    inferences: int = 0  # rows of the successful ones
    batch_sizes: list[int] = field(default_factory=lambda: [0] * (len(BATCH_BOUNDS) + 1))
    latency: list[int] = field(default_factory=lambda: [0] * (len(DURATION_BOUNDS) + 1))


@dataclass(slots=True)
class ModelWindow:
    """One model's numbers over a window, summed across workers."""

    requests_per_s: float = 0.0
    inferences_per_s: float = 0.0
    batch_sizes: list[int] = field(default_factory=lambda: [0] * (len(BATCH_BOUNDS) + 1))
    latency: list[int] = field(default_factory=lambda: [0] * (len(DURATION_BOUNDS) + 1))

    def add(self, delta: ModelDelta, seconds: float) -> None:
        self.requests_per_s += delta.requests / seconds
        self.inferences_per_s += delta.inferences / seconds
        _add_into(self.batch_sizes, delta.batch_sizes)
        _add_into(self.latency, delta.latency)

    def merge(self, other: ModelWindow) -> None:
        self.requests_per_s += other.requests_per_s
        self.inferences_per_s += other.inferences_per_s
        _add_into(self.batch_sizes, other.batch_sizes)
        _add_into(self.latency, other.latency)

    def latency_ms(self, q: float) -> float | None:
        """The q-quantile of request latency, or None with no request in the window."""
        count = sum(self.latency)
        if count == 0:
            return None
        return Histogram(DURATION_BOUNDS, list(self.latency), 0.0, count).quantile(q) * 1000

    def to_json(self) -> dict[str, Any]:
        return {"requests_per_s": self.requests_per_s, "inferences_per_s": self.inferences_per_s,
                "p50_ms": self.latency_ms(0.5), "p99_ms": self.latency_ms(0.99),
                "batch_sizes": batch_buckets(self.batch_sizes)}


def batch_buckets(counts: list[int]) -> list[dict[str, Any]]:
    """Bars for the batch-size chart: ``le`` is the bucket's upper bound (None: above the last)."""
    bounds: list[int | None] = [*BATCH_BOUNDS, None]
    return [{"le": bound, "count": count} for bound, count in zip(bounds, counts)]


def model_deltas(old: WorkerStats, new: WorkerStats) -> dict[str, ModelDelta] | None:
    """Per model, what happened between two snapshots of one worker; None if it restarted."""
    out: dict[str, ModelDelta] = {}
    before = old["models"]
    for key, now in new["models"].items():
        then = before.get(key)
        delta = _version_delta(then, now) if then is not None else _version_delta(_ZERO, now)
        if delta is None:
            return None
        _merge(out.setdefault(key.rsplit("/", 1)[0], ModelDelta()), delta)
    if any(key not in new["models"] for key in before):
        return None  # a restarted worker starts with an empty book
    return out


def worker_windows(history: Sequence[Sample], since_s: float) -> dict[str, dict[str, ModelWindow]]:
    """Per worker and model, the rates and histograms from ``since_s`` to the
    newest sample of ``history`` (oldest first)."""
    out: dict[str, dict[str, ModelWindow]] = {}
    for worker, snap in history[-1].workers.items():
        before = _snapshot_at(history, worker, since_s)
        if before is None or snap.taken_s <= before.taken_s:
            continue
        deltas = model_deltas(before.stats, snap.stats)
        if deltas is None:
            continue
        models = out[worker] = {}
        for model, delta in deltas.items():
            models.setdefault(model, ModelWindow()).add(delta, snap.taken_s - before.taken_s)
    return out


def window(history: Sequence[Sample], since_s: float) -> dict[str, ModelWindow]:
    """Per model, the rates and histograms from ``since_s`` to the newest
    sample, summed across workers."""
    out: dict[str, ModelWindow] = {}
    for models in worker_windows(history, since_s).values():
        for model, numbers in models.items():
            out.setdefault(model, ModelWindow()).merge(numbers)
    return out


def pending(sample: Sample) -> dict[str, int]:
    """Requests received and not yet answered, per model, summed across workers."""
    out: dict[str, int] = {}
    for snap in sample.workers.values():
        for model, count in snap.stats.get("pending", {}).items():
            out[model] = out.get(model, 0) + max(0, count)
    return out


def _snapshot_at(history: Sequence[Sample], worker: str, since_s: float) -> WorkerSnapshot | None:
    """The worker's last snapshot taken at or before ``since_s``, else its first one."""
    found = None
    for sample in history:
        snap = sample.workers.get(worker)
        if snap is None:
            continue
        if found is None or sample.at_s <= since_s:
            found = snap
        if sample.at_s > since_s:
            break
    return found


_ZERO: dict[str, Any] = {"success": 0, "failures": {}, "inferences": 0,
                         "batch_sizes": {"counts": [0] * (len(BATCH_BOUNDS) + 1)},
                         "request": {"counts": [0] * (len(DURATION_BOUNDS) + 1)}}


def _version_delta(then: Mapping[str, Any], now: Mapping[str, Any]) -> ModelDelta | None:
    requests = [_requests(now) - _requests(then), now["inferences"] - then["inferences"]]
    batches = _diff(now["batch_sizes"]["counts"], then["batch_sizes"]["counts"])
    latency = _diff(now["request"]["counts"], then["request"]["counts"])
    if min(requests) < 0 or min(batches) < 0 or min(latency) < 0:
        return None
    return ModelDelta(requests[0], requests[1], batches, latency)


def _requests(stats: Mapping[str, Any]) -> int:
    return int(stats["success"]) + sum(stats["failures"].values())


def _diff(now: list[int], then: list[int]) -> list[int]:
    return [a - b for a, b in zip(now, then)]


def _merge(into: ModelDelta, delta: ModelDelta) -> None:
    into.requests += delta.requests
    into.inferences += delta.inferences
    _add_into(into.batch_sizes, delta.batch_sizes)
    _add_into(into.latency, delta.latency)


def _add_into(into: list[int], more: list[int]) -> None:
    for i, value in enumerate(more):
        into[i] += value
