"""Trace propagation over Kafka, with real ``ferry gateway`` and ``ferry worker``
processes: a caller's ``traceparent`` runs through both, and a message kcat
puts straight on a request topic starts the worker's spans from its
``traceparent`` header."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from broker import channels
from tests.kafka_fleet.processes import Gateway, KafkaFleet
from tests.models import write_add_sub
from tests.tracing.spans import (
    EXPORT_DELAY_ENV, MODEL, assert_worker_request, gateway_span, infer, made_up_parent, new_gateway_span, one,
    read_spans, trace_flags, v2_body, worker_spans,
)


@dataclass
class Traced:
    fleet: KafkaFleet
    gateway: Gateway
    gateway_spans: Path
    worker_spans: Path


@pytest.fixture(scope="module")
def traced(kafka_bootstrap: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Traced]:
    root = tmp_path_factory.mktemp("traced-kafka")
    write_add_sub(root / "repo")
    gateway_file, worker_file = root / "gateway.jsonl", root / "worker.jsonl"
    with pytest.MonkeyPatch.context() as env, KafkaFleet(kafka_bootstrap, root / "repo", root) as fleet:
        env.setenv(*EXPORT_DELAY_ENV)
        fleet.worker("w1", "--metrics-port", "0", *trace_flags(worker_file))
        gateway = fleet.gateway(*trace_flags(gateway_file))
        fleet.wait_model_ready(gateway, MODEL)
        yield Traced(fleet, gateway, gateway_file, worker_file)
        for process in fleet.processes:
            assert process.errors() == [], process.describe()


def test_a_callers_traceparent_runs_through_gateway_and_worker_over_kafka(traced: Traced) -> None:
    parent, trace_id, caller_span = made_up_parent()
    infer(traced.gateway.url, {"traceparent": parent})
    gateway = gateway_span(traced.gateway_spans, trace_id)
    assert gateway["parent_id"] == caller_span, gateway
    request = assert_worker_request(worker_spans(traced.worker_spans, trace_id), trace_id, gateway["span_id"], MODEL)
    assert request["attributes"]["ferry.request_id"] == gateway["attributes"]["ferry.request_id"]


def test_without_a_traceparent_one_new_trace_runs_gateway_to_worker_over_kafka(traced: Traced) -> None:
    before = read_spans(traced.gateway_spans)
    infer(traced.gateway.url)
    gateway = new_gateway_span(traced.gateway_spans, before)
    assert gateway["parent_id"] is None, gateway
    assert_worker_request(worker_spans(traced.worker_spans, gateway["trace_id"]), gateway["trace_id"],
                          gateway["span_id"], MODEL)


def test_a_kcat_messages_traceparent_header_starts_the_workers_spans(traced: Traced) -> None:
    """No gateway: the trace context comes in the Kafka message's headers.
    A JSON body carries no enqueue time, so there is no queue wait span."""
    fleet = traced.fleet
    parent, trace_id, producer_span = made_up_parent()
    replies = "kcat.traced.replies"
    fleet.kcat.produce(fleet.topic(channels.request_channel(MODEL)), v2_body(), key="kcat-1", headers={
        "content-type": "application/json", "reply-to": replies, "traceparent": parent,
    })
    [reply] = fleet.kcat.consume(fleet.topic(replies), 1)
    assert reply.key == "kcat-1" and "error" not in reply.headers, reply
    spans = worker_spans(traced.worker_spans, trace_id, 3)
    assert sorted(s["name"] for s in spans if s["trace_id"] == trace_id) == [
        "ferry.batch_formation", "ferry.compute", "ferry.worker.request"]
    request = one(spans, "ferry.worker.request", trace_id)
    assert request["parent_id"] == producer_span and request["attributes"]["ferry.request_id"] == "kcat-1", request
    assert request["attributes"]["ferry.outcome"] == "success", request
