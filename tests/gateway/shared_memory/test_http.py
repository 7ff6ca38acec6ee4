"""The shared memory extension in-process through ASGI: the whole ``ferry serve``
stack on the embedded broker, real segments under /dev/shm."""

from __future__ import annotations

import asyncio
import shutil
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest

from ferry.wiring.serve import build_app
from ferry.wiring.settings import ServeSettings
from gateway.app import HttpSettings
from tests.shm_segments import Segments, contents, open_descriptors, write_gated_model

MODEL_REPO = Path(__file__).resolve().parents[3] / "model_repo"
A, B = np.arange(16, dtype=np.float32), np.full(16, 2, dtype=np.float32)


@pytest.fixture
def segments() -> Iterator[Segments]:
    with Segments() as made:
        yield made


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    shutil.copytree(MODEL_REPO / "add_sub", tmp_path / "add_sub")
    (tmp_path / "gate").mkdir()
    write_gated_model(tmp_path, tmp_path / "gate")
    return tmp_path


async def _client(repo: Path, allow: bool) -> AsyncIterator[httpx.AsyncClient]:
    app = build_app(ServeSettings(model_repository=repo, http=HttpSettings(allow_client_shm=allow)))
    async with app.router.lifespan_context(app):
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://ferry") as http:
            yield http


@pytest.fixture
async def client(repo: Path) -> AsyncIterator[httpx.AsyncClient]:
    async for http in _client(repo, allow=True):
        yield http


@pytest.fixture
async def disabled(repo: Path) -> AsyncIterator[httpx.AsyncClient]:
    async for http in _client(repo, allow=False):
        yield http


def shm(region: str, byte_size: int, offset: int = 0) -> dict[str, object]:
    return {"parameters": {"shared_memory_region": region, "shared_memory_byte_size": byte_size,
                           "shared_memory_offset": offset}}


def add_sub_body(region: str, out_region: str | None = None, out_size: int = 64) -> dict[str, object]:
    inputs = [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 16], **shm(region, 64)},
              {"name": "INPUT1", "datatype": "FP32", "shape": [1, 16], **shm(region, 64, 64)}]
    outputs = [{"name": f"OUTPUT{i}", **shm(out_region, out_size, i * out_size)} for i in (0, 1)] if out_region else []
    return {"inputs": inputs, "outputs": outputs}


async def register(client: httpx.AsyncClient, name: str, key: str, byte_size: int, offset: int = 0) -> None:
    response = await client.post(f"/v2/systemsharedmemory/region/{name}/register",
                                 json={"key": key, "offset": offset, "byte_size": byte_size})
    assert response.status_code == 200, response.text


def floats(key: str, start: int, count: int = 16) -> np.ndarray:
    return np.frombuffer(contents(key)[start:start + 4 * count], dtype=np.float32)


async def test_inputs_and_outputs_travel_through_shared_memory(client, segments):
    key = segments.make(256, A.tobytes() + B.tobytes())
    await register(client, "io", key, 256)
    body = add_sub_body("io")
    body["outputs"] = [{"name": "OUTPUT0", **shm("io", 64, 128)}, {"name": "OUTPUT1", **shm("io", 64, 192)}]
    response = await client.post("/v2/models/add_sub/infer", json=body)
    assert response.status_code == 200, response.text
    assert response.json()["outputs"] == [
        {"name": "OUTPUT0", "datatype": "FP32", "shape": [1, 16], **shm("io", 64, 128)},
        {"name": "OUTPUT1", "datatype": "FP32", "shape": [1, 16], **shm("io", 64, 192)}]
    np.testing.assert_array_equal(floats(key, 128), A + B)
    np.testing.assert_array_equal(floats(key, 192), A - B)


async def test_inputs_from_shared_memory_with_outputs_in_the_response(client, segments):
    await register(client, "in", segments.make(128, A.tobytes() + B.tobytes()), 128)
    response = await client.post("/v2/models/add_sub/infer", json=add_sub_body("in"))
    assert response.status_code == 200, response.text
    assert response.json()["outputs"][0]["data"] == (A + B).tolist()


async def test_status_register_and_unregister_leave_nothing_open(client, segments):
    key = segments.make(64)
    await register(client, "a", key, 32)
    await register(client, "b", key, 32, offset=32)
    assert (await client.get("/v2/systemsharedmemory/region/b/status")).json() == [
        {"name": "b", "key": key, "offset": 32, "byte_size": 32}]
    assert open_descriptors(key) == 2
    assert (await client.post("/v2/systemsharedmemory/region/a/unregister")).status_code == 200
    assert [row["name"] for row in (await client.get("/v2/systemsharedmemory/status")).json()] == ["b"]
    assert (await client.post("/v2/systemsharedmemory/unregister")).status_code == 200
    assert (await client.get("/v2/systemsharedmemory/status")).json() == []
    assert open_descriptors(key) == 0


async def test_shutdown_closes_every_region_and_leaves_the_segments(repo, segments):
    key = segments.make(64)
    async for http in _client(repo, allow=True):
        await register(http, "a", key, 64)
        assert open_descriptors(key) == 1
    assert open_descriptors(key) == 0 and contents(key) == bytes(64)


@pytest.mark.parametrize("again", [False, True], ids=["unregistered", "unregistered and registered again"])
async def test_a_region_unregistered_while_its_request_is_in_flight_is_a_400_and_untouched(
        client, segments, repo, again):
    out = segments.make(16, b"\xee" * 16)
    await register(client, "in", segments.make(16, np.ones(4, np.float32).tobytes()), 16)
    await register(client, "out", out, 16)
    body = {"inputs": [{"name": "IN", "datatype": "FP32", "shape": [4], **shm("in", 16)}],
            "outputs": [{"name": "OUT", **shm("out", 16)}]}
    infer = asyncio.create_task(client.post("/v2/models/gated/infer", json=body, timeout=60))
    while not (repo / "gate/entered").exists():
        await asyncio.sleep(0.01)
    assert (await client.post("/v2/systemsharedmemory/region/out/unregister")).status_code == 200
    other = segments.make(16, b"\xdd" * 16)
    if again:
        await register(client, "out", other, 16)
    (repo / "gate/open").touch()
    response = await infer
    assert response.status_code == 400
    assert response.json()["error"] == ("output 'OUT': shared memory region 'out' was unregistered while the "
                                        "request was in flight; nothing was written to it")
    assert contents(out) == b"\xee" * 16 and contents(other) == b"\xdd" * 16


async def test_an_output_region_too_small_is_a_400_and_no_output_is_written(client, segments):
    await register(client, "in", segments.make(128, A.tobytes() + B.tobytes()), 128)
    out = segments.make(128, b"\xee" * 128)
    await register(client, "out", out, 128)
    body = add_sub_body("in")
    body["outputs"] = [{"name": "OUTPUT0", **shm("out", 64)}, {"name": "OUTPUT1", **shm("out", 32, 64)}]
    response = await client.post("/v2/models/add_sub/infer", json=body)
    assert (response.status_code, response.json()["error"]) == (400, (
        "shared memory size specified with the request for output 'OUTPUT1' (32 bytes) should be at least "
        "64 bytes to hold the results"))
    assert contents(out) == b"\xee" * 128


async def test_a_read_only_segment_takes_no_output_and_the_model_is_not_run(client, segments):
    key = segments.make(128, A.tobytes() + B.tobytes(), mode=0o400)
    await register(client, "ro", key, 128)
    response = await client.post("/v2/models/add_sub/infer", json=add_sub_body("ro", "ro", 32))
    assert response.status_code == 400 and "is read-only to the server" in response.json()["error"]
    assert contents(key) == A.tobytes() + B.tobytes()


async def test_inputs_beyond_what_an_envelope_carries_are_refused_before_reading(client, segments):
    size = 280 * 1024 * 1024  # sparse: tmpfs allocates no page until one is written
    await register(client, "big", segments.make(size), size)
    body = {"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, size // 4], **shm("big", size)}]}
    response = await client.post("/v2/models/add_sub/infer", json=body)
    assert response.status_code == 413 and "a request envelope may carry" in response.json()["error"]


async def test_other_doors_refuse_shared_memory(client, segments):
    await register(client, "in", segments.make(128, A.tobytes() + B.tobytes()), 128)
    stream = await client.post("/v2/models/add_sub/infer_stream", json=add_sub_body("in"))
    assert stream.status_code == 400
    assert stream.json()["error"] == ("input 'INPUT0': shared memory region 'in' can be used only through "
                                      "POST /v2/models/<model>/infer")
    job = await client.post("/v2/models/add_sub/infer", json=add_sub_body("in", "in", 16),
                            headers={"Prefer": "respond-async"})
    assert job.status_code == 400 and "cannot receive the outputs of an async job" in job.json()["error"]


async def test_an_async_job_may_take_its_inputs_from_shared_memory(client, segments):
    await register(client, "in", segments.make(128, A.tobytes() + B.tobytes()), 128)
    submitted = await client.post("/v2/models/add_sub/infer", json=add_sub_body("in"),
                                  headers={"Prefer": "respond-async"})
    assert submitted.status_code == 202, submitted.text
    for _ in range(500):
        result = await client.get(submitted.headers["location"])
        if "outputs" in result.json():
            break
        await asyncio.sleep(0.02)
    assert result.json()["outputs"][1]["data"] == (A - B).tolist()


@pytest.mark.parametrize("body, message", [
    ({"offset": 0, "byte_size": 8}, "Shared memory register request has no 'key' field"),
    ({"key": "/k", "offset": 0}, "Shared memory register request has no 'byte_size' field"),
    ({"key": 5, "byte_size": 8}, "Shared memory register request field 'key' must be a string, got an integer"),
    ({"key": "/k", "offset": -1, "byte_size": 8},
     "Shared memory register request field 'offset' must be a non-negative integer, got -1"),
    ([], "Shared memory register request must be a JSON object, got an array"),
])
async def test_a_bad_register_request_is_a_400_naming_the_field(client, body, message):
    response = await client.post("/v2/systemsharedmemory/region/r/register", json=body)
    assert (response.status_code, response.json()) == (400, {"error": message})


async def test_unknown_region_status_is_a_404_and_an_unknown_region_in_a_request_a_400(client):
    status = await client.get("/v2/systemsharedmemory/region/nope/status")
    assert (status.status_code, status.json()) == (404, {"error": "Unable to find system shared memory region: 'nope'"})
    infer = await client.post("/v2/models/add_sub/infer", json=add_sub_body("nope"))
    assert (infer.status_code, infer.json()) == (400, {
        "error": "input 'INPUT0': Unable to find shared memory region: 'nope'"})


async def test_without_allow_client_shm_registering_is_a_501_as_in_triton(disabled, segments):
    message = "Client shared memory is disabled. Start the server with '--allow-client-shm=true' to enable."
    for path in ("/v2/systemsharedmemory/region/r/register", "/v2/systemsharedmemory/region/r/unregister",
                 "/v2/systemsharedmemory/unregister", "/v2/cudasharedmemory/unregister"):
        response = await disabled.post(path, json={"key": segments.make(8), "byte_size": 8})
        assert (response.status_code, response.json()) == (501, {"error": message}), path
    assert (await disabled.get("/v2/systemsharedmemory/status")).json() == []
    assert "system_shared_memory" in (await disabled.get("/v2")).json()["extensions"]


async def test_cuda_shared_memory_has_no_regions_here(client, segments):
    await register(client, "sys", segments.make(8), 8)
    assert (await client.get("/v2/cudasharedmemory/status")).json() == []
    assert (await client.post("/v2/cudasharedmemory/unregister")).status_code == 200
    named = await client.get("/v2/cudasharedmemory/region/sys/status")
    assert (named.status_code, named.json()["error"]) == (
        404, "The region named 'sys' is registered as system shared memory, not CUDA shared memory")
    refused = await client.post("/v2/cudasharedmemory/region/c/register", json={})
    assert (refused.status_code, refused.json()["error"]) == (
        400, "failed to register CUDA shared memory region: 'c', GPUs not supported")
