import asyncio
import gc
import weakref

import pytest

from workers.batching.driver import DynamicBatcher
from workers.batching.forming import BatchPolicy
from workers.errors import ExecutionError, RequestTimeout


class Recorder:
    """A run_batch that doubles numbers, records batch sizes, and fails on negatives."""

    def __init__(self, delay: float = 0.0) -> None:
        self.batches: list[list[int]] = []
        self.delay = delay

    async def __call__(self, items):
        self.batches.append(list(items))
        await asyncio.sleep(self.delay)
        if any(i < 0 for i in items):
            raise ValueError(f"negative input in {list(items)}")
        return [i * 2 for i in items]


async def test_concurrent_requests_are_batched_and_each_gets_its_result():
    run = Recorder(delay=0.01)
    batcher = DynamicBatcher(run, BatchPolicy(8, max_queue_delay_s=0.005))
    await batcher.start()
    results = await asyncio.gather(*(batcher.submit(i) for i in range(20)))
    await batcher.aclose()
    assert results == [i * 2 for i in range(20)]
    assert max(len(b) for b in run.batches) == 8
    assert sum(len(b) for b in run.batches) == 20


async def test_a_failing_request_fails_alone_and_its_batch_mates_succeed():
    run = Recorder()
    batcher = DynamicBatcher(run, BatchPolicy(8, max_queue_delay_s=0.01))
    await batcher.start()
    results = await asyncio.gather(*(batcher.submit(i) for i in [1, 2, -3, 4]), return_exceptions=True)
    await batcher.aclose()
    assert results[:2] == [2, 4] and results[3] == 8
    assert isinstance(results[2], ValueError)
    assert run.batches[0] == [1, 2, -3, 4]


async def test_instances_run_batches_concurrently():
    running = 0
    peak = 0

    async def run(items):
        nonlocal running, peak
        running += 1
        peak = max(peak, running)
        await asyncio.sleep(0.02)
        running -= 1
        return items

    batcher = DynamicBatcher(run, BatchPolicy(0), concurrency=3)
    await batcher.start()
    await asyncio.gather(*(batcher.submit(i) for i in range(6)))
    await batcher.aclose()
    assert peak == 3


async def test_the_next_batch_starts_before_the_requests_of_the_last_one_wake():
    # With the instance free and a batch's worth queued, the model must not wait while each
    # request of the batch that just ran is answered.
    events: list[str] = []
    computing = asyncio.Event()

    async def run(items):
        events.append(f"start {list(items)}")
        if items[0] == 0:
            await computing.wait()
        return list(items)

    async def request(value: int) -> None:
        await batcher.submit(value)
        events.append(f"answered {value}")

    batcher = DynamicBatcher(run, BatchPolicy(2))
    await batcher.start()
    first = [asyncio.create_task(request(v)) for v in (0, 1)]
    await asyncio.sleep(0.01)  # the first batch is running
    second = [asyncio.create_task(request(v)) for v in (2, 3)]
    await asyncio.sleep(0.01)  # and the second one queued
    computing.set()
    await asyncio.gather(*first, *second)
    await batcher.aclose()
    assert events[:3] == ["start [0, 1]", "start [2, 3]", "answered 0"], events


async def test_a_request_past_its_deadline_never_reaches_the_model():
    run = Recorder(delay=0.05)
    batcher = DynamicBatcher(run, BatchPolicy(0), concurrency=1)
    await batcher.start()
    loop = asyncio.get_running_loop()
    first = asyncio.create_task(batcher.submit(1))
    await asyncio.sleep(0.01)
    late = batcher.submit(2, deadline=loop.time() + 0.01)
    with pytest.raises(RequestTimeout):
        await late
    assert await first == 2
    await batcher.aclose()
    assert run.batches == [[1]]


async def test_a_result_count_mismatch_fails_the_whole_batch_clearly():
    async def short(items):
        return items[:-1]

    batcher = DynamicBatcher(short, BatchPolicy(4, max_queue_delay_s=0.01), isolate_failures=False)
    await batcher.start()
    results = await asyncio.gather(batcher.submit(1), batcher.submit(2), return_exceptions=True)
    await batcher.aclose()
    assert all(isinstance(r, ExecutionError) and "returned 1 results" in str(r) for r in results)


class Tensor:
    """An item a weak reference can follow."""

    def __init__(self, value: int) -> None:
        self.value = value


async def test_a_failed_request_is_freed_without_waiting_for_the_garbage_collector():
    async def fail(items):
        raise ValueError("the model raised")

    batcher = DynamicBatcher(fail, BatchPolicy(4, max_queue_delay_s=0.001))
    await batcher.start()
    item = Tensor(1)
    freed = weakref.ref(item)
    gc.disable()
    try:
        try:
            await batcher.submit(item)
        except ValueError as exc:
            assert "the model raised" in str(exc)  # and then it is dropped, as the worker drops it
        del item
        assert freed() is None, "the request outlived its failure"
    finally:
        gc.enable()
        await batcher.aclose()
