import pytest

from workers.batching.forming import BatchPolicy, BatchQueue, Pending


def queue_with(policy: BatchPolicy, rows: list[int], arrived: float = 0.0, key: str = "k") -> BatchQueue[int]:
    queue: BatchQueue[int] = BatchQueue(policy)
    for index, count in enumerate(rows):
        queue.add(Pending(item=index, rows=count, key=key, arrived=arrived))
    return queue


def items(batch: list[Pending[int]] | None) -> list[int] | None:
    return None if batch is None else [p.item for p in batch]


@pytest.mark.parametrize(
    ("policy", "rows", "now", "expected"),
    [
        # no batching: one request at a time
        (BatchPolicy(0), [1, 1, 1], 0.0, [0]),
        # no delay, no preferred sizes: take everything that fits
        (BatchPolicy(8), [1, 2, 3], 0.0, [0, 1, 2]),
        # full: cut at max_batch_size even before the delay
        (BatchPolicy(4, max_queue_delay_s=1.0), [2, 2, 1], 0.0, [0, 1]),
        # not full, delay not over: wait
        (BatchPolicy(8, max_queue_delay_s=1.0), [1, 1], 0.5, None),
        # delay over: send what there is
        (BatchPolicy(8, max_queue_delay_s=1.0), [1, 1], 1.0, [0, 1]),
        # a preferred size reached: cut it without waiting
        (BatchPolicy(8, preferred_sizes=(2, 4), max_queue_delay_s=1.0), [1, 1, 1], 0.1, [0, 1]),
        (BatchPolicy(8, preferred_sizes=(2, 4), max_queue_delay_s=1.0), [1, 1, 1, 1, 1], 0.1, [0, 1, 2, 3]),
        # a preferred size not reachable exactly: wait for the delay
        (BatchPolicy(8, preferred_sizes=(4,), max_queue_delay_s=1.0), [3, 2], 0.1, None),
    ],
)
def test_take_cuts_by_size_delay_and_preferred_size(policy, rows, now, expected):
    assert items(queue_with(policy, rows).take(now)) == expected


def test_only_requests_with_the_same_key_share_a_batch():
    queue: BatchQueue[str] = BatchQueue(BatchPolicy(8))
    for item, key in [("a1", "a"), ("b1", "b"), ("a2", "a")]:
        queue.add(Pending(item=item, rows=1, key=key, arrived=0.0))
    assert [p.item for p in queue.take(0.0)] == ["a1", "a2"]
    assert [p.item for p in queue.take(0.0)] == ["b1"]
    assert queue.take(0.0) is None


def test_higher_priority_level_goes_first():
    queue: BatchQueue[str] = BatchQueue(BatchPolicy(1))
    queue.add(Pending(item="low", rows=1, key=None, arrived=0.0, priority=2))
    queue.add(Pending(item="high", rows=1, key=None, arrived=0.1, priority=1))
    assert items(queue.take(1.0)) == ["high"]
    assert items(queue.take(1.0)) == ["low"]


def test_expired_requests_are_removed_before_cutting():
    queue: BatchQueue[str] = BatchQueue(BatchPolicy(8))
    queue.add(Pending(item="late", rows=1, key=None, arrived=0.0, deadline=0.5))
    queue.add(Pending(item="fine", rows=1, key=None, arrived=0.0, deadline=5.0))
    assert [p.item for p in queue.expired(1.0)] == ["late"]
    assert items(queue.take(1.0)) == ["fine"]


def test_next_due_is_the_oldest_arrival_plus_the_delay():
    queue = queue_with(BatchPolicy(8, max_queue_delay_s=0.25), [1], arrived=2.0)
    assert queue.next_due(2.0) == pytest.approx(2.25)
    assert BatchQueue(BatchPolicy(8)).next_due(0.0) is None
