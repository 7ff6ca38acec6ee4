"""Running a decoupled model: 0..N responses for one request, as they come.

The backend's ``infer_stream`` runs on the model's executor thread; each
response it yields crosses to the event loop through a queue, so the worker
can publish it while the model computes the next.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from concurrent.futures import Executor

import numpy as np

from workers.backends.base import StreamingBackend

Tensors = dict[str, np.ndarray]
_DONE = object()


async def stream_outputs(backend: StreamingBackend, inputs: Tensors, executor: Executor) -> AsyncIterator[Tensors]:
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue[object] = asyncio.Queue()

    def produce() -> None:
        try:
            for outputs in backend.infer_stream(inputs):
                loop.call_soon_threadsafe(queue.put_nowait, outputs)
            loop.call_soon_threadsafe(queue.put_nowait, _DONE)
        except BaseException as exc:  # handed to the consumer, which raises it
            loop.call_soon_threadsafe(queue.put_nowait, exc)

    work = loop.run_in_executor(executor, produce)
    try:
        while (item := await queue.get()) is not _DONE:
            if isinstance(item, BaseException):
                raise item
            yield item  # type: ignore[misc]
    finally:
        await work  # the instance is free again only once the model has stopped
