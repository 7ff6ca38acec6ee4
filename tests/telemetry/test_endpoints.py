"""``/metrics`` and the health probes, in-process: the gateway's app (through
ASGI) and a worker's own small server (on a loopback port)."""

from __future__ import annotations

import shutil
import socket
from pathlib import Path

import httpx
import pytest
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families

from ferry.wiring.serve import build_app
from ferry.wiring.settings import ServeSettings
from ferry.wiring.worker_http import WorkerHealth, WorkerHttp, worker_http_app
from tests.servers import free_port
from workers.telemetry.prometheus import StatsCollector
from workers.telemetry.settings import TelemetrySettings
from workers.telemetry.stats import StatsBook

MODEL_REPO = Path(__file__).resolve().parents[2] / "model_repo"
ROW = {"inputs": [{"name": n, "shape": [1, 16], "datatype": "FP32", "data": [1.0] * 16}
                  for n in ("INPUT0", "INPUT1")]}


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    shutil.copytree(MODEL_REPO / "add_sub", tmp_path / "add_sub")
    return tmp_path


async def serve(repo: Path, metrics: bool):
    app = build_app(ServeSettings(model_repository=repo, telemetry=TelemetrySettings(metrics=metrics)))
    return app, httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://ferry")


async def test_the_gateway_counts_inference_requests_by_model_and_code(repo: Path):
    app, http = await serve(repo, metrics=True)
    async with app.router.lifespan_context(app), http:
        assert (await http.post("/v2/models/add_sub/infer", json=ROW)).status_code == 200
        assert (await http.post("/v2/models/add_sub/versions/1/infer", json=ROW)).status_code == 200
        assert (await http.post("/v2/models/add_sub/infer", content=b"{")).status_code == 400
        assert (await http.post("/v2/models/nope/infer", json=ROW)).status_code == 404
        assert (await http.get("/v2/models/add_sub/ready")).status_code == 200  # not an inference
        scraped = await http.get("/metrics")
    assert scraped.status_code == 200 and scraped.headers["content-type"].startswith("text/plain")
    found = samples(scraped.text)
    assert found[("ferry_http_requests_total", (("code", "200"), ("model", "add_sub")))] == 2
    assert found[("ferry_http_requests_total", (("code", "400"), ("model", "add_sub")))] == 1
    # A name the catalog does not know cannot mint a label value.
    assert found[("ferry_http_requests_total", (("code", "404"), ("model", "_unknown")))] == 1
    assert sum(v for (name, _), v in found.items() if name == "ferry_http_requests_total") == 4
    assert found[("ferry_http_request_duration_seconds_count", (("model", "add_sub"),))] == 3
    # In one process the worker's own numbers are on the same page.
    assert found[("ferry_inference_request_success_total", (("model", "add_sub"), ("version", "1")))] == 2
    assert found[("ferry_workers_live", ())] == 1


async def test_no_metrics_removes_the_route(repo: Path):
    app, http = await serve(repo, metrics=False)
    async with app.router.lifespan_context(app), http:
        assert (await http.post("/v2/models/add_sub/infer", json=ROW)).status_code == 200
        assert (await http.get("/metrics")).status_code == 404


async def test_a_worker_is_ready_only_between_loading_and_draining():
    health = WorkerHealth()
    stats = StatsBook()
    registry = CollectorRegistry()
    registry.register(StatsCollector(stats, "w7"))
    app = worker_http_app(health, registry)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://worker") as http:
        assert (await http.get("/v2/health/live")).status_code == 200
        assert (await http.get("/v2/health/ready")).status_code == 503
        health.started()
        assert (await http.get("/v2/health/ready")).status_code == 200
        health.draining()
        assert (await http.get("/v2/health/ready")).status_code == 503
        assert (await http.get("/v2/health/live")).status_code == 200
        found = samples((await http.get("/metrics")).text)
    assert found[("ferry_worker_info", (("worker", "w7"),))] == 1


async def test_a_worker_without_metrics_still_answers_its_probes():
    app = worker_http_app(WorkerHealth(), None)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://worker") as http:
        assert (await http.get("/metrics")).status_code == 404
        assert (await http.get("/v2/health/live")).status_code == 200


async def test_the_worker_server_listens_on_its_port_and_stops():
    port = free_port()
    server = WorkerHttp(worker_http_app(WorkerHealth(), None), "127.0.0.1", port)
    await server.start()
    try:
        async with httpx.AsyncClient() as http:
            assert (await http.get(f"http://127.0.0.1:{port}/v2/health/live")).status_code == 200
    finally:
        await server.aclose()
    with pytest.raises(httpx.ConnectError):
        async with httpx.AsyncClient() as http:
            await http.get(f"http://127.0.0.1:{port}/v2/health/live")


async def test_a_taken_port_is_reported_by_its_flag():
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        server = WorkerHttp(worker_http_app(WorkerHealth(), None), "127.0.0.1", port)
        with pytest.raises(OSError, match="--metrics-port"):
            await server.start()
