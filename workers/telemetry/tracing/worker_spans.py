"""A worker's spans, drawn from each finished request's ``Timeline``.

The stages already happened when the request is answered, so every span is
made after the fact with explicit start and end times; nothing is traced
while the request is being served. Per request:

    ferry.worker.request      enqueued (or received) -> answered
      ferry.queue_wait        enqueued at the gateway -> taken from the broker
      ferry.batch_formation   taken -> its batch started on an instance
      ferry.compute           the instance computing its batch

``ferry.worker.request`` starts at the enqueue time, not at receipt, so its
children lie inside it; when clocks disagree (the enqueue stamp is another
host's wall clock) and enqueued is after received, the queue wait is left
out. A span whose stage was not reached (a request refused before compute)
is left out too.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from workers.telemetry.timeline import RELEASED, SUCCESS, BatchRecord, DeadLetterRecord, Timeline
from workers.telemetry.tracing import names

if TYPE_CHECKING:
    from workers.telemetry.tracing.provider import Attributes, Tracing

_NOT_FAILURES = (SUCCESS, RELEASED)


class TracingObserver:
    """An ``Observer``: spans for the sampled requests a worker answers."""

    def __init__(self, tracing: Tracing) -> None:
        self._tracing = tracing

    def received(self, timeline: Timeline) -> None:
        return None

    def batch_ran(self, batch: BatchRecord) -> None:
        return None

    def dead_lettered(self, letter: DeadLetterRecord) -> None:
        return None

    def finished(self, timeline: Timeline) -> None:
        if not timeline.received_ns or _declined(timeline.trace):
            return
        start = _request_start(timeline)
        request = self._tracing.start(names.WORKER_REQUEST, timeline.trace, request_attributes(timeline), start)
        if not request.is_recording():
            return  # the sampler said no to a new root
        for name, begin, end, attributes in stages(timeline):
            self._tracing.end(self._tracing.start(name, request, attributes, begin), end)
        error = "" if timeline.outcome in _NOT_FAILURES else timeline.outcome
        self._tracing.end(request, max(start, timeline.done_ns or timeline.received_ns), error)


def stages(timeline: Timeline) -> list[tuple[str, int, int, Attributes]]:
    """(name, start ns, end ns, attributes) of each stage the request reached."""
    found: list[tuple[str, int, int, Attributes]] = []
    received, compute_start = timeline.received_ns, timeline.compute_start_ns
    if 0 < timeline.enqueued_ns <= received:
        found.append((names.QUEUE_WAIT, timeline.enqueued_ns, received, {}))
    if compute_start >= received:
        found.append((names.BATCH_FORMATION, received, compute_start, {}))
        if timeline.compute_end_ns >= compute_start:
            batch: Attributes = {names.BATCH_ID: timeline.batch_id, names.BATCH_SIZE: timeline.batch_size}
            found.append((names.COMPUTE, compute_start, timeline.compute_end_ns,
                          batch if timeline.batch_id else {}))
    return found


def request_attributes(timeline: Timeline) -> Attributes:
    attributes: dict[str, str | int] = {
        names.MODEL: timeline.model, names.VERSION: timeline.version, names.REQUEST_ID: timeline.request_id,
        names.WORKER_ID: timeline.worker_id, names.OUTCOME: timeline.outcome, names.ROWS: timeline.rows,
    }
    if timeline.batch_id:
        attributes[names.BATCH_ID] = timeline.batch_id
        attributes[names.BATCH_SIZE] = timeline.batch_size
    return attributes


def _request_start(timeline: Timeline) -> int:
    enqueued = timeline.enqueued_ns
    return enqueued if 0 < enqueued <= timeline.received_ns else timeline.received_ns


def _declined(trace: dict[str, str]) -> bool:
    """A caller's context that is not sampled: skip the sampler's work entirely."""
    flags = trace.get("traceparent", "")[53:]
    return len(flags) == 2 and flags in _UNSAMPLED


_UNSAMPLED = frozenset(f"{n:02x}" for n in range(0, 256, 2))  # trace-flags with the sampled bit clear
