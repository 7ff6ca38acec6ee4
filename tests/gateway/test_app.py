"""The gateway in-process through ASGI, on the embedded broker."""

from __future__ import annotations

import shutil
from pathlib import Path

import httpx
import pytest

from ferry.wiring.serve import build_app
from ferry.wiring.settings import ServeSettings

MODEL_REPO = Path(__file__).resolve().parents[2] / "model_repo"


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    shutil.copytree(MODEL_REPO / "add_sub", tmp_path / "add_sub")
    broken = tmp_path / "broken"
    (broken / "1").mkdir(parents=True)
    shutil.copy(MODEL_REPO / "add_sub/1/model.onnx", broken / "1/model.onnx")
    (broken / "config.pbtxt").write_text('name: "broken"\nmax_batch_size: -3\n')
    return tmp_path


@pytest.fixture
async def client(repo: Path):
    app = build_app(ServeSettings(model_repository=repo))
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://ferry") as http:
            yield http


async def test_a_broken_config_is_reported_by_file_and_field_and_the_rest_still_serve(client):
    index = (await client.post("/v2/repository/index")).json()
    states = {row["name"]: row for row in index}
    assert states["add_sub"]["state"] == "READY"
    assert states["broken"]["state"] == "UNAVAILABLE"
    assert "config.pbtxt" in states["broken"]["reason"] and "max_batch_size" in states["broken"]["reason"]
    body = {"inputs": [{"name": n, "shape": [1, 16], "datatype": "FP32", "data": [2.0] * 16}
                       for n in ("INPUT0", "INPUT1")]}
    response = await client.post("/v2/models/add_sub/infer", json=body)
    assert response.status_code == 200
    assert (await client.post("/v2/models/broken/infer", json=body)).status_code == 404


async def test_readiness_counts_the_models_whose_configs_are_valid(client):
    # A rejected config is reported in the index and the log; it does not hold
    # the whole server unready, so one unsupported model in a Triton repository
    # does not take the others down with it.
    assert (await client.get("/v2/health/live")).status_code == 200
    assert (await client.get("/v2/health/ready")).status_code == 200
    assert (await client.get("/v2/models/add_sub/ready")).status_code == 200
    assert (await client.get("/v2/models/broken/ready")).status_code == 404


async def test_server_is_not_ready_before_its_worker_has_loaded_the_models(repo):
    app = build_app(ServeSettings(model_repository=repo))
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://ferry") as http:
        assert (await http.get("/v2/health/ready")).status_code == 503
        assert (await http.get("/v2/models/add_sub/ready")).status_code == 400


async def test_unknown_routes_and_methods_answer_json_errors(client):
    missing = await client.get("/v3/whatever")
    assert missing.status_code == 404 and "error" in missing.json()
    wrong_method = await client.get("/v2/models/add_sub/infer")
    assert wrong_method.status_code in (400, 405) and "error" in wrong_method.json()
