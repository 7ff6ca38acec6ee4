"""Triton's response cache in ``ferry serve``, in-process through ASGI: hits, misses,
eviction by size, byte-identical answers, the statistics, and the models never cached."""

from __future__ import annotations

import shutil
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import tritonclient.http as triton

from ferry.wiring.serve import build_app
from ferry.wiring.settings import ServeSettings
from tests.models import COUNTDOWN_CONFIG, write_countdown_model
from workers.cache.settings import CacheSettings

MODEL_REPO = Path(__file__).resolve().parents[1] / "model_repo"
CACHED = "\nresponse_cache { enable: true }\n"


def cached_copy(repo: Path, model: str) -> None:
    shutil.copytree(MODEL_REPO / model, repo / model)
    config = repo / model / "config.pbtxt"
    config.write_text(config.read_text() + CACHED)


@asynccontextmanager
async def serving(repo: Path, cache: CacheSettings | None) -> AsyncIterator[httpx.AsyncClient]:
    app: Any = build_app(ServeSettings(model_repository=repo, cache=cache))
    async with app.router.lifespan_context(app):
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://ferry") as http:
            yield http


def add_sub_body(value: float) -> tuple[bytes, int]:
    tensors = [triton.InferInput(n, [1, 16], "FP32") for n in ("INPUT0", "INPUT1")]
    for tensor in tensors:
        tensor.set_data_from_numpy(np.full((1, 16), value, dtype=np.float32))
    outputs = [triton.InferRequestedOutput(n, binary_data=True) for n in ("OUTPUT0", "OUTPUT1")]
    return triton.InferenceServerClient.generate_request_body(tensors, outputs=outputs)


async def infer(http: httpx.AsyncClient, value: float) -> bytes:
    body, length = add_sub_body(value)
    answer = await http.post("/v2/models/add_sub/infer", content=body,
                             headers={"Inference-Header-Content-Length": str(length)})
    assert answer.status_code == 200, answer.text
    return answer.content


async def stats(http: httpx.AsyncClient, model: str) -> dict[str, Any]:
    (row,) = (await http.get(f"/v2/models/{model}/stats")).json()["model_stats"]
    return row


async def test_a_repeated_request_is_answered_from_the_cache_byte_for_byte(tmp_path: Path) -> None:
    cached_copy(tmp_path, "add_sub")
    async with serving(tmp_path, CacheSettings(kind="local", size_bytes=1 << 20)) as http:
        first = await infer(http, 1.5)
        second = await infer(http, 1.5)
        assert second == first  # the whole body: JSON header and output bytes
        result = triton.InferenceServerClient.parse_response_body(second, header_length=len(second) - 128)
        np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), np.full((1, 16), 3.0, dtype=np.float32))
        assert await infer(http, 2.5) != first
        row = await stats(http, "add_sub")
        inference = row["inference_stats"]
        assert inference["cache_hit"]["count"] == 1 and inference["cache_hit"]["ns"] > 0
        assert inference["cache_miss"]["count"] == 2 and inference["cache_miss"]["ns"] > 0
        assert inference["success"]["count"] == 3
        assert (row["execution_count"], row["inference_count"]) == (2, 2)  # the hit ran nothing
        metrics = (await http.get("/metrics")).text
        assert 'ferry_cache_hits_total{model="add_sub",version="1"} 1.0' in metrics
        assert 'ferry_cache_misses_total{model="add_sub",version="1"} 2.0' in metrics


async def test_the_local_cache_evicts_past_its_size(tmp_path: Path) -> None:
    cached_copy(tmp_path, "add_sub")
    async with serving(tmp_path, CacheSettings(kind="local", size_bytes=400)) as http:  # room for one answer
        for value in (1.0, 2.0, 1.0, 1.0):
            await infer(http, value)
        inference = (await stats(http, "add_sub"))["inference_stats"]
        assert (inference["cache_miss"]["count"], inference["cache_hit"]["count"]) == (3, 1)


async def test_without_a_cache_config_or_the_models_consent_nothing_is_cached(tmp_path: Path) -> None:
    cached_copy(tmp_path, "add_sub")
    async with serving(tmp_path, None) as http:
        await infer(http, 1.0)
        await infer(http, 1.0)
        row = await stats(http, "add_sub")
        assert row["execution_count"] == 2 and row["inference_stats"]["cache_miss"]["count"] == 0
    shutil.rmtree(tmp_path / "add_sub")
    shutil.copytree(MODEL_REPO / "add_sub", tmp_path / "add_sub")  # response_cache off
    async with serving(tmp_path, CacheSettings(kind="local", size_bytes=1 << 20)) as http:
        await infer(http, 1.0)
        await infer(http, 1.0)
        row = await stats(http, "add_sub")
        assert row["execution_count"] == 2 and row["inference_stats"]["cache_hit"]["count"] == 0


async def test_sequences_and_decoupled_models_are_never_cached(tmp_path: Path) -> None:
    cached_copy(tmp_path, "stateful_gru")
    write_countdown_model(tmp_path)
    config = tmp_path / "countdown/config.pbtxt"
    config.write_text(COUNTDOWN_CONFIG + CACHED)
    async with serving(tmp_path, CacheSettings(kind="local", size_bytes=1 << 20)) as http:
        features = np.full((1, 2, 16), 0.25, dtype=np.float32).ravel().tolist()
        logits = []
        for start in (True, False):  # the same features twice: the state differs, and so must the answer
            body = {"parameters": {"sequence_id": 7, "sequence_start": start},
                    "inputs": [{"name": "FEATURES", "shape": [1, 2, 16], "datatype": "FP32", "data": features}]}
            answer = await http.post("/v2/models/stateful_gru/infer", json=body)
            assert answer.status_code == 200, answer.text
            logits.append(answer.json()["outputs"][0]["data"])
        assert logits[0] != logits[1]
        for _ in range(2):
            body = {"inputs": [{"name": "N", "shape": [1], "datatype": "INT32", "data": [3]}]}
            events = (await http.post("/v2/models/countdown/infer_stream", json=body)).text
            assert events.count("data:") >= 3, events
        for model in ("stateful_gru", "countdown"):
            inference = (await stats(http, model))["inference_stats"]
            assert inference["cache_hit"]["count"] == inference["cache_miss"]["count"] == 0, model
