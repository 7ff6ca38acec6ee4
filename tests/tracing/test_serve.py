"""``ferry serve``: gateway and worker in one process, one provider, one file;
stopping the server flushes what the exporter still held."""

from __future__ import annotations

from pathlib import Path

import pytest
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.models import write_add_sub
from tests.servers import ferry_serve
from tests.tracing.spans import (
    MODEL, assert_worker_request, infer, made_up_parent, named, one, read_spans, trace_flags,
)


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



def test_trace_and_log_settings_change_what_the_server_records(tmp_path: Path) -> None:
    write_add_sub(tmp_path / "repo")
    spans_file = tmp_path / "spans.jsonl"
    with ferry_serve(tmp_path / "repo", *trace_flags(spans_file), log_path=tmp_path / "serve.log") as url:
        client = httpclient.InferenceServerClient(url)
        assert client.get_trace_settings() == {
            "trace_level": ["TIMESTAMPS"], "trace_rate": "1", "trace_count": "-1", "log_frequency": "0",
            "trace_file": str(spans_file), "trace_mode": "opentelemetry"}
        assert client.update_trace_settings(settings={"trace_rate": "2"})["trace_rate"] == "2"
        for _ in range(4):
            infer(url)  # one new trace in every two: 2
        off = client.update_trace_settings("add_sub", {"trace_level": ["OFF"]})
        assert (off["trace_level"], off["trace_rate"]) == (["OFF"], "2")  # the rest is the server's
        infer(url)
        infer(url)  # none
        assert client.update_trace_settings("add_sub", {"trace_level": None})["trace_level"] == ["TIMESTAMPS"]
        infer(url)  # the server's count goes on: the 5th of its new traces, so recorded: 3
        client.update_trace_settings(settings={"trace_rate": "1", "trace_count": "1"})
        for _ in range(3):
            infer(url)  # the count allows one more: 4
        assert client.get_trace_settings()["trace_count"] == "0"
        with pytest.raises(InferenceServerException, match="TENSORS is not supported"):
            client.update_trace_settings(settings={"trace_level": ["TENSORS"]})
        with pytest.raises(InferenceServerException, match="'trace_file' cannot be changed"):
            client.update_trace_settings(settings={"trace_file": "/tmp/elsewhere"})

        assert client.get_log_settings()["log_info"] is True
        quiet = client.update_log_settings({"log_info": False, "log_verbose_level": 0})
        assert quiet == {"log_file": "", "log_info": False, "log_warning": True, "log_error": True,
                         "log_verbose_level": 0, "log_format": "json"}
        with pytest.raises(InferenceServerException, match="'log_verbose_level' must be an integer"):
            client.update_log_settings({"log_verbose_level": -1})
        client.close()
    assert len(named(read_spans(spans_file), "ferry.gateway.infer")) == 4

