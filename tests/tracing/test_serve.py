"""``ferry serve``: gateway and worker in one process, one provider, one file;
stopping the server flushes what the exporter still held."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.models import write_add_sub
from tests.servers import ferry_serve
from tests.tracing.spans import MODEL, assert_worker_request, infer, made_up_parent, one, read_spans, trace_flags


def test_serve_traces_gateway_and_worker_under_one_service_and_flushes_on_stop(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Far longer than the test: only the flush at shutdown can write the spans.
    monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "600000")
    write_add_sub(tmp_path / "repo")
    spans_file = tmp_path / "spans.jsonl"
    parent, trace_id, caller_span = made_up_parent()
    with ferry_serve(tmp_path / "repo", *trace_flags(spans_file), log_path=tmp_path / "serve.log") as url:
        infer(url, {"traceparent": parent})
        assert read_spans(spans_file) == []
    spans = read_spans(spans_file)
    gateway = one(spans, "ferry.gateway.infer", trace_id)
    assert gateway["parent_id"] == caller_span and gateway["service"] == "ferry", gateway
    request = one(spans, "ferry.worker.request", trace_id)
    assert request["service"] == "ferry", request
    # assert_worker_request checks the service of a worker alone; here everything is "ferry".
    assert_worker_request([{**s, "service": "ferry-worker"} for s in spans], trace_id, gateway["span_id"], MODEL)
    assert len(spans) == 5

