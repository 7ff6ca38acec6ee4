"""Counts and durations per model version, kept by one worker process.

``StatsBook`` is an ``Observer``. It holds cumulative numbers only, so any
reader (the Prometheus collector, the heartbeat, the dashboard) derives
rates by difference. Triton's equivalents: success and failure counts,
inference count (rows) and execution count (batches), queue, compute and
request durations, and the pending-request gauge.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from workers.telemetry.histogram import BATCH_BOUNDS, DURATION_BOUNDS, Histogram
from workers.telemetry.timeline import CACHE_HIT, CACHE_MISS, RELEASED, BatchRecord, DeadLetterRecord, Timeline
from workers.telemetry.triton_stats import TritonCounts


def _durations() -> Histogram:
    return Histogram(DURATION_BOUNDS)


@dataclass(slots=True)
class ModelStats:
    success: int = 0
    failures: Counter[str] = field(default_factory=Counter)  # by reason (the error code)
    inferences: int = 0  # rows of successful requests (Triton's inference count)
    executions: int = 0  # batches run (Triton's execution count)
    batch_sizes: Histogram = field(default_factory=lambda: Histogram(BATCH_BOUNDS))
    request: Histogram = field(default_factory=_durations)  # enqueued -> answered
    queue: Histogram = field(default_factory=_durations)  # enqueued -> compute started
    compute: Histogram = field(default_factory=_durations)  # compute of its batch
    triton: TritonCounts = field(default_factory=TritonCounts)  # exact sums for Triton's statistics
    cache_hits: int = 0  # answered from the response cache
    cache_misses: int = 0  # looked up there, computed, kept

    def to_wire(self) -> dict[str, Any]:
        return {
            "success": self.success, "failures": dict(self.failures), "inferences": self.inferences,
            "executions": self.executions,
            "batch_sizes": self.batch_sizes.to_wire(), "request": self.request.to_wire(),
            "queue": self.queue.to_wire(), "compute": self.compute.to_wire(), "triton": self.triton.to_wire(),
            "cache_hits": self.cache_hits, "cache_misses": self.cache_misses,
        }


@dataclass(slots=True)
class DeadLetterStats:
    written: int = 0
    truncated: int = 0  # letters whose payload was cut to their share of the byte bound
    truncated_bytes: int = 0  # payload bytes cut from them
    evicted: int = 0  # letters dropped, oldest first, by the count bound


class StatsBook:
    def __init__(self) -> None:
        self._models: dict[tuple[str, str], ModelStats] = {}
        self.pending: Counter[str] = Counter()  # per model: received, not yet answered (its version may be unknown)
        self.dead_letters = DeadLetterStats()

    def model(self, model: str, version: str) -> ModelStats:
        key = (model, version)
        stats = self._models.get(key)
        if stats is None:
            stats = self._models[key] = ModelStats()
        return stats

    def items(self) -> list[tuple[tuple[str, str], ModelStats]]:
        return list(self._models.items())

    def received(self, timeline: Timeline) -> None:
        self.pending[timeline.model] += 1

    def batch_ran(self, batch: BatchRecord) -> None:
        stats = self.model(batch.model, batch.version)
        stats.executions += 1
        stats.batch_sizes.observe(batch.size)
        stats.triton.batch_ran(batch)

    def finished(self, timeline: Timeline) -> None:
        self.pending[timeline.model] -= 1
        if timeline.outcome == RELEASED:
            return
        stats = self.model(timeline.model, timeline.version)
        stats.triton.finished(timeline)
        if not timeline.succeeded:
            stats.failures[timeline.outcome] += 1
            return
        stats.success += 1
        if timeline.cache == CACHE_HIT:
            stats.cache_hits += 1
            return  # the model did not run: not an inference (as Triton counts it), no queue or compute
        if timeline.cache == CACHE_MISS:
            stats.cache_misses += 1
        stats.inferences += timeline.rows
        start = timeline.enqueued_ns or timeline.received_ns
        if timeline.done_ns and start:
            stats.request.observe(max(0, timeline.done_ns - start) / 1e9)
        if timeline.compute_start_ns and start:
            stats.queue.observe(max(0, timeline.compute_start_ns - start) / 1e9)
        if timeline.compute_end_ns:
            stats.compute.observe(max(0, timeline.compute_end_ns - timeline.compute_start_ns) / 1e9)

    def dead_lettered(self, letter: DeadLetterRecord) -> None:
        counts = self.dead_letters
        counts.written += 1
        counts.evicted += letter.evicted
        if letter.truncated:
            counts.truncated += 1
            counts.truncated_bytes += letter.payload_bytes - letter.kept_bytes

    def to_wire(self) -> dict[str, Any]:
        """Plain values (msgpack or JSON): {"models": {"model/version": stats}, "pending": {model: n}}."""
        return {"models": {f"{model}/{version}": stats.to_wire() for (model, version), stats in self._models.items()},
                "pending": dict(self.pending)}
