"""Checking a ``StatsBook.to_wire()`` that came from another process.

A heartbeat carries its worker's stats to every gateway; what arrives is
untrusted, so ``parse_stats`` keeps it only when every field has the shape
``StatsBook`` writes (histograms with one count per bucket, no negative
counts, at most ``MAX_MODEL_VERSIONS`` entries). Anything else is ``None``:
the heartbeat still counts, its numbers do not.
"""

from __future__ import annotations

from typing import Any

from workers.telemetry.histogram import BATCH_BOUNDS, DURATION_BOUNDS
from workers.telemetry.triton_stats import valid_wire

WorkerStats = dict[str, Any]  # StatsBook.to_wire(): {"models": {"model/version": ...}, "pending": {...}}

MAX_MODEL_VERSIONS = 1024
COUNTERS = ("success", "inferences", "executions")
HISTOGRAMS = {"batch_sizes": BATCH_BOUNDS, "request": DURATION_BOUNDS, "queue": DURATION_BOUNDS,
              "compute": DURATION_BOUNDS}


def parse_stats(raw: object) -> WorkerStats | None:
    if not isinstance(raw, dict):
        return None
    models, pending = raw.get("models"), raw.get("pending", {})
    if not isinstance(models, dict) or len(models) > MAX_MODEL_VERSIONS:
        return None
    if not _counts_by_name(pending, allow_negative=True):
        return None
    if not all(isinstance(key, str) and "/" in key and _model_stats(value) for key, value in models.items()):
        return None
    return {"models": models, "pending": pending}


def _model_stats(raw: object) -> bool:
    if not isinstance(raw, dict):
        return False
    if not all(_count(raw.get(name)) for name in COUNTERS):
        return False
    if not _counts_by_name(raw.get("failures", {})):
        return False
    if "triton" in raw and not valid_wire(raw["triton"]):  # absent from a worker older than it
        return False
    return all(_histogram(raw.get(name), bounds) for name, bounds in HISTOGRAMS.items())


def _histogram(raw: object, bounds: tuple[float, ...]) -> bool:
    if not isinstance(raw, dict):
        return False
    counts = raw.get("counts")
    if not isinstance(counts, list) or len(counts) != len(bounds) + 1 or not all(map(_count, counts)):
        return False
    total = raw.get("sum")
    return _count(raw.get("count")) and isinstance(total, (int, float)) and not isinstance(total, bool)


def _counts_by_name(raw: object, allow_negative: bool = False) -> bool:
    if not isinstance(raw, dict) or len(raw) > MAX_MODEL_VERSIONS:
        return False
    return all(isinstance(key, str) and _count(value, allow_negative) for key, value in raw.items())


def _count(value: object, allow_negative: bool = False) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and (allow_negative or value >= 0)
