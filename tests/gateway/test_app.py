"""The gateway in-process through ASGI, on the embedded broker."""

from __future__ import annotations

import gzip
import shutil
from pathlib import Path

import httpx
import orjson
import pytest
from structlog.contextvars import bind_contextvars, get_contextvars, merge_contextvars
from structlog.testing import capture_logs

from ferry.wiring.serve import build_app
from gateway.app import HttpSettings
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


async def test_unknown_models_and_versions_are_refused_in_tritons_words(client):
    body = {"inputs": [{"name": "INPUT0", "shape": [1, 16], "datatype": "FP32", "data": [2.0] * 16}]}
    unknown = await client.post("/v2/models/nope/infer", json=body)
    assert (unknown.status_code, unknown.json()) == (404, {"error": "Request for unknown model: 'nope' is not found"})
    version = await client.get("/v2/models/add_sub/versions/7")
    assert (version.status_code, version.json()) == (
        404, {"error": "Request for unknown model: 'add_sub' version 7 is not found"})
    broken = (await client.get("/v2/models/broken")).json()["error"]
    assert broken.startswith("Request for unknown model: 'broken' has no available versions: ")
    assert "max_batch_size" in broken


async def test_the_server_name_is_ferry_unless_told_otherwise(repo: Path):
    assert (await _server_metadata(repo, ServeSettings(model_repository=repo)))["name"] == "ferry"
    triton = ServeSettings(model_repository=repo, http=HttpSettings(server_name="triton"))
    assert (await _server_metadata(repo, triton))["name"] == "triton"


async def _server_metadata(repo: Path, settings: ServeSettings) -> dict:
    app = build_app(settings)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://ferry") as http:
        return (await http.get("/v2")).json()


async def test_a_body_in_an_encoding_ferry_does_not_take_is_refused_with_those_it_does(client):
    body = orjson.dumps({"inputs": [{"name": n, "shape": [1, 16], "datatype": "FP32", "data": [2.0] * 16}
                                    for n in ("INPUT0", "INPUT1")]})
    refused = await client.post("/v2/models/add_sub/infer", content=body, headers={"Content-Encoding": "br"})
    assert (refused.status_code, refused.json()) == (415, {"error": "Unsupported compression type"})
    assert refused.headers["accept-encoding"] == "gzip, deflate"
    answered = await client.post("/v2/models/add_sub/infer", content=gzip.compress(body),
                                 headers={"Content-Encoding": "gzip", "Accept-Encoding": "deflate"})
    assert answered.status_code == 200 and answered.headers["content-encoding"] == "deflate"
    assert answered.json()["outputs"][0]["data"] == [4.0] * 16  # httpx inflates it


async def test_a_compressed_body_may_not_inflate_past_the_body_limit(repo: Path):
    settings = ServeSettings(model_repository=repo, http=HttpSettings(max_body_bytes=1 << 20))
    app = build_app(settings)
    async with app.router.lifespan_context(app):
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://ferry") as http:
            bomb = gzip.compress(b" " * (8 << 20))
            refused = await http.post("/v2/models/add_sub/infer", content=bomb, headers={"Content-Encoding": "gzip"})
    assert refused.status_code == 413 and "inflates past the 1048576-byte limit" in refused.json()["error"]


async def test_statistics_count_each_request_of_the_embedded_worker(client):
    body = {"inputs": [{"name": n, "shape": [2, 16], "datatype": "FP32", "data": [1.0] * 32}
                       for n in ("INPUT0", "INPUT1")]}
    for _ in range(3):
        assert (await client.post("/v2/models/add_sub/infer", json=body)).status_code == 200
    bad = {"inputs": [{"name": n, "shape": [1, 15], "datatype": "FP32", "data": [1.0] * 15}
                      for n in ("INPUT0", "INPUT1")]}
    assert (await client.post("/v2/models/add_sub/infer", json=bad)).status_code == 400
    (stats,) = (await client.get("/v2/models/add_sub/versions/1/stats")).json()["model_stats"]
    assert (stats["name"], stats["version"], stats["inference_count"]) == ("add_sub", "1", 6)
    assert stats["inference_stats"]["success"]["count"] == 3 and stats["inference_stats"]["fail"]["count"] == 1
    assert stats["inference_stats"]["compute_infer"]["count"] == 3
    assert sum(b["compute_infer"]["count"] * b["batch_size"] for b in stats["batch_stats"]) == 6
    assert set(stats["inference_stats"]) == {"success", "fail", "queue", "compute_input", "compute_infer",
                                             "compute_output", "cache_hit", "cache_miss"}
    every = (await client.get("/v2/models/stats")).json()["model_stats"]
    assert [row["name"] for row in every] == ["add_sub"]  # the broken model has no version to report
    unknown = await client.get("/v2/models/nope/stats")
    assert (unknown.status_code, unknown.json()["error"]) == (404, "Request for unknown model: 'nope' is not found")


async def test_trace_settings_of_an_unknown_model_and_bad_log_settings_are_refused(client):
    unknown = await client.get("/v2/models/nope/trace/setting")
    assert (unknown.status_code, unknown.json()["error"]) == (404, "Request for unknown model: 'nope' is not found")
    off = (await client.get("/v2/models/add_sub/trace/setting")).json()
    assert off["trace_level"] == ["OFF"]  # this server exports no spans
    refused = await client.post("/v2/trace/setting", json={"trace_level": ["TIMESTAMPS"]})
    assert refused.status_code == 400 and "--trace-exporter" in refused.json()["error"]
    for body, error in (({"log_file": "/tmp/x"}, "'log_file' cannot be changed"),
                        ({"log_info": "yes"}, "'log_info' must be true or false"),
                        ({"log_format": "ISO8601"}, "'log_format' must be one of json, console"),
                        ({"verbose": 1}, "unknown log setting 'verbose'")):
        answer = await client.post("/v2/logging", json=body)
        assert answer.status_code == 400 and error in answer.json()["error"], answer.json()


async def test_a_requests_log_context_is_bound_while_it_runs_and_gone_after(client):
    bind_contextvars(request_id="the caller's own")  # restored, not cleared, afterwards
    bad = {"inputs": [{"name": n, "shape": [1, 16], "datatype": "FP32", "data": [2.0] * 16}
                      for n in ("INPUT0", "NOT_AN_INPUT")]}
    with capture_logs(processors=[merge_contextvars]) as logs:
        response = await client.post("/v2/models/add_sub/infer", json=bad)
    assert response.status_code == 400
    failed = [line for line in logs if line["event"] == "worker.request_failed"]
    assert failed and failed[0]["request_id"] != "the caller's own" and failed[0]["model"] == "add_sub"
    assert get_contextvars().get("request_id") == "the caller's own" and "model" not in get_contextvars()
