"""The seam between the serving path and whatever watches it."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Protocol

from workers.telemetry.timeline import BatchRecord, DeadLetterRecord, Timeline


class Observer(Protocol):
    def received(self, timeline: Timeline) -> None:
        """A request was taken from the broker and decoded."""

    def batch_ran(self, batch: BatchRecord) -> None:
        """An instance computed one batch (failed or not)."""

    def finished(self, timeline: Timeline) -> None:
        """A request was answered (``timeline.outcome`` says how)."""

    def dead_lettered(self, letter: DeadLetterRecord) -> None:
        """A message went to the dead-letter channel."""


class Observers:
    """Several observers as one; each is called in order."""

    def __init__(self, observers: Iterable[Observer] = ()) -> None:
        self._observers = tuple(observers)

    def received(self, timeline: Timeline) -> None:
        for observer in self._observers:
            observer.received(timeline)

    def batch_ran(self, batch: BatchRecord) -> None:
        for observer in self._observers:
            observer.batch_ran(batch)

    def finished(self, timeline: Timeline) -> None:
        for observer in self._observers:
            observer.finished(timeline)

    def dead_lettered(self, letter: DeadLetterRecord) -> None:
        for observer in self._observers:
            observer.dead_lettered(letter)


NO_OBSERVER = Observers()
