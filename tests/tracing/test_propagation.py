"""Trace propagation over Redis and Kafka, with real ``ferry gateway`` and
``ferry worker`` processes each writing its spans to a jsonl file of its own:
one trace runs from the caller through the gateway to the worker's stages, and
a message a raw producer puts straight on a request channel starts the
worker's spans from its ``traceparent`` header."""

from __future__ import annotations

import json
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from broker import channels
from tests.brokers import FLEET_BROKERS, open_fleet
from tests.fleet.processes import Gateway, ProcessFleet
from tests.kafka_fleet.processes import KafkaFleet
from tests.models import write_add_sub
from tests.tracing.spans import (
    EXPORT_DELAY_ENV, MODEL, assert_worker_request, gateway_span, infer, made_up_parent, new_gateway_span, one,
    read_spans, trace_flags, v2_body, worker_spans,
)

# For the tests of the gateway's sampling and of async jobs: they are the same over any broker.
REDIS_ONLY = pytest.mark.parametrize("traced", ["redis"], indirect=True)


@dataclass
class Traced:
    fleet: ProcessFleet
    gateway: Gateway  # --trace-rate 1
    quiet_gateway: Gateway | None  # --trace-rate 0; on Redis only, like the tests that use it
    gateway_spans: Path
    quiet_gateway_spans: Path
    worker_spans: Path


@pytest.fixture(scope="module", params=FLEET_BROKERS)
def traced(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Traced]:
    root = tmp_path_factory.mktemp(f"traced-{request.param}")
    write_add_sub(root / "repo")
    files = [root / name for name in ("gateway.jsonl", "quiet-gateway.jsonl", "worker.jsonl")]
    with pytest.MonkeyPatch.context() as env, open_fleet(request, request.param, root / "repo", root) as fleet:
        env.setenv(*EXPORT_DELAY_ENV)
        worker = fleet.worker("w1", "--metrics-port", "0", *trace_flags(files[2]))
        gateway = fleet.gateway(*trace_flags(files[0]))
        fleet.wait_model_ready(gateway, MODEL)
        if isinstance(fleet, KafkaFleet):  # a heartbeat comes before the worker holds its partitions
            fleet.wait_assigned([worker], channels.request_channel(MODEL))
        # A second gateway on Kafka would join the gateways' groups and set off rebalances the
        # Kafka tests have no use for.
        quiet = fleet.gateway(*trace_flags(files[1], rate=0.0)) if request.param == "redis" else None
        if quiet is not None:
            fleet.wait_model_ready(quiet, MODEL)
        yield Traced(fleet, gateway, quiet, *files)
        for process in fleet.processes:
            assert process.errors() == [], process.describe()


def test_a_callers_traceparent_runs_through_gateway_and_worker(traced: Traced) -> None:
    parent, trace_id, caller_span = made_up_parent()
    infer(traced.gateway.url, {"traceparent": parent})
    gateway = gateway_span(traced.gateway_spans, trace_id)
    assert gateway["parent_id"] == caller_span and gateway["service"] == "ferry-gateway", gateway
    assert gateway["attributes"]["ferry.model"] == MODEL and gateway["attributes"]["ferry.outcome"] == "success"
    spans = worker_spans(traced.worker_spans, trace_id)
    request = assert_worker_request(spans, trace_id, gateway["span_id"], MODEL)
    assert request["attributes"]["ferry.request_id"] == gateway["attributes"]["ferry.request_id"]
    assert request["attributes"]["ferry.worker_id"] == "w1"
    # One host, one clock: enqueued after the gateway span began, computed before its reply came
    # (the worker's span itself ends after its ack, which may follow the gateway's end).
    compute = one(spans, "ferry.compute", trace_id)
    assert gateway["start_ns"] <= request["start_ns"] and compute["end_ns"] <= gateway["end_ns"], (gateway, compute)


def test_without_a_traceparent_the_gateway_starts_the_trace_the_worker_joins(traced: Traced) -> None:
    before = read_spans(traced.gateway_spans)
    infer(traced.gateway.url)
    gateway = new_gateway_span(traced.gateway_spans, before)
    assert gateway["parent_id"] is None, gateway
    assert_worker_request(worker_spans(traced.worker_spans, gateway["trace_id"]), gateway["trace_id"],
                          gateway["span_id"], MODEL)


@REDIS_ONLY
def test_at_rate_zero_only_a_callers_sampled_trace_is_recorded(traced: Traced) -> None:
    assert traced.quiet_gateway is not None
    seen = len(read_spans(traced.worker_spans))
    infer(traced.quiet_gateway.url)  # not sampled: nothing anywhere
    parent, trace_id, caller_span = made_up_parent()
    infer(traced.quiet_gateway.url, {"traceparent": parent})  # sampled by its caller: followed
    gateway = gateway_span(traced.quiet_gateway_spans, trace_id)
    assert gateway["parent_id"] == caller_span
    spans = worker_spans(traced.worker_spans, trace_id)
    assert read_spans(traced.quiet_gateway_spans) == [gateway]
    # Spans are exported in order of answering: the unsampled request would have come first.
    assert {s["trace_id"] for s in spans[seen:]} == {trace_id}, spans[seen:]
    assert_worker_request(spans, trace_id, gateway["span_id"], MODEL)


@REDIS_ONLY
def test_a_callers_unsampled_traceparent_is_followed_at_rate_one(traced: Traced) -> None:
    seen = len(read_spans(traced.worker_spans)), len(read_spans(traced.gateway_spans))
    unsampled, _, _ = made_up_parent(sampled=False)
    infer(traced.gateway.url, {"traceparent": unsampled})
    parent, trace_id, _ = made_up_parent()
    infer(traced.gateway.url, {"traceparent": parent})
    gateway = gateway_span(traced.gateway_spans, trace_id)
    spans = worker_spans(traced.worker_spans, trace_id)
    assert read_spans(traced.gateway_spans)[seen[1]:] == [gateway]
    assert {s["trace_id"] for s in spans[seen[0]:]} == {trace_id}, spans[seen[0]:]


def test_a_raw_producers_traceparent_header_starts_the_workers_spans(traced: Traced) -> None:
    """No gateway: an entry XADDed by hand (its ``h.traceparent`` field is a header
    like any other) or a message kcat puts on the request topic. A JSON body
    carries no enqueue time, so there is no queue wait span."""
    parent, trace_id, producer_span = made_up_parent()
    traced.fleet.produce_json(channels.request_channel(MODEL), v2_body(), "raw-1", "raw.replies", traceparent=parent)
    [reply] = traced.fleet.read_replies("raw.replies", 1)
    assert reply.key == "raw-1" and "error" not in reply.headers, reply
    spans = worker_spans(traced.worker_spans, trace_id, 3)
    assert sorted(s["name"] for s in spans if s["trace_id"] == trace_id) == [
        "ferry.batch_formation", "ferry.compute", "ferry.worker.request"]
    request = one(spans, "ferry.worker.request", trace_id)
    assert request["parent_id"] == producer_span and request["attributes"]["ferry.request_id"] == "raw-1", request
    assert request["attributes"]["ferry.outcome"] == "success", request


@REDIS_ONLY
def test_an_async_jobs_submission_is_the_parent_of_its_workers_spans(traced: Traced) -> None:
    parent, trace_id, caller_span = made_up_parent()
    request = urllib.request.Request(
        f"http://{traced.gateway.url}/v2/models/{MODEL}/infer", data=v2_body(), method="POST",
        headers={"Content-Type": "application/json", "Prefer": "respond-async", "traceparent": parent})
    with urllib.request.urlopen(request, timeout=30) as response:
        assert response.status == 202
        job_id = json.loads(response.read())["job_id"]
    gateway = gateway_span(traced.gateway_spans, trace_id)
    assert gateway["parent_id"] == caller_span and gateway["attributes"]["ferry.async_job"] is True, gateway
    assert gateway["attributes"]["ferry.request_id"] == job_id, gateway
    assert_worker_request(worker_spans(traced.worker_spans, trace_id), trace_id, gateway["span_id"], MODEL)
