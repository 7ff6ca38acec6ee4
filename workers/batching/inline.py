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

A batch's time measured on the thread includes waiting for the GIL to come
back (up to the interpreter's switch interval while the event loop is busy),
so a model that went to the thread under load could look slow there for
ever. Every so often (``probe_every`` times asked, doubling after each probe
that finds the model slow, up to ``probe_every_max``) one batch is computed on
the event loop instead, as a probe: what it takes there is what the model costs.
"""

from __future__ import annotations

import math

INLINE_BELOW_S = 200e-6
_WEIGHT = 0.2  # of the newest batch in the average


class InlineCompute:
    def __init__(self, below_s: float = INLINE_BELOW_S, warmup: int = 8, probe_every: int = 16,
                 probe_every_max: int = 1024) -> None:
        self._below_s = below_s
        self._warmup = warmup
        self._seen = 0
        self._average_s = math.inf
        self._probe_first = self._probe_every = probe_every
        self._probe_max = probe_every_max
        self._asked = 0  # since the last probe

    def inline(self) -> bool:
        if self._seen < self._warmup:
            return False
        if self._average_s < self._below_s:
            return True
        self._asked += 1
        if self._asked < self._probe_every:
            return False
        self._asked = 0
        return True

    def took(self, seconds: float, inline: bool = False) -> None:
        """A batch took ``seconds``; ``inline``: on the event loop."""
        self._seen += 1
        if inline and self._average_s >= self._below_s:  # a probe
            if seconds < self._below_s:
                self._average_s, self._probe_every = seconds, self._probe_first
            else:
                self._probe_every = min(2 * self._probe_every, self._probe_max)
            return
        if math.isinf(self._average_s):
            self._average_s = seconds
        else:
            self._average_s += _WEIGHT * (seconds - self._average_s)
