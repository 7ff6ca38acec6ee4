"""A worker's spans from request timelines, in process: what each span covers,
what is left out, and how sampling decides, written by the real jsonl exporter."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path

import pytest

from workers.telemetry import Timeline
from workers.telemetry.settings import TraceSettings
from workers.telemetry.tracing import WORKER_SERVICE, open_tracing
from workers.telemetry.tracing.provider import Tracing
from workers.telemetry.tracing.worker_spans import TracingObserver
from tests.tracing.spans import made_up_parent, named, one, read_spans

T0 = 1_700_000_000_000_000_000  # wall-clock ns
MS = 1_000_000


def tracing(path: Path, rate: float = 1.0) -> Tracing:
    opened = open_tracing(TraceSettings("jsonl", file=path, rate=rate), WORKER_SERVICE)
    assert opened is not None
    return opened


def timeline(trace: dict[str, str] | None = None, **stages: int) -> Timeline:
    """A request enqueued at T0, received at +2 ms, computed from +5 to +9 ms, answered at +10 ms."""
    times = dict(enqueued_ns=T0, received_ns=T0 + 2 * MS, compute_start_ns=T0 + 5 * MS,
                 compute_end_ns=T0 + 9 * MS, done_ns=T0 + 10 * MS)
    times.update(stages)
    return Timeline("req-1", "add_sub", "1", "w1", trace=trace or {}, batch_id="b-1", batch_size=4, rows=2,
                    **times)


def observe(path: Path, *timelines: Timeline, rate: float = 1.0) -> list[dict]:
    spans = tracing(path, rate)
    observer = TracingObserver(spans)
    for one_timeline in timelines:
        observer.finished(one_timeline)
    asyncio.run(spans.aclose())  # flushes
    return read_spans(path)


def test_a_sampled_request_becomes_four_nested_spans_at_its_stage_times(tmp_path: Path) -> None:
    parent, trace_id, span_id = made_up_parent()
    spans = observe(tmp_path / "spans.jsonl", timeline({"traceparent": parent}))
    assert sorted(s["name"] for s in spans) == sorted(
        ["ferry.worker.request", "ferry.queue_wait", "ferry.batch_formation", "ferry.compute"])
    assert {s["trace_id"] for s in spans} == {trace_id}
    request = one(spans, "ferry.worker.request")
    assert request["parent_id"] == span_id and request["service"] == "ferry-worker"
    assert (request["start_ns"], request["end_ns"]) == (T0, T0 + 10 * MS)
    assert request["attributes"] == {
        "ferry.model": "add_sub", "ferry.model_version": "1", "ferry.request_id": "req-1",
        "ferry.worker_id": "w1", "ferry.outcome": "success", "ferry.rows": 2,
        "ferry.batch_id": "b-1", "ferry.batch_size": 4,
    }
    expected = {"ferry.queue_wait": (T0, T0 + 2 * MS), "ferry.batch_formation": (T0 + 2 * MS, T0 + 5 * MS),
                "ferry.compute": (T0 + 5 * MS, T0 + 9 * MS)}
    for name, (start, end) in expected.items():
        stage = one(spans, name)
        assert (stage["start_ns"], stage["end_ns"]) == (start, end), stage
        assert stage["parent_id"] == request["span_id"], stage
    assert one(spans, "ferry.compute")["attributes"] == {"ferry.batch_id": "b-1", "ferry.batch_size": 4}


def test_stages_not_reached_are_left_out_and_a_failure_is_an_error(tmp_path: Path) -> None:
    refused = timeline(compute_start_ns=0, compute_end_ns=0)
    refused.batch_id, refused.outcome = "", "invalid_argument"
    spans = observe(tmp_path / "spans.jsonl", refused)
    assert sorted(s["name"] for s in spans) == ["ferry.queue_wait", "ferry.worker.request"]
    request = one(spans, "ferry.worker.request")
    assert request["status"] == "error" and request["attributes"]["ferry.outcome"] == "invalid_argument"
    assert "ferry.batch_id" not in request["attributes"]


def test_an_enqueue_stamp_after_receipt_skips_the_queue_wait(tmp_path: Path) -> None:
    """The gateway's clock is another host's: when it runs ahead, no negative span."""
    spans = observe(tmp_path / "spans.jsonl", timeline(enqueued_ns=T0 + 3 * MS))
    assert not named(spans, "ferry.queue_wait")
    assert one(spans, "ferry.worker.request")["start_ns"] == T0 + 2 * MS


def test_rate_zero_samples_no_new_trace_but_follows_a_sampled_caller(tmp_path: Path) -> None:
    parent, trace_id, _ = made_up_parent(sampled=True)
    spans = observe(tmp_path / "spans.jsonl", timeline(), timeline({"traceparent": parent}), rate=0.0)
    assert len(spans) == 4 and {s["trace_id"] for s in spans} == {trace_id}


def test_a_callers_unsampled_trace_is_followed_even_at_rate_one(tmp_path: Path) -> None:
    parent, _, _ = made_up_parent(sampled=False)
    assert observe(tmp_path / "spans.jsonl", timeline({"traceparent": parent}), rate=1.0) == []


def test_rate_one_without_a_caller_starts_a_new_trace(tmp_path: Path) -> None:
    spans = observe(tmp_path / "spans.jsonl", timeline())
    request = one(spans, "ferry.worker.request")
    assert request["parent_id"] is None and len({s["trace_id"] for s in spans}) == 1 and len(spans) == 4


def test_exporter_none_opens_nothing_and_imports_no_provider(tmp_path: Path) -> None:
    assert open_tracing(TraceSettings(), WORKER_SERVICE) is None
    # A whole `ferry serve` app built with the default settings, in a fresh interpreter.
    script = (
        "import sys\n"
        "from pathlib import Path\n"
        "from ferry.wiring.serve import build_app\n"
        "from ferry.wiring.settings import ServeSettings\n"
        f"build_app(ServeSettings(Path({str(tmp_path)!r})))\n"
        "print('workers.telemetry.tracing.provider' in sys.modules, 'opentelemetry.sdk.trace' in sys.modules)\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120,
                          cwd=Path(__file__).resolve().parents[2])
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines()[-1] == "False False", done.stdout
    assert list(tmp_path.iterdir()) == []


def test_a_trace_file_that_cannot_be_opened_is_named(tmp_path: Path) -> None:
    missing = tmp_path / "no-such-dir" / "spans.jsonl"
    with pytest.raises(ValueError, match="no-such-dir"):
        open_tracing(TraceSettings("jsonl", file=missing), WORKER_SERVICE)


def test_the_console_exporter_prints_each_span(capsys: pytest.CaptureFixture[str]) -> None:
    spans = open_tracing(TraceSettings("console"), WORKER_SERVICE)
    assert spans is not None
    TracingObserver(spans).finished(timeline())
    asyncio.run(spans.aclose())
    printed = capsys.readouterr().out
    for name in ("ferry.worker.request", "ferry.queue_wait", "ferry.batch_formation", "ferry.compute"):
        assert f'"name": "{name}"' in printed, printed
    assert '"service.name": "ferry-worker"' in printed
