"""Triton's statistics over a Redis fleet of two workers: after a known load,
through ``tritonclient``, every count adds up exactly over the workers."""

from __future__ import annotations

import shutil
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.fleet.processes import Fleet, wait_for
from tests.models import write_add_sub
from tests.redis_server import flushdb

MODEL_REPO = Path(__file__).resolve().parent.parent.parent / "model_repo"
WORKER = ("--heartbeat-s", "0.2")
GOOD = 30  # requests of 1 or 2 rows
BAD = 3  # requests the worker refuses (a value the model's shape cannot take)


@pytest.fixture
def repository(tmp_path: Path) -> Path:
    repo = tmp_path / "repo"
    write_add_sub(repo, delay_us=2000)  # a few requests share a batch
    shutil.copytree(MODEL_REPO / "text_stats", repo / "text_stats")  # served, never asked
    return repo


def add_sub(url: str, rows: int) -> None:
    """One request on a client of its own (tritonclient.http's clients are not for sharing between threads)."""
    client = httpclient.InferenceServerClient(url, network_timeout=30.0)
    try:
        inputs = [httpclient.InferInput(name, [rows, 16], "FP32") for name in ("INPUT0", "INPUT1")]
        for tensor in inputs:
            tensor.set_data_from_numpy(np.ones((rows, 16), np.float32))
        client.infer("add_sub", inputs)
    finally:
        client.close()


def test_statistics_add_up_over_two_workers(redis_url: str, repository: Path, tmp_path: Path):
    flushdb(redis_url)
    with Fleet(redis_url, repository, tmp_path) as fleet:
        gateway = fleet.gateway()
        fleet.worker("w1", *WORKER)
        fleet.worker("w2", *WORKER)
        fleet.wait_model_ready(gateway, "add_sub")
        url = gateway.url.removeprefix("http://")
        rows = [1 + i % 2 for i in range(GOOD)]
        with ThreadPoolExecutor(8) as pool:
            list(pool.map(lambda n: add_sub(url, n), rows))
        for _ in range(BAD):
            with pytest.raises(InferenceServerException):
                add_sub(url, 9)  # max_batch_size is 8
        with httpclient.InferenceServerClient(url, network_timeout=30.0) as client:
            def stats() -> dict:
                (row,) = client.get_inference_statistics("add_sub")["model_stats"]
                return row

            def counted() -> tuple[int, int]:
                inference = stats()["inference_stats"]
                return inference["success"]["count"], inference["fail"]["count"]

            # Each worker's heartbeat carries its own share: wait for both counts, not the first to arrive.
            wait_for(lambda: counted() == (GOOD, BAD), 10, "the workers' heartbeats to carry every request", gateway)
            got = stats()
            inference = got["inference_stats"]
            assert (got["name"], got["version"]) == ("add_sub", "1")
            assert got["inference_count"] == sum(rows)
            assert inference["fail"]["count"] == BAD
            for part in ("queue", "compute_input", "compute_infer", "compute_output"):
                assert inference[part]["count"] == GOOD, part
                assert inference[part]["ns"] > 0, part
            assert inference["success"]["ns"] >= inference["queue"]["ns"]
            batches = got["batch_stats"]
            assert sum(b["compute_infer"]["count"] for b in batches) == got["execution_count"] > 0
            assert sum(b["batch_size"] * b["compute_infer"]["count"] for b in batches) == sum(rows)
            assert got["last_inference"] > 0

            assert client.get_inference_statistics("add_sub", "1")["model_stats"] == [got]
            everything = {row["name"]: row for row in client.get_inference_statistics()["model_stats"]}
            assert everything["add_sub"] == got
            assert everything["text_stats"]["inference_stats"]["success"] == {"count": 0, "ns": 0}
            with pytest.raises(InferenceServerException, match="Request for unknown model: 'nope' is not found"):
                client.get_inference_statistics("nope")
