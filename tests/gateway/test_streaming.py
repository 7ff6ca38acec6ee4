"""Decoupled models answer 0..N times per request, over SSE and a WebSocket,
against a real ``ferry serve``; each response says whether it is the final one."""

from __future__ import annotations

import asyncio
import json
import struct
from collections.abc import Iterator

import httpx
import numpy as np
import pytest
import websockets

from tests.models import write_countdown_model, write_python_model
from tests.servers import ferry_serve

DOUBLE = """
class Model:
    def infer(self, inputs):
        return {"Y": inputs["X"] * 2}
"""
DOUBLE_CONFIG = """
name: "double"
backend: "python"
max_batch_size: 4
input [ { name: "X" data_type: TYPE_FP32 dims: [ 2 ] } ]
output [ { name: "Y" data_type: TYPE_FP32 dims: [ 2 ] } ]
"""


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    repo = tmp_path_factory.mktemp("repo")
    write_countdown_model(repo)
    write_python_model(repo, "double", DOUBLE, DOUBLE_CONFIG)
    with ferry_serve(repo, log_path=tmp_path_factory.mktemp("log") / "serve.log") as url:
        yield url


def events(response: httpx.Response) -> list[dict[str, object]]:
    assert response.headers["content-type"].startswith("text/event-stream")
    return [json.loads(line[len("data: "):]) for line in response.text.splitlines() if line.startswith("data: ")]


def n_input(n: int) -> dict[str, object]:
    return {"name": "N", "datatype": "INT32", "shape": [1], "data": [n]}


def test_generate_stream_sends_an_event_per_response(server: str) -> None:
    response = httpx.post(f"http://{server}/v2/models/countdown/generate_stream", json={"N": 3}, timeout=30)
    assert response.status_code == 200
    assert [(e["OUT"], e["WORD"]) for e in events(response)] == [(3, "t-3"), (2, "t-2"), (1, "t-1")]


def test_infer_stream_tags_each_response_and_ends_with_the_final_one(server: str) -> None:
    response = httpx.post(f"http://{server}/v2/models/countdown/infer_stream",
                          json={"id": "c1", "inputs": [n_input(2)]}, timeout=30)
    got = events(response)
    assert [e["parameters"]["triton_final_response"] for e in got] == [False, False, True]
    assert [e["outputs"][0]["data"] for e in got[:2]] == [[2], [1]]
    assert got[-1]["outputs"] == [] and all(e["id"] == "c1" for e in got)


def test_zero_responses_is_just_the_final_flag(server: str) -> None:
    response = httpx.post(f"http://{server}/v2/models/countdown/infer_stream", json={"inputs": [n_input(0)]},
                          timeout=30)
    assert [e["parameters"] for e in events(response)] == [{"triton_final_response": True}]
    assert events(httpx.post(f"http://{server}/v2/models/countdown/generate_stream", json={"N": 0}, timeout=30)) == []


def test_a_model_error_ends_the_stream_with_an_error_event(server: str) -> None:
    response = httpx.post(f"http://{server}/v2/models/countdown/generate_stream", json={"N": -1}, timeout=30)
    (only,) = events(response)
    assert "must not be negative" in str(only["error"])


def test_bad_stream_requests_get_4xx_before_any_event(server: str) -> None:
    base = f"http://{server}/v2/models"
    assert httpx.post(f"{base}/countdown/generate_stream", json={"NOPE": 1}, timeout=30).status_code == 400
    assert httpx.post(f"{base}/countdown/generate_stream", content=b"{", timeout=30).status_code == 400
    assert httpx.post(f"{base}/missing/generate_stream", json={"N": 1}, timeout=30).status_code == 404
    refused = httpx.post(f"{base}/countdown/infer", json={"inputs": [n_input(1)]}, timeout=30)
    assert refused.status_code == 400 and "decoupled" in refused.json()["error"]


def test_generate_and_streams_also_serve_ordinary_models(server: str) -> None:
    base = f"http://{server}/v2/models/double"
    assert httpx.post(f"{base}/generate", json={"X": [1.5, 2]}, timeout=30).json()["Y"] == [3.0, 4.0]
    streamed = events(httpx.post(f"{base}/generate_stream", json={"X": [1, 2]}, timeout=30))
    assert [e["Y"] for e in streamed] == [[2.0, 4.0]]
    too_many = httpx.post(f"http://{server}/v2/models/countdown/generate", json={"N": 2}, timeout=30)
    assert too_many.status_code == 400 and "generate_stream" in too_many.json()["error"]


async def collect(socket: websockets.ClientConnection, finals: int) -> list[dict[str, object]]:
    got: list[dict[str, object]] = []
    while sum(1 for e in got if e.get("parameters", {}).get("triton_final_response")) < finals:  # type: ignore[union-attr]
        got.append(json.loads(await asyncio.wait_for(socket.recv(), 30)))
    return got


async def test_websocket_streams_responses_of_concurrent_requests(server: str) -> None:
    async with websockets.connect(f"ws://{server}/v2/models/countdown/stream") as socket:
        for name, n in (("a", 2), ("b", 3)):
            await socket.send(json.dumps({"id": name, "inputs": [n_input(n)]}))
        got = await collect(socket, 2)
    by_id = {name: [e["outputs"][0]["data"][0] for e in got if e["id"] == name and e["outputs"]]  # type: ignore[index]
             for name in ("a", "b")}
    assert by_id == {"a": [2, 1], "b": [3, 2, 1]}


async def test_websocket_takes_binary_messages_and_survives_bad_ones(server: str) -> None:
    header = json.dumps({"id": "bin", "inputs": [{"name": "X", "datatype": "FP32", "shape": [1, 2],
                                                  "parameters": {"binary_data_size": 8}}]}).encode()
    blob = np.array([[1, 2]], dtype=np.float32).tobytes()
    async with websockets.connect(f"ws://{server}/v2/models/double/stream") as socket:
        await socket.send("not json")
        await socket.send(b"\x01")
        await socket.send(json.dumps({"id": "wrong", "inputs": [n_input(1)]}))
        await socket.send(struct.pack("<I", len(header)) + header + blob)
        got = await collect(socket, 4)
    errors = [e for e in got if "error" in e]
    assert len(errors) == 3
    assert any("has no input 'N'" in str(e["error"]) and e.get("id") == "wrong" for e in errors), errors
    (answer,) = [e for e in got if "error" not in e]
    assert answer["id"] == "bin" and answer["outputs"][0]["data"] == [2.0, 4.0]  # type: ignore[index]
