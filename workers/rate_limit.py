"""Triton's rate limiter: model instances run only when the resources they declare are free.

A model's ``instance_group { rate_limiter { resources [ { name: "R" count: 3 } ] priority: 2 } }``
says what each of its instances needs to run a batch. With ``--rate-limit execution_count``
every instance of every model in this worker asks the ``RateLimiter`` before it runs and gives
the resources back after, so instances whose needs add up past what there is take turns.
What there is of a resource: ``--rate-limit-resource NAME:COUNT``, else the most any one
instance needs (so that each can run at all), as Triton counts it. A worker is one device
here: ``global`` resources and per-device ones are counted alike.

Who goes first when several wait: the one whose instance has had the least share so far,
counting each run as its ``priority`` (1 by default), so an instance of priority 1 runs twice
as often as one of priority 2 while both wait, as Triton weighs them. A waiter whose needs do
not fit yet holds the others back, so a large need is not starved by small ones.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

from workers.errors import ModelLoadError

MODES = ("off", "execution_count")


@dataclass(frozen=True, slots=True)
class Needs:
    resources: tuple[tuple[str, int], ...] = ()
    priority: int = 1


@dataclass(slots=True)
class _Waiter:
    instance: str
    needs: Needs
    granted: asyncio.Future[None]
    order: int = 0


@dataclass(slots=True)
class RateLimiter:
    """One per worker; ``hold`` around each instance's run."""

    given: Mapping[str, int] = field(default_factory=dict)  # --rate-limit-resource counts
    _available: dict[str, int] = field(default_factory=dict)
    _shares: dict[str, int] = field(default_factory=dict)  # instance -> its runs, each weighted by priority
    _waiting: list[_Waiter] = field(default_factory=list)
    _order: itertools.count[int] = field(default_factory=itertools.count)

    def register(self, model: str, needs: Needs) -> None:
        """An instance's needs, as it loads: a resource not given a count gets the largest need."""
        for name, count in needs.resources:
            if name in self.given:
                if count > self.given[name]:
                    raise ModelLoadError(f"model '{model}': its instances need {count} of resource '{name}', but "
                                         f"--rate-limit-resource gives {self.given[name]}: they could never run")
                self._available.setdefault(name, self.given[name])
            else:
                self._available[name] = max(self._available.get(name, 0), count)

    @asynccontextmanager
    async def hold(self, instance: str, needs: Needs) -> AsyncIterator[None]:
        if not needs.resources:
            yield
            return
        waiter = _Waiter(instance, needs, asyncio.get_running_loop().create_future(), next(self._order))
        self._shares.setdefault(instance, min(self._shares.values(), default=0))
        self._waiting.append(waiter)
        self._grant()
        try:
            await waiter.granted
        except BaseException:
            if waiter in self._waiting:
                self._waiting.remove(waiter)
            elif waiter.granted.done() and not waiter.granted.cancelled():
                self._release(waiter.needs)  # granted as it was cancelled: give it back
            raise
        try:
            yield
        finally:
            self._release(needs)

    def available(self, resource: str) -> int:
        return self._available.get(resource, 0)

    def _release(self, needs: Needs) -> None:
        for name, count in needs.resources:
            self._available[name] += count
        self._grant()

    def _grant(self) -> None:
        while self._waiting:
            first = min(self._waiting, key=lambda w: (self._shares[w.instance], w.order))
            if any(self._available.get(name, 0) < count for name, count in first.needs.resources):
                return
            self._waiting.remove(first)
            for name, count in first.needs.resources:
                self._available[name] -= count
            self._shares[first.instance] += first.needs.priority
            first.granted.set_result(None)


def parse_resource(text: str) -> tuple[str, int]:
    """``NAME:COUNT[:DEVICE]`` (the device is accepted and not told apart: one worker, one device)."""
    parts = text.split(":")
    if len(parts) not in (2, 3) or not parts[0] or not parts[1].isdigit():
        raise ValueError(f"--rate-limit-resource {text!r}: expected NAME:COUNT[:DEVICE]")
    return parts[0], int(parts[1])
