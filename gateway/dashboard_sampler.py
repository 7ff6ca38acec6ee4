"""Samples the workers' stats every couple of seconds for the dashboard.

Each sample is every live worker's last ``Beat`` (in ``ferry gateway`` read
from the heartbeats, in ``ferry serve`` from the local worker). After each
sample the sampler adds one chart point: the rates and latencies over the
last ``rate_window_s`` (``dashboard_data.window``). Requests for
``/dashboard/data`` read what is kept here and never wait on the broker.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass

import structlog

from broker.errors import TransportError
from gateway.periodic import Periodic
from gateway.dashboard_data import ModelWindow, Sample, WorkerSnapshot, window, worker_windows
from workers.heartbeat import Beat

log = structlog.get_logger("ferry.gateway.dashboard")

WorkerBeats = Callable[[], Awaitable[Mapping[str, Beat]]]


@dataclass(frozen=True, slots=True)
class DashboardSettings:
    interval_s: float = 2.0  # how often the stats are sampled (and the page polls)
    rate_window_s: float = 10.0  # each chart point covers this much time
    summary_window_s: float = 60.0  # the batch-size distribution and the window's p50/p99
    history_s: float = 300.0  # how far back the charts reach


@dataclass(frozen=True, slots=True)
class Point:
    at_s: float
    models: Mapping[str, ModelWindow]


class StatsSampler:
    def __init__(self, source: WorkerBeats, settings: DashboardSettings = DashboardSettings(),
                 clock: Callable[[], float] = time.time) -> None:
        self._source = source
        self._settings = settings
        self._clock = clock
        self._beats: Mapping[str, Beat] = {}
        self._samples: deque[Sample] = deque()
        self._points: deque[Point] = deque()
        self._sampler = Periodic(self.sample, settings.interval_s, "dashboard-sampler")

    @property
    def settings(self) -> DashboardSettings:
        return self._settings

    def beats(self) -> Mapping[str, Beat]:
        """The live workers at the last sample."""
        return self._beats

    def latest(self) -> Sample | None:
        return self._samples[-1] if self._samples else None

    def points(self) -> list[Point]:
        return list(self._points)

    def summary(self) -> Mapping[str, ModelWindow]:
        """Per model, the last ``summary_window_s``."""
        if not self._samples:
            return {}
        return window(self._samples, self._samples[-1].at_s - self._settings.summary_window_s)

    def by_worker(self) -> Mapping[str, Mapping[str, ModelWindow]]:
        """Per worker and model, the last ``rate_window_s``."""
        if not self._samples:
            return {}
        return worker_windows(self._samples, self._samples[-1].at_s - self._settings.rate_window_s)

    async def start(self) -> None:
        await self._sampler.start()

    async def aclose(self) -> None:
        await self._sampler.aclose()

    async def sample(self) -> None:
        try:
            beats = await self._source()
        except TransportError as exc:
            log.warning("dashboard.sample_failed", error=str(exc))
            return
        self._beats = beats
        self.add(Sample(self._clock(), {worker: WorkerSnapshot(beat.sent_ns / 1e9, beat.stats)
                                        for worker, beat in beats.items() if beat.stats is not None}))

    def add(self, sample: Sample) -> None:
        """Keep ``sample`` and add the chart point it ends."""
        self._samples.append(sample)
        if len(self._samples) > 1:
            self._points.append(Point(sample.at_s, window(self._samples, sample.at_s - self._settings.rate_window_s)))
        self._forget(sample.at_s)

    def _forget(self, now_s: float) -> None:
        keep_s = max(self._settings.rate_window_s, self._settings.summary_window_s) + 2 * self._settings.interval_s
        # The oldest sample stays while the next one is still too young to be a window's base.
        while len(self._samples) > 1 and self._samples[1].at_s <= now_s - keep_s:
            self._samples.popleft()
        while self._points and self._points[0].at_s < now_s - self._settings.history_s:
            self._points.popleft()

