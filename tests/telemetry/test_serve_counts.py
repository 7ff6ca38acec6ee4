"""Metrics after a run: a real ``ferry serve`` answers a known number of
requests of known batch shapes, and its ``/metrics`` reports exactly those
counts, with durations that fit the wall time they took."""

from __future__ import annotations

import shutil
import time
import urllib.request
from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as httpclient
from prometheus_client.parser import text_string_to_metric_families
from tritonclient.utils import InferenceServerException

from tests.servers import ferry_serve

MODEL_REPO = Path(__file__).resolve().parents[2] / "model_repo"
MODEL = "add_sub"
VERSIONED = (("model", MODEL), ("version", "1"))
SEQUENTIAL_ROWS = [1, 2, 3, 4, 5, 8]
BURST = 24


Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def scrape(url: str) -> Samples:
    with urllib.request.urlopen(f"http://{url}/metrics", timeout=5) as response:
        text = response.read().decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def inputs(rows: int, width: int = 16) -> list[httpclient.InferInput]:
    tensors = []
    for name in ("INPUT0", "INPUT1"):
        tensor = httpclient.InferInput(name, [rows, width], "FP32")
        tensor.set_data_from_numpy(np.ones((rows, width), np.float32))
        tensors.append(tensor)
    return tensors


def bucket_at(samples: Samples, family: str, bound: float) -> float:
    """Observations at or below the smallest bucket bound >= ``bound``."""
    rows = sorted((float(dict(labels)["le"]), value) for (name, labels), value in samples.items()
                  if name == f"{family}_bucket" and dict(labels)["model"] == MODEL)
    return next(value for le, value in rows if le >= bound)


@pytest.fixture(scope="module")
def url(tmp_path_factory: pytest.TempPathFactory):
    repo = tmp_path_factory.mktemp("repo")
    shutil.copytree(MODEL_REPO / MODEL, repo / MODEL)
    with ferry_serve(repo, "--backlog-interval-s", "0.2") as served:
        yield served


def test_counts_are_exact_and_durations_plausible(url: str):
    client = httpclient.InferenceServerClient(url, concurrency=8)
    try:
        started = time.perf_counter()
        for rows in SEQUENTIAL_ROWS:  # one at a time: each is a batch of its own
            client.infer(MODEL, inputs(rows))
        sequential_wall = time.perf_counter() - started
        after_sequential = scrape(url)

        started = time.perf_counter()
        pending = [client.async_infer(MODEL, inputs(1)) for _ in range(BURST)]
        for request in pending:
            request.get_result()
        burst_wall = time.perf_counter() - started
        after_burst = scrape(url)

        for _ in range(2):  # a shape the model does not take: refused by the worker
            with pytest.raises(InferenceServerException, match="shape"):
                client.infer(MODEL, inputs(1, width=15))
        final = scrape(url)
    finally:
        client.close()

    n, rows = len(SEQUENTIAL_ROWS), sum(SEQUENTIAL_ROWS)
    assert after_sequential[("ferry_inference_request_success_total", VERSIONED)] == n
    assert after_sequential[("ferry_inference_count_total", VERSIONED)] == rows
    assert after_sequential[("ferry_inference_exec_count_total", VERSIONED)] == n
    assert after_sequential[("ferry_inference_batch_size_sum", VERSIONED)] == rows
    for size in (1, 2, 4, 8):  # the batch-size buckets hold exactly the shapes sent
        assert bucket_at(after_sequential, "ferry_inference_batch_size", size) == sum(r <= size for r in SEQUENTIAL_ROWS)
    # Sequential requests do not overlap, so their durations add up to less than the wall time.
    request_sum = after_sequential[("ferry_inference_request_duration_seconds_sum", VERSIONED)]
    queue_sum = after_sequential[("ferry_inference_queue_duration_seconds_sum", VERSIONED)]
    compute_sum = after_sequential[("ferry_inference_compute_duration_seconds_sum", VERSIONED)]
    assert 0 < queue_sum + compute_sum <= request_sum <= sequential_wall, (queue_sum, compute_sum, request_sum)
    assert after_sequential[("ferry_inference_request_duration_seconds_count", VERSIONED)] == n

    assert after_burst[("ferry_inference_request_success_total", VERSIONED)] == n + BURST
    assert after_burst[("ferry_inference_count_total", VERSIONED)] == rows + BURST
    batches = after_burst[("ferry_inference_exec_count_total", VERSIONED)]
    assert after_burst[("ferry_inference_batch_size_count", VERSIONED)] == batches
    assert after_burst[("ferry_inference_batch_size_sum", VERSIONED)] == rows + BURST
    assert n < batches <= n + BURST
    # Every burst request took at most the burst's wall time.
    count = after_burst[("ferry_inference_request_duration_seconds_count", VERSIONED)]
    assert count == n + BURST
    assert bucket_at(after_burst, "ferry_inference_request_duration_seconds", burst_wall + sequential_wall) == count

    failure = ("ferry_inference_request_failure_total", (*VERSIONED[:1], ("reason", "invalid_argument"),
                                                         VERSIONED[1]))
    assert final[failure] == 2
    assert final[("ferry_inference_request_success_total", VERSIONED)] == n + BURST
    assert final[("ferry_inference_pending_request_count", (("model", MODEL),))] == 0
    assert final[("ferry_http_requests_total", (("code", "200"), ("model", MODEL)))] == n + BURST
    assert final[("ferry_http_requests_total", (("code", "400"), ("model", MODEL)))] == 2
    assert final[("ferry_http_request_duration_seconds_count", (("model", MODEL),))] == n + BURST + 2
    assert final[("ferry_workers_live", ())] == 1
