"""A worker's ``StatsBook`` as Prometheus metrics, rendered at scrape time.

The serving path only bumps plain counters in the ``StatsBook``; this
collector turns them into metric families when ``/metrics`` is read, so no
Prometheus metric object is touched per request. Register it on a
``CollectorRegistry`` the process owns, never the global one.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

from workers.telemetry.histogram import Histogram
from workers.telemetry.stats import DeadLetterStats, ModelStats, StatsBook

VERSIONED = ["model", "version"]


def histogram_family(name: str, documentation: str, labels: list[str],
                     rows: list[tuple[list[str], Histogram]]) -> HistogramMetricFamily:
    family = HistogramMetricFamily(name, documentation, labels=labels)
    for values, histogram in rows:
        buckets = [(floatToGoString(bound), float(seen)) for bound, seen in histogram.cumulative()]
        family.add_metric(values, buckets, histogram.total)
    return family


class StatsCollector(Collector):
    def __init__(self, stats: StatsBook, worker_id: str) -> None:
        self._stats = stats
        self._worker_id = worker_id

    def collect(self) -> Iterator[Metric]:
        items = [([model, version], stats) for (model, version), stats in self._stats.items()]
        yield from _counters(items)
        yield histogram_family("ferry_inference_request_duration_seconds",
                               "Time from the gateway's publish to the worker's reply.", VERSIONED,
                               [(labels, stats.request) for labels, stats in items])
        yield histogram_family("ferry_inference_queue_duration_seconds",
                               "Time from the gateway's publish until its batch started computing.", VERSIONED,
                               [(labels, stats.queue) for labels, stats in items])
        yield histogram_family("ferry_inference_compute_duration_seconds",
                               "Compute time of the batch each request ran in.", VERSIONED,
                               [(labels, stats.compute) for labels, stats in items])
        yield histogram_family("ferry_inference_batch_size", "Rows in each batch executed.", VERSIONED,
                               [(labels, stats.batch_sizes) for labels, stats in items])
        pending = GaugeMetricFamily("ferry_inference_pending_request_count",
                                    "Requests this worker has taken and not yet answered.", labels=["model"])
        for model, count in sorted(self._stats.pending.items()):
            pending.add_metric([model], count)
        yield pending
        info = GaugeMetricFamily("ferry_worker_info", "This worker (always 1).", labels=["worker"])
        info.add_metric([self._worker_id], 1)
        yield info
        yield from _dead_letters(self._stats.dead_letters)


def _counters(items: list[tuple[list[str], ModelStats]]) -> Iterator[Metric]:
    success = CounterMetricFamily("ferry_inference_request_success", "Requests answered successfully.",
                                  labels=VERSIONED)
    failure = CounterMetricFamily("ferry_inference_request_failure", "Requests answered with an error, by reason.",
                                  labels=[*VERSIONED, "reason"])
    rows = CounterMetricFamily("ferry_inference_count", "Rows inferred by successful requests.", labels=VERSIONED)
    batches = CounterMetricFamily("ferry_inference_exec_count", "Batches executed.", labels=VERSIONED)
    hits = CounterMetricFamily("ferry_cache_hits", "Requests answered from the response cache.", labels=VERSIONED)
    misses = CounterMetricFamily("ferry_cache_misses", "Requests looked up in the response cache and computed.",
                                 labels=VERSIONED)
    for labels, stats in items:
        success.add_metric(labels, stats.success)
        for reason, count in sorted(stats.failures.items()):
            failure.add_metric([*labels, reason], count)
        rows.add_metric(labels, stats.inferences)
        batches.add_metric(labels, stats.executions)
        hits.add_metric(labels, stats.cache_hits)
        misses.add_metric(labels, stats.cache_misses)
    yield from (success, failure, rows, batches, hits, misses)


def _dead_letters(counts: DeadLetterStats) -> Iterator[Metric]:
    yield CounterMetricFamily("ferry_deadletter_written", "Letters this worker wrote to the dead-letter channel.",
                              value=counts.written)
    dropped = CounterMetricFamily(
        "ferry_deadletter_dropped",
        "Dead letters dropped whole (evicted: the oldest, past the count bound) or in part "
        "(truncated: payload cut to the letter's share of the byte bound).", labels=["reason"])
    dropped.add_metric(["evicted"], counts.evicted)
    dropped.add_metric(["truncated"], counts.truncated)
    yield dropped
    yield CounterMetricFamily("ferry_deadletter_dropped_bytes", "Payload bytes cut from truncated dead letters.",
                              value=counts.truncated_bytes)
