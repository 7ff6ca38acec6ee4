"""How much work waits on the broker, per model request channel and worker group.

``lag`` is what the group has not yet been handed (Redis: XINFO GROUPS
``lag``; Kafka: end offset minus the group's committed offset, summed over
partitions) and ``pending`` what it was handed and has not acked (Redis:
XPENDING's count). They are the numbers KEDA's redis-streams and kafka
scalers read, so ``ferry lag`` and ``ferry_queue_lag`` show what the
autoscaler sees. ``BacklogPoller`` reads them in the background, so a scrape
or a dashboard refresh never waits on the broker.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Protocol

import structlog
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from broker import channels
from broker.errors import TransportError
from gateway.periodic import Periodic
from workers.repository.layout import RepositoryIndex

log = structlog.get_logger("ferry.gateway.backlog")

# A model's name and its priority levels (0: one request channel).
ModelLevels = Callable[[], list[tuple[str, int]]]


class Backlog(Protocol):
    async def backlog(self, channel: str, group: str) -> tuple[int, int]:
        """(messages not yet delivered to ``group``, delivered but not acked)."""


@dataclass(frozen=True, slots=True)
class QueueBacklog:
    model: str
    channel: str
    group: str
    lag: int  # not yet delivered to the group
    pending: int  # delivered, not acked

    @property
    def depth(self) -> int:
        return self.lag + self.pending

    def to_json(self) -> dict[str, str | int]:
        return {"model": self.model, "channel": self.channel, "group": self.group,
                "lag": self.lag, "pending": self.pending, "depth": self.depth}


def index_models(index: RepositoryIndex) -> list[tuple[str, int]]:
    """Every model of a repository index with its priority levels."""
    return [(name, entry.config.priority_levels) for name, entry in sorted(index.entries.items())]


async def read_backlog(broker: Backlog, models: Iterable[tuple[str, int]],
                       prefix: str = channels.PREFIX) -> list[QueueBacklog]:
    """One broker read of every request channel of ``models``."""
    out = []
    for model, levels in models:
        group = channels.worker_group(model, prefix)
        for channel in channels.request_channels(model, levels, prefix):
            lag, pending = await broker.backlog(channel, group)
            out.append(QueueBacklog(model, channel, group, lag, pending))
    return out


class BacklogPoller:
    def __init__(self, transport: Backlog, models: ModelLevels, prefix: str = channels.PREFIX,
                 interval_s: float = 5.0) -> None:
        self._transport = transport
        self._models = models
        self._prefix = prefix
        self._snapshot: list[QueueBacklog] = []
        self._reader = Periodic(self.refresh, interval_s, "backlog-poller")

    def snapshot(self) -> list[QueueBacklog]:
        """The last reading (empty until the first one lands)."""
        return list(self._snapshot)

    async def start(self) -> None:
        # The first read happens in the background: a slow broker must not hold up start-up.
        await self._reader.start(first_in_background=True)

    async def aclose(self) -> None:
        await self._reader.aclose()

    async def refresh(self) -> None:
        try:
            self._snapshot = await read_backlog(self._transport, self._models(), self._prefix)
        except TransportError as exc:
            # Keep the last reading; the broker may be back by the next one.
            log.warning("backlog.read_failed", error=str(exc))


class BacklogCollector(Collector):
    """``ferry_queue_lag``, ``ferry_queue_pending`` and ``ferry_queue_depth`` from a poller's snapshot."""

    def __init__(self, poller: BacklogPoller) -> None:
        self._poller = poller

    def collect(self) -> Iterator[GaugeMetricFamily]:
        labels = ["model", "channel", "group"]
        lag = GaugeMetricFamily("ferry_queue_lag", "Messages not yet delivered to the worker group.",
                                labels=labels)
        pending = GaugeMetricFamily("ferry_queue_pending", "Messages delivered to the group, not yet acked.",
                                    labels=labels)
        depth = GaugeMetricFamily("ferry_queue_depth", "Lag plus pending.", labels=labels)
        for row in self._poller.snapshot():
            values = [row.model, row.channel, row.group]
            lag.add_metric(values, row.lag)
            pending.add_metric(values, row.pending)
            depth.add_metric(values, row.depth)
        yield from (lag, pending, depth)
