"""A backend instance's batch buffers: requests merged with one copy into memory
that is kept and reused, batch after batch.

``np.concatenate`` allocates a fresh array for every batch; at 64 images of 301 KB
that is 19 MB to allocate, fault in and free per batch. ``BatchBuffers`` keeps one
array per input name and copies each request's rows into a view of it. What the
memory is comes from an allocator: numpy's own by default, page-locked (pinned)
host memory for a GPU instance, whose copies to the device may then run
asynchronously.

A buffer is rewritten by the next batch on the same instance, so whatever the
model returns that still shares memory with it (an identity model returns its
inputs) must be copied before the instance is freed: ``detach``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

import numpy as np

Tensors = Mapping[str, np.ndarray]
Allocate = Callable[[tuple[int, ...], np.dtype], np.ndarray]


def numpy_empty(shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
    return np.empty(shape, dtype)


class BatchBuffers:
    """Owned by one backend instance; never used by two batches at once.

    ``max_rows`` caps how far a buffer grows (the model's ``max_batch_size``);
    below it a buffer grows to the next power of two of the rows it was asked
    for, so a model whose batches are small never holds a full batch's memory.
    ``copy_single`` copies a batch of one request too (into pinned memory, say);
    otherwise that request's own arrays, views on the bytes it arrived in, are used.
    """

    def __init__(self, max_rows: int, allocate: Allocate = numpy_empty, copy_single: bool = False) -> None:
        self._max_rows = max(1, max_rows)
        self._allocate = allocate
        self._copy_single = copy_single
        self._held: dict[str, np.ndarray] = {}
        self.allocations = 0

    def merge(self, requests: Sequence[Tensors]) -> dict[str, np.ndarray]:
        """The requests' inputs concatenated along dimension 0."""
        if len(requests) == 1 and not self._copy_single:
            return dict(requests[0])
        merged: dict[str, np.ndarray] = {}
        for name, first in requests[0].items():
            parts = [request[name] for request in requests]
            if first.dtype.hasobject or first.ndim == 0:
                # BYTES elements are Python objects: nothing to gain from a reused buffer.
                merged[name] = np.concatenate(parts, axis=0) if len(parts) > 1 else first
                continue
            rows = sum(part.shape[0] for part in parts)
            target = self._buffer(name, rows, first)
            offset = 0
            for part in parts:
                target[offset:offset + part.shape[0]] = part
                offset += part.shape[0]
            merged[name] = target
        return merged

    def detach(self, outputs: Tensors) -> dict[str, np.ndarray]:
        """``outputs`` with a copy of any array that may share memory with a buffer."""
        held = list(self._held.values())
        return {
            name: array.copy() if any(np.may_share_memory(array, buffer) for buffer in held) else array
            for name, array in outputs.items()
        }

    def _buffer(self, name: str, rows: int, like: np.ndarray) -> np.ndarray:
        held = self._held.get(name)
        if held is None or held.dtype != like.dtype or held.shape[1:] != like.shape[1:] or held.shape[0] < rows:
            capacity = max(rows, min(1 << max(rows - 1, 0).bit_length(), self._max_rows))
            held = self._allocate((capacity, *like.shape[1:]), like.dtype)
            self._held[name] = held
            self.allocations += 1
        return held[:rows]
