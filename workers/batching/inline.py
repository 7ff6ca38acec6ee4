"""Whether a batch is computed on the event loop or handed to its instance's thread.

Handing a batch to a thread and back costs tens of microseconds of CPU: a
lock, a wake-up, and the GIL passed back and forth between two threads. A
batch that takes longer than that belongs on the thread, so the event loop
keeps serving meanwhile. For a model whose batches take less (an identity,
a small tree, a lookup table), the hand-off is most of the work: it is
computed right on the event loop instead.

``InlineCompute`` decides from a moving average of the last batches' compute
time, learnt on the thread first (``warmup`` batches). One slow batch lifts
the average above the bound at once, and the next batches go to the thread
until they have brought it down again.
"""

from __future__ import annotations

import math

INLINE_BELOW_S = 200e-6
_WEIGHT = 0.2  # of the newest batch in the average


class InlineCompute:
    def __init__(self, below_s: float = INLINE_BELOW_S, warmup: int = 8) -> None:
        self._below_s = below_s
        self._warmup = warmup
        self._seen = 0
        self._average_s = math.inf

    def inline(self) -> bool:
        return self._seen >= self._warmup and self._average_s < self._below_s

    def took(self, seconds: float) -> None:
        self._seen += 1
        if math.isinf(self._average_s):
            self._average_s = seconds
        else:
            self._average_s += _WEIGHT * (seconds - self._average_s)
