"""The counts behind Triton's statistics extension, kept per model version.

Triton reports, for each model version, a count and a sum of nanoseconds for
successful requests, failed ones, time queued, and the three parts of compute
(inputs in, the model run, outputs out), and the same three parts per batch
size. Sums here are exact integers, so what the gateway adds up over the
fleet (``gateway.statistics``) is exact too; the Prometheus histograms beside
them (``workers.telemetry.stats``) only bucket.

A request's compute parts are its batch's: every request of a batch of eight
adds the batch's whole merge, run and split time, as in Triton. A response
cache hit counts as a success and a ``cache_hit`` (its lookup time), nothing
else; a miss adds a ``cache_miss`` (lookup and insertion) to the rest.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from workers.telemetry.timeline import CACHE_HIT, CACHE_MISS, BatchRecord, Timeline

DURATIONS = ("success", "fail", "queue", "compute_input", "compute_infer", "compute_output", "cache_hit",
             "cache_miss")
MAX_BATCH_SIZES = 4096  # distinct batch sizes a worker may report for one model version


def _zeroes() -> dict[str, list[int]]:
    return {name: [0, 0] for name in DURATIONS}


@dataclass(slots=True)
class TritonCounts:
    durations: dict[str, list[int]] = field(default_factory=_zeroes)  # name -> [count, ns]
    batches: dict[int, list[int]] = field(default_factory=dict)  # rows -> [executions, input, infer, output ns]
    last_ms: int = 0  # wall clock of the last request answered, in ms since the epoch

    def batch_ran(self, batch: BatchRecord) -> None:
        row = self.batches.get(batch.size)
        if row is None:
            if len(self.batches) >= MAX_BATCH_SIZES:
                return
            row = self.batches[batch.size] = [0, 0, 0, 0]
        row[0] += 1
        row[1] += batch.input_ns
        row[2] += batch.infer_ns
        row[3] += batch.output_ns

    def finished(self, timeline: Timeline) -> None:
        start = timeline.enqueued_ns or timeline.received_ns
        took = max(0, timeline.done_ns - start) if timeline.done_ns and start else 0
        self.last_ms = max(self.last_ms, timeline.done_ns // 1_000_000)
        if not timeline.succeeded:
            self._add("fail", took)
            return
        self._add("success", took)
        if timeline.cache == CACHE_HIT:
            self._add("cache_hit", timeline.cache_ns)
            return  # no queue or compute: the model did not run (nor does Triton count them)
        if timeline.cache == CACHE_MISS:
            self._add("cache_miss", timeline.cache_ns)
        if timeline.compute_start_ns and start:
            self._add("queue", max(0, timeline.compute_start_ns - start))
        if timeline.batch_id:
            self._add("compute_input", timeline.input_ns)
            self._add("compute_infer", timeline.infer_ns)
            self._add("compute_output", timeline.output_ns)

    def _add(self, name: str, ns: int) -> None:
        counted = self.durations[name]
        counted[0] += 1
        counted[1] += ns

    def to_wire(self) -> dict[str, Any]:
        return {"durations": {name: list(pair) for name, pair in self.durations.items()},
                "batches": [[size, *row] for size, row in sorted(self.batches.items())],
                "last_ms": self.last_ms}


def valid_wire(raw: object) -> bool:
    """Whether ``raw`` has the shape ``TritonCounts.to_wire`` writes (from an untrusted heartbeat)."""
    if not isinstance(raw, dict):
        return False
    durations, batches = raw.get("durations"), raw.get("batches")
    if not isinstance(durations, dict) or set(durations) != set(DURATIONS):
        return False
    if not all(_counts(pair, 2) for pair in durations.values()):
        return False
    if not isinstance(batches, list) or len(batches) > MAX_BATCH_SIZES:
        return False
    return all(_counts(row, 5) for row in batches) and _counts([raw.get("last_ms")], 1)


def _counts(value: object, length: int) -> bool:
    return (isinstance(value, list) and len(value) == length
            and all(isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in value))
