"""The sequence table cuts batches by strategy: pure, driven by explicit times."""

from __future__ import annotations

from workers.sequences.table import SequencePolicy, SequenceTable, Step


def table(**policy: object) -> SequenceTable[str]:
    return SequenceTable(SequencePolicy(**policy))  # type: ignore[arg-type]


def step(table_: SequenceTable[str], sequence_id: int, at: float, key: object = "k", start: bool = False) -> None:
    if sequence_id not in table_:
        table_.activate(sequence_id, at)
    table_.add(Step(sequence_id, f"{sequence_id}@{at}", key, at))


def rows(batch: object) -> list[object]:
    return [None if row is None else row.sequence_id for row in batch.rows]  # type: ignore[attr-defined]


def test_direct_rows_follow_slots_and_pad_the_gaps() -> None:
    t = table(strategy="direct", rows=4)
    for sequence_id in (10, 11, 12):
        step(t, sequence_id, 0.0)
    first = t.take(0.0)
    assert rows(first) == [10, 11, 12]
    t.finish(first, 0.1)
    step(t, 12, 0.2)  # only the third slot has work: rows 0 and 1 are padding
    assert rows(t.take(0.2)) == [None, None, 12]


def test_direct_backlog_waits_for_a_slot() -> None:
    t = table(strategy="direct", rows=1, instances=2)
    for sequence_id in (1, 2, 3):
        step(t, sequence_id, 0.0)
    a, b = t.take(0.0), t.take(0.0)
    assert {a.instance, b.instance} == {0, 1} and sorted(rows(a) + rows(b)) == [1, 2]
    assert t.take(0.0) is None  # sequence 3 has no slot and both instances are busy
    t.finish(a, 0.1)
    t.release(rows(a)[0])
    assert rows(t.take(0.1)) == [3]


def test_a_sequence_runs_one_step_at_a_time_in_order() -> None:
    t = table(strategy="oldest", rows=8)
    step(t, 1, 0.0)
    step(t, 1, 0.1)
    first = t.take(0.2)
    assert [s.item for s in first.steps] == ["1@0.0"]
    assert t.take(0.2) is None  # its next step waits for the first
    t.finish(first, 0.3)
    assert [s.item for s in t.take(0.3).steps] == ["1@0.1"]


def test_oldest_waits_for_a_preferred_size_until_the_delay() -> None:
    t = table(strategy="oldest", rows=8, preferred_sizes=(4,), delay_s=1.0, instances=2)
    for sequence_id in range(1, 4):
        step(t, sequence_id, 0.0)
    step(t, 9, 0.0)
    t.get(9).running = True  # an active sequence not yet ready: the batch may still grow
    assert t.take(0.5) is None
    assert t.next_due(0.5) == 1.0
    assert sorted(rows(t.take(1.0))) == [1, 2, 3]


def test_oldest_cuts_at_a_preferred_size() -> None:
    t = table(strategy="oldest", rows=8, preferred_sizes=(2,), delay_s=5.0)
    for sequence_id in range(1, 4):
        step(t, sequence_id, float(sequence_id))
    step(t, 9, 0.0)
    t.get(9).running = True
    assert rows(t.take(3.0)) == [1, 2]


def test_oldest_caps_candidates_and_batches_only_equal_keys() -> None:
    t = table(strategy="oldest", rows=8, max_candidates=2)
    step(t, 1, 0.0, key="a")
    step(t, 2, 0.1, key="b")
    step(t, 3, 0.2, key="a")  # not a candidate: two older sequences are active
    assert rows(t.take(0.3)) == [1]


def test_idle_sequences_expire_but_not_while_work_waits() -> None:
    t = table(strategy="oldest", rows=2, idle_s=1.0)
    step(t, 1, 0.0)
    step(t, 2, 0.0)
    batch = t.take(0.0)
    t.finish(batch, 0.5)
    assert t.expire(1.2) == []
    assert sorted(t.expire(1.5)) == [1, 2]
    assert len(t) == 0


def test_direct_spreads_sequences_over_instances() -> None:
    t = table(strategy="direct", rows=4, instances=2)
    for sequence_id in (1, 2, 3):
        step(t, sequence_id, 0.0)
    assert [t.get(s).slot for s in (1, 2, 3)] == [0, 4, 1]


def test_a_step_waiting_for_its_busy_instance_is_not_due_until_that_batch_ends() -> None:
    """Else the driver's loop, told the step is already due, would spin until the instance is free."""
    for strategy in ("direct", "oldest"):
        t = table(strategy=strategy, rows=2, instances=1, idle_s=10.0)
        step(t, 1, 0.0)
        running = t.take(0.0)
        step(t, 2, 0.1)
        assert t.take(0.2) is None
        assert t.next_due(0.2) is None, strategy  # nothing, until the running batch ends
        t.finish(running, 0.3)
        assert t.next_due(0.3) == 0.1, strategy
        assert rows(t.take(0.3)) == ([None, 2] if strategy == "direct" else [2])
