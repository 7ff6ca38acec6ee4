"""The dynamic batcher's driver: queue, cut, run, and resolve each request.

It is given ``run_batch(items) -> results`` (one result or exception per item,
in order), a ``BatchPolicy``, how many batches may run at once, and a clock.
It knows nothing of transports, envelopes or backends.
"""

from __future__ import annotations

import asyncio
import time
import traceback
from collections.abc import Awaitable, Callable, Hashable, Sequence
from typing import Generic, TypeVar

from workers.batching.forming import BatchPolicy, BatchQueue, Pending
from workers.batching.waking import sleep_until
from workers.errors import ExecutionError, RequestTimeout

T = TypeVar("T")
R = TypeVar("R")

RunBatch = Callable[[Sequence[T]], Awaitable[Sequence["R | BaseException"]]]


class DynamicBatcher(Generic[T, R]):
    def __init__(
        self,
        run_batch: RunBatch[T, R],
        policy: BatchPolicy,
        concurrency: int = 1,
        clock: Callable[[], float] = time.monotonic,
        isolate_failures: bool = True,
    ) -> None:
        self._run_batch = run_batch
        self._queue: BatchQueue[tuple[T, asyncio.Future[R]]] = BatchQueue(policy)
        self._slots = asyncio.Semaphore(concurrency)
        self._clock = clock
        self._isolate = isolate_failures
        self._wakeup = asyncio.Event()
        self._running: set[asyncio.Task[None]] = set()
        self._loop_task: asyncio.Task[None] | None = None
        self.batches_run = 0

    async def start(self) -> None:
        self._loop_task = asyncio.create_task(self._loop(), name="batcher")

    async def aclose(self) -> None:
        """Stop cutting batches, fail what still waits, and finish running ones."""
        if self._loop_task is not None:
            self._loop_task.cancel()
            await asyncio.gather(self._loop_task, return_exceptions=True)
        for pending in self._queue.drain():
            _fail(pending.item[1], ExecutionError("the model is shutting down"))
        await asyncio.gather(*self._running, return_exceptions=True)

    async def submit(
        self,
        item: T,
        rows: int = 1,
        key: Hashable = None,
        priority: int = 0,
        deadline: float | None = None,
    ) -> R:
        future: asyncio.Future[R] = asyncio.get_running_loop().create_future()
        self._queue.add(Pending((item, future), rows, key, self._clock(), priority, deadline))
        self._wakeup.set()
        try:
            return await future
        finally:
            # A failure's traceback holds this frame and the future holds the failure: a cycle
            # that would keep the request's tensors until a full garbage collection.
            del item, future

    @property
    def waiting(self) -> int:
        return len(self._queue)

    async def _loop(self) -> None:
        while True:
            await self._slots.acquire()
            try:
                batch = await self._next_batch()
            except BaseException:
                self._slots.release()
                raise
            task = asyncio.create_task(self._execute(batch))
            del batch  # else this loop holds the last batch's tensors while it waits for the next
            self._running.add(task)
            task.add_done_callback(self._running.discard)

    async def _next_batch(self) -> list[Pending[tuple[T, asyncio.Future[R]]]]:
        while True:
            now = self._clock()
            for late in self._queue.expired(now):
                _fail(late.item[1], RequestTimeout("request timed out in the queue before compute"))
            batch = self._queue.take(now)
            if batch:
                live = [p for p in batch if not p.item[1].done()]
                if live:
                    return live
                continue
            await sleep_until(self._queue.next_due(now), self._wakeup, self._clock)

    async def _execute(self, batch: list[Pending[tuple[T, asyncio.Future[R]]]]) -> None:
        self.batches_run += 1
        try:
            results = await self._results([p.item[0] for p in batch])
        finally:
            # The instance is free: the next batch is cut and started before this one's requests
            # wake, or the model would wait while each of them is answered (measured: 7-11 ms
            # between a CNN's batches of 32, every one of the next batch's requests queued).
            self._slots.release()
            self._wakeup.set()
        try:
            await asyncio.sleep(0)
        finally:
            for pending, result in zip(batch, results):
                future = pending.item[1]
                if isinstance(result, BaseException):
                    _fail(future, result)
                elif not future.done():
                    future.set_result(result)

    async def _results(self, items: list[T]) -> Sequence[R | BaseException]:
        try:
            results = await self._run_batch(items)
        except Exception as exc:
            if self._isolate and len(items) > 1:
                # One bad request must not fail its batch-mates: run each alone.
                return [await self._one(item) for item in items]
            return [exc] * len(items)
        if len(results) != len(items):
            error = ExecutionError(f"batch of {len(items)} requests returned {len(results)} results")
            return [error] * len(items)
        return results

    async def _one(self, item: T) -> R | BaseException:
        try:
            (result,) = await self._run_batch([item])
            return result
        except Exception as exc:
            return exc


def _fail(future: asyncio.Future[R], error: BaseException) -> None:
    # The frames the failure passed through are done; their locals (the batch's items) would
    # otherwise live as long as the error, which every request of a failed batch shares.
    traceback.clear_frames(error.__traceback__)
    if not future.done():
        future.set_exception(error)
