"""The worker's collector renders exactly what its StatsBook holds."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from workers.telemetry.prometheus import StatsCollector
from workers.telemetry.stats import StatsBook
from workers.telemetry.timeline import RELEASED, BatchRecord, Timeline

MS = 1_000_000


def scrape(registry: CollectorRegistry) -> dict[str, list[tuple[str, dict[str, str], float]]]:
    samples: dict[str, list[tuple[str, dict[str, str], float]]] = {}
    for family in text_string_to_metric_families(generate_latest(registry).decode()):
        samples[family.name] = [(s.name, s.labels, s.value) for s in family.samples]
    return samples


def value(samples, family: str, sample: str, **labels: str) -> float:
    found = [v for name, got, v in samples[family] if name == sample and got == labels]
    assert len(found) == 1, (family, sample, labels, samples.get(family))
    return found[0]


def request(model: str, version: str, rows: int, outcome: str = "success", start_ms: int = 0) -> Timeline:
    base = 1_000_000 * MS + start_ms * MS
    return Timeline(request_id="r", model=model, version=version, worker_id="w1", enqueued_ns=base,
                    received_ns=base + 1 * MS, compute_start_ns=base + 3 * MS, compute_end_ns=base + 7 * MS,
                    done_ns=base + 8 * MS, rows=rows, outcome=outcome)


def batch(model: str, version: str, size: int) -> BatchRecord:
    return BatchRecord(model, version, "b", size, 1, 0, 0)


def filled_book() -> StatsBook:
    stats = StatsBook()
    for rows in (1, 3, 4):
        timeline = request("add_sub", "1", rows)
        stats.received(timeline)
        stats.batch_ran(batch("add_sub", "1", rows))
        stats.finished(timeline)
    for outcome in ("invalid_argument", "invalid_argument", "timeout", RELEASED):
        timeline = request("add_sub", "1", 1, outcome)
        stats.received(timeline)
        stats.finished(timeline)
    stats.received(request("add_sub", "1", 1))  # still pending
    other = request("text_stats", "2", 2)
    stats.received(other)
    stats.batch_ran(batch("text_stats", "2", 2))
    stats.finished(other)
    return stats


def test_counters_gauges_and_info_match_the_book_exactly():
    registry = CollectorRegistry()
    registry.register(StatsCollector(filled_book(), "w1"))
    samples = scrape(registry)
    add_sub = {"model": "add_sub", "version": "1"}
    assert value(samples, "ferry_inference_request_success", "ferry_inference_request_success_total", **add_sub) == 3
    failure = "ferry_inference_request_failure"
    assert value(samples, failure, failure + "_total", **add_sub, reason="invalid_argument") == 2
    assert value(samples, failure, failure + "_total", **add_sub, reason="timeout") == 1
    # A released delivery is neither a success nor a failure here.
    assert {labels["reason"] for _, labels, _ in samples[failure]} == {"invalid_argument", "timeout"}
    assert value(samples, "ferry_inference_count", "ferry_inference_count_total", **add_sub) == 8
    assert value(samples, "ferry_inference_exec_count", "ferry_inference_exec_count_total", **add_sub) == 3
    assert value(samples, "ferry_inference_count", "ferry_inference_count_total",
                 model="text_stats", version="2") == 2
    pending = "ferry_inference_pending_request_count"
    assert value(samples, pending, pending, model="add_sub") == 1
    assert value(samples, pending, pending, model="text_stats") == 0
    assert value(samples, "ferry_worker_info", "ferry_worker_info", worker="w1") == 1


def test_histograms_carry_the_books_buckets_sums_and_counts():
    stats = filled_book()
    registry = CollectorRegistry()
    registry.register(StatsCollector(stats, "w1"))
    samples = scrape(registry)
    book = stats.model("add_sub", "1")
    for family, histogram in (("ferry_inference_batch_size", book.batch_sizes),
                              ("ferry_inference_request_duration_seconds", book.request),
                              ("ferry_inference_queue_duration_seconds", book.queue),
                              ("ferry_inference_compute_duration_seconds", book.compute)):
        buckets = [(labels["le"], v) for name, labels, v in samples[family]
                   if name == family + "_bucket" and labels["model"] == "add_sub"]
        assert [v for _, v in buckets] == [seen for _, seen in histogram.cumulative()], family
        assert buckets[-1][0] == "+Inf"
        assert value(samples, family, family + "_count", model="add_sub", version="1") == histogram.count == 3
        assert value(samples, family, family + "_sum", model="add_sub", version="1") == histogram.total
    assert value(samples, "ferry_inference_batch_size", "ferry_inference_batch_size_sum",
                 model="add_sub", version="1") == 8
    # Each timeline spent 8 ms from enqueue to reply, 3 ms queued and 4 ms computing.
    assert abs(book.request.total - 0.024) < 1e-9 and abs(book.queue.total - 0.009) < 1e-9
    assert abs(book.compute.total - 0.012) < 1e-9


def test_a_scrape_reflects_what_was_counted_since_the_last_one():
    stats = StatsBook()
    registry = CollectorRegistry()
    registry.register(StatsCollector(stats, "w1"))
    assert "ferry_inference_request_success" in scrape(registry)
    assert scrape(registry)["ferry_inference_request_success"] == []
    timeline = request("m", "1", 2)
    stats.received(timeline)
    stats.finished(timeline)
    samples = scrape(registry)
    assert value(samples, "ferry_inference_request_success", "ferry_inference_request_success_total",
                 model="m", version="1") == 1
