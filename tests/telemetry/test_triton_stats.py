"""The exact sums behind Triton's statistics, and their check on the way in."""

from __future__ import annotations

import copy

import pytest

from workers.telemetry.stats import StatsBook
from workers.telemetry.timeline import BatchRecord, Timeline
from workers.telemetry.triton_stats import MAX_BATCH_SIZES, TritonCounts, valid_wire
from workers.telemetry.wire import parse_stats

MS = 1_000_000


def ran(book: StatsBook, batch: BatchRecord, *outcomes: str) -> None:
    for index, outcome in enumerate(outcomes):
        timeline = Timeline(f"{batch.batch_id}-{index}", "m", "1", "w", enqueued_ns=1_000 * MS,
                            received_ns=1_001 * MS)
        book.received(timeline)
        timeline.ran_in(batch)
        timeline.outcome, timeline.done_ns = outcome, batch.end_ns + MS
        book.finished(timeline)


def test_each_request_of_a_batch_counts_the_batchs_compute_and_the_batch_counts_once():
    book = StatsBook()
    batch = BatchRecord("m", "1", "b1", 2, 2, 1_010 * MS, 1_020 * MS, input_ns=100, infer_ns=9_000, output_ns=50)
    book.batch_ran(batch)
    ran(book, batch, "success", "success")
    counts = book.model("m", "1").triton
    assert counts.durations["success"] == [2, 2 * 21 * MS]
    assert counts.durations["queue"] == [2, 2 * 10 * MS]
    assert counts.durations["compute_infer"] == [2, 18_000]
    assert counts.durations["compute_input"] == [2, 200] and counts.durations["compute_output"] == [2, 100]
    assert counts.batches == {2: [1, 100, 9_000, 50]}
    assert counts.last_ms == 1_021


def test_a_failure_counts_its_time_and_no_compute():
    book = StatsBook()
    batch = BatchRecord("m", "1", "b1", 1, 1, 1_010 * MS, 1_020 * MS, 1, 2, 3)
    ran(book, batch, "invalid_argument")
    counts = book.model("m", "1").triton
    assert counts.durations["fail"] == [1, 21 * MS]
    assert counts.durations["success"] == counts.durations["compute_infer"] == [0, 0]


def test_batch_sizes_are_bounded():
    counts = TritonCounts()
    for size in range(MAX_BATCH_SIZES + 10):
        counts.batch_ran(BatchRecord("m", "1", "b", size + 1, 1, 0, 1))
    assert len(counts.batches) == MAX_BATCH_SIZES


def wire() -> dict:
    counts = TritonCounts()
    counts.batch_ran(BatchRecord("m", "1", "b", 4, 2, 0, 1, 1, 2, 3))
    return counts.to_wire()


@pytest.mark.parametrize("spoil", [
    lambda w: w.pop("durations"),
    lambda w: w["durations"].pop("fail"),
    lambda w: w["durations"].__setitem__("success", [1, -5]),
    lambda w: w["durations"].__setitem__("queue", [1, 2, 3]),
    lambda w: w["batches"].append([1, 2, 3]),
    lambda w: w["batches"].append([1, 2, 3, 4, True]),
    lambda w: w.__setitem__("batches", [[1, 1, 1, 1, 1]] * (MAX_BATCH_SIZES + 1)),
    lambda w: w.__setitem__("last_ms", "now"),
])
def test_counts_of_the_wrong_shape_are_refused(spoil):
    assert valid_wire(wire())
    bad = copy.deepcopy(wire())
    spoil(bad)
    assert not valid_wire(bad)


def test_a_heartbeat_with_bad_triton_counts_loses_its_stats_and_one_without_them_keeps_them():
    book = StatsBook()
    book.batch_ran(BatchRecord("m", "1", "b", 1, 1, 0, 1))
    raw = book.to_wire()
    assert parse_stats(raw) is not None
    older = copy.deepcopy(raw)
    del older["models"]["m/1"]["triton"]
    assert parse_stats(older) is not None
    raw["models"]["m/1"]["triton"]["last_ms"] = -1
    assert parse_stats(raw) is None
