"""Reading what ``--trace-exporter jsonl`` wrote, for the tracing tests."""

from __future__ import annotations

import json
import secrets
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import tritonclient.http as httpclient


Span = dict[str, Any]
MODEL = "add_sub"

WAIT_S = 20.0
# Spans leave the BatchSpanProcessor after this many ms (its default is 5000).
EXPORT_DELAY_ENV = ("OTEL_BSP_SCHEDULE_DELAY", "100")


def read_spans(path: Path) -> list[Span]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def wait_spans(path: Path, enough: Callable[[list[Span]], bool], what: str, timeout_s: float = WAIT_S) -> list[Span]:
    """Poll ``path`` until ``enough(spans)``; fails showing what was there."""
    deadline = time.monotonic() + timeout_s
    while True:
        spans = read_spans(path)
        if enough(spans):
            return spans
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what} in {path}: {json.dumps(spans, indent=1)}")
        time.sleep(0.05)


def named(spans: list[Span], name: str, trace_id: str | None = None) -> list[Span]:
    return [s for s in spans if s["name"] == name and (trace_id is None or s["trace_id"] == trace_id)]


def one(spans: list[Span], name: str, trace_id: str | None = None) -> Span:
    found = named(spans, name, trace_id)
    assert len(found) == 1, f"expected one {name} (trace {trace_id}), got {json.dumps(spans, indent=1)}"
    return found[0]


def made_up_parent(sampled: bool = True) -> tuple[str, str, str]:
    """(traceparent, trace id, span id) of a caller that exists only in the test."""
    trace_id, span_id = secrets.token_hex(16), secrets.token_hex(8)
    return f"00-{trace_id}-{span_id}-{'01' if sampled else '00'}", trace_id, span_id


def trace_flags(path: Path, rate: float = 1.0) -> tuple[str, ...]:
    return ("--trace-exporter", "jsonl", "--trace-file", str(path), "--trace-rate", str(rate))


def inside(child: Span, parent: Span) -> bool:
    return parent["start_ns"] <= child["start_ns"] <= child["end_ns"] <= parent["end_ns"]


def assert_worker_request(spans: list[Span], trace_id: str, parent_id: str, model: str) -> Span:
    """The worker's four spans of one request under ``parent_id``, nested and plausible; the request span."""
    request = one(spans, "ferry.worker.request", trace_id)
    assert request["parent_id"] == parent_id, request
    assert request["service"] == "ferry-worker", request
    attributes = request["attributes"]
    assert attributes["ferry.model"] == model and attributes["ferry.outcome"] == "success", attributes
    assert attributes["ferry.worker_id"] and attributes["ferry.request_id"] and attributes["ferry.batch_id"], attributes
    assert attributes["ferry.batch_size"] >= 1, attributes
    for name in ("ferry.queue_wait", "ferry.batch_formation", "ferry.compute"):
        stage = one(spans, name, trace_id)
        assert stage["parent_id"] == request["span_id"], (name, stage, request)
        assert inside(stage, request), (name, stage, request)
        # Plausible: not negative, and well under the time the test allows a request.
        assert 0 <= stage["end_ns"] - stage["start_ns"] < 10e9, stage
    compute = one(spans, "ferry.compute", trace_id)
    assert compute["attributes"]["ferry.batch_id"] == attributes["ferry.batch_id"], compute
    wait, forming = one(spans, "ferry.queue_wait", trace_id), one(spans, "ferry.batch_formation", trace_id)
    assert wait["end_ns"] == forming["start_ns"] and forming["end_ns"] == compute["start_ns"], (wait, forming, compute)
    return request


# --- requests and the spans they leave ---------------------------------------


def infer(url: str, headers: dict[str, str] | None = None) -> None:
    """One add_sub request to the server at ``url`` (host:port), checked."""
    client = httpclient.InferenceServerClient(url, network_timeout=30.0)
    try:
        a, b = np.arange(16, dtype=np.float32).reshape(1, 16), np.ones((1, 16), dtype=np.float32)
        tensors = [httpclient.InferInput("INPUT0", [1, 16], "FP32"), httpclient.InferInput("INPUT1", [1, 16], "FP32")]
        tensors[0].set_data_from_numpy(a)
        tensors[1].set_data_from_numpy(b)
        result = client.infer(MODEL, tensors, headers=headers)
        np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + b)
    finally:
        client.close()


def gateway_span(path: Path, trace_id: str | None = None) -> Span:
    spans = wait_spans(path, lambda found: bool(named(found, "ferry.gateway.infer", trace_id)),
                       f"the gateway span of trace {trace_id}")
    return one(spans, "ferry.gateway.infer", trace_id)


def worker_spans(path: Path, trace_id: str, count: int = 4) -> list[Span]:
    return wait_spans(path, lambda found: len([s for s in found if s["trace_id"] == trace_id]) >= count,
                      f"the worker's {count} spans of trace {trace_id}")


def new_gateway_span(path: Path, before: list[Span]) -> Span:
    """The one gateway span written since ``before`` was read."""
    spans = wait_spans(path, lambda found: len(found) > len(before), "a new gateway span")
    [span] = spans[len(before):]
    assert span["name"] == "ferry.gateway.infer" and span["service"] == "ferry-gateway", span
    return span


def v2_body() -> bytes:
    values = [float(i) for i in range(16)]
    return json.dumps({"inputs": [
        {"name": "INPUT0", "shape": [1, 16], "datatype": "FP32", "data": values},
        {"name": "INPUT1", "shape": [1, 16], "datatype": "FP32", "data": values},
    ]}).encode()
