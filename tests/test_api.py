"""The in-process API (``ferry.api``): the same answers as over HTTP, concurrent calls
batched together, decoupled streams, and errors with the status HTTP would give."""

from __future__ import annotations

import asyncio
import shutil
from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as httpclient

from ferry.api import AsyncServer, InferenceError, Server
from tests.models import write_countdown_model
from tests.servers import ferry_serve

MODEL_REPO = Path(__file__).resolve().parents[1] / "model_repo"


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    shutil.copytree(MODEL_REPO / "add_sub", tmp_path / "add_sub")
    config = tmp_path / "add_sub/config.pbtxt"
    # A wider window, so that calls made together are batched together.
    config.write_text(config.read_text().replace("max_queue_delay_microseconds: 100",
                                                 "max_queue_delay_microseconds: 20000"))
    write_countdown_model(tmp_path)
    return tmp_path


def pair(seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    return rng.random((1, 16), dtype=np.float32), rng.random((1, 16), dtype=np.float32)


def test_answers_equal_those_over_http(repo: Path) -> None:
    with Server(repo) as server, ferry_serve(repo) as url, httpclient.InferenceServerClient(url) as http:
        assert server.is_ready() and server.is_ready("add_sub")
        for seed in range(5):
            a, b = pair(seed)
            ours = server.infer("add_sub", {"INPUT0": a, "INPUT1": b})
            inputs = [httpclient.InferInput(n, [1, 16], "FP32") for n in ("INPUT0", "INPUT1")]
            inputs[0].set_data_from_numpy(a)
            inputs[1].set_data_from_numpy(b)
            theirs = http.infer("add_sub", inputs)
            for name in ("OUTPUT0", "OUTPUT1"):
                assert ours[name].tobytes() == theirs.as_numpy(name).tobytes()
        assert server.infer("add_sub", {"INPUT0": a, "INPUT1": b}, outputs=["OUTPUT1"]).keys() == {"OUTPUT1"}


async def test_sixty_four_concurrent_calls_are_batched_together(repo: Path) -> None:
    async with AsyncServer(repo) as server:
        pairs = [pair(seed) for seed in range(64)]
        answers = await asyncio.gather(*(server.infer("add_sub", {"INPUT0": a, "INPUT1": b}) for a, b in pairs))
        for (a, b), outputs in zip(pairs, answers):
            np.testing.assert_array_equal(outputs["OUTPUT0"], a + b)
        (row,) = (await server.statistics("add_sub"))["model_stats"]
        sizes = {batch["batch_size"] for batch in row["batch_stats"]}
        assert row["inference_count"] == 64 and row["execution_count"] <= 16 and max(sizes) == 8, row


async def test_a_decoupled_model_streams_its_responses(repo: Path) -> None:
    async with AsyncServer(repo) as server:
        got = [outputs async for outputs in server.infer_stream("countdown", {"N": np.array([3], dtype=np.int32)})]
        assert [int(o["OUT"][0]) for o in got] == [3, 2, 1]
        assert [o["WORD"][0] for o in got] == [b"t-3", b"t-2", b"t-1"]
        with pytest.raises(InferenceError) as failed:
            [o async for o in server.infer_stream("countdown", {"N": np.array([-1], dtype=np.int32)})]
        assert failed.value.status == 400 and "must not be negative" in str(failed.value)


def test_a_refused_request_raises_with_the_status_http_would_give(repo: Path) -> None:
    with Server(repo) as server:
        with pytest.raises(InferenceError) as unknown:
            server.infer("nope", {"X": np.zeros(1)})
        assert unknown.value.status == 404 and "Request for unknown model: 'nope' is not found" in str(unknown.value)
        with pytest.raises(InferenceError) as shape:
            server.infer("add_sub", {"INPUT0": np.zeros((1, 3), np.float32), "INPUT1": np.zeros((1, 3), np.float32)})
        assert shape.value.status == 400 and "INPUT0" in str(shape.value)
        with pytest.raises(InferenceError) as decoupled:
            server.infer("countdown", {"N": np.array([1], dtype=np.int32)})
        assert decoupled.value.status == 400 and "decoupled" in str(decoupled.value)
        assert [o["OUT"][0] for o in server.infer_stream("countdown", {"N": np.array([2], dtype=np.int32)})] == [2, 1]
    with pytest.raises(RuntimeError, match="not started"):
        asyncio.run(AsyncServer(repo).infer("add_sub", {}))
    with pytest.raises(ValueError, match="needs a shared broker"):
        AsyncServer(repo, worker=False)
