"""Async jobs: submit with ``Prefer: respond-async``, poll, cancel, expire;
in-process through ASGI on the memory transport and on real Redis."""

from __future__ import annotations

import asyncio
import contextlib
import shutil
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import httpx
import numpy as np
import orjson
import pytest
import redis.asyncio as aioredis
from starlette.applications import Starlette

from broker import channels
from broker.redis_pipe import CommandPipe
from broker.transport import Transport
from broker.transports.memory import MemoryTransport
from broker.transports.redis import RedisTransport
from gateway.app import HttpSettings, create_app
from gateway.catalog import ModelCatalog
from gateway.jobs import JobStore, MemoryJobStore, RedisJobStore, build_jobs, open_job_store
from gateway.jobs.job import Job, JobStatus, Rendering
from gateway.jobs.prefer import prefers_async
from gateway.jobs.redis_store import SMALL_RESULT_BYTES
from broker.replies import ReplyRouter
from gateway.service import InferenceService
from gateway.v2_codec import RequestedOutput
from tests.redis_server import flushdb
from workers.repository.layout import ModelRepository
from workers.worker import Worker

MODEL_REPO = Path(__file__).resolve().parents[2] / "model_repo"
ASYNC = {"Prefer": "respond-async"}
Ready = Callable[[], dict[str, tuple[int, ...]]]


def add_sub_ready() -> dict[str, tuple[int, ...]]:
    # A gateway in a fleet learns readiness from elsewhere; these tests start
    # their workers on their own schedule.
    return {"add_sub": (1,)}


@pytest.fixture
def repository(tmp_path: Path) -> ModelRepository:
    shutil.copytree(MODEL_REPO / "add_sub", tmp_path / "add_sub")
    return ModelRepository(tmp_path)


def build_gateway(transport: Transport, repository: ModelRepository, store: JobStore,
                  ready: Ready = add_sub_ready, gateway_id: str = "gw-1") -> Starlette:
    router = ReplyRouter(transport, gateway_id)
    service = InferenceService(transport, router, ModelCatalog(repository, ready))
    jobs = build_jobs(transport, store, service, gateway_id)

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        await router.start()
        await jobs.start()
        try:
            yield
        finally:
            await jobs.aclose()
            await router.aclose()

    return create_app(service, HttpSettings(), lifespan, jobs=jobs)


@contextlib.asynccontextmanager
async def serving(app: Starlette) -> AsyncIterator[httpx.AsyncClient]:
    async with app.router.lifespan_context(app):
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://ferry") as http:
            yield http


def infer_body(binary_output: bool = False, datatype: str = "FP32") -> dict[str, object]:
    return {
        "id": "req-7",
        "inputs": [{"name": "INPUT0", "shape": [1, 16], "datatype": datatype, "data": list(range(16))},
                   {"name": "INPUT1", "shape": [1, 16], "datatype": datatype, "data": [1] * 16}],
        "parameters": {"binary_data_output": binary_output},
    }


async def submit(http: httpx.AsyncClient, body: dict[str, object], headers: dict[str, str] = ASYNC) -> str:
    response = await http.post("/v2/models/add_sub/infer", json=body, headers=headers)
    assert response.status_code == 202, response.text
    job = response.json()
    assert job["status"] == "queued"
    assert response.headers["location"] == f"/v2/jobs/{job['job_id']}"
    assert response.headers["preference-applied"] == "respond-async"
    return str(job["job_id"])


async def poll_until_done(http: httpx.AsyncClient, job_id: str, timeout_s: float = 10.0) -> httpx.Response:
    async with asyncio.timeout(timeout_s):
        while True:
            response = await http.get(f"/v2/jobs/{job_id}")
            is_status = response.headers["content-type"] == "application/json" and "job_id" in response.json()
            if not (is_status and response.json()["status"] == "queued"):
                return response
            await asyncio.sleep(0.01)


async def drained(transport: MemoryTransport, model: str = "add_sub") -> None:
    """Until the worker has acked every request (so its replies are published)
    and the gateways have acked every job reply."""
    async with asyncio.timeout(10):
        for channel, group in ((channels.request_channel(model), channels.worker_group(model)),
                               (channels.job_reply_channel(), channels.job_reply_group())):
            while await transport.backlog(channel, group) != (0, 0):
                await asyncio.sleep(0.01)


@pytest.mark.parametrize("binary_output", [False, True], ids=["json", "binary"])
async def test_a_job_finishes_with_the_body_a_synchronous_call_returns(repository, binary_output):
    async with MemoryTransport() as transport, Worker(transport, repository) as worker:
        app = build_gateway(transport, repository, MemoryJobStore(), worker.ready_models)
        async with serving(app) as http:
            sync = await http.post("/v2/models/add_sub/infer", json=infer_body(binary_output))
            assert sync.status_code == 200
            job_id = await submit(http, infer_body(binary_output))
            done = await poll_until_done(http, job_id)
    assert done.status_code == 200
    assert done.content == sync.content
    assert done.headers["content-type"] == sync.headers["content-type"]
    assert done.headers.get("inference-header-content-length") == \
        sync.headers.get("inference-header-content-length")
    assert (done.headers.get("inference-header-content-length") is not None) == binary_output


async def test_a_queued_job_reports_its_model_and_status(repository):
    async with MemoryTransport() as transport:
        async with serving(build_gateway(transport, repository, MemoryJobStore())) as http:
            job_id = await submit(http, infer_body())
            status = (await http.get(f"/v2/jobs/{job_id}")).json()
    assert status["job_id"] == job_id and status["status"] == "queued"
    assert status["model_name"] == "add_sub" and status["model_version"] == ""
    assert status["created"].endswith("Z")


async def test_a_failed_job_reports_the_workers_error(repository):
    async with MemoryTransport() as transport, Worker(transport, repository) as worker:
        app = build_gateway(transport, repository, MemoryJobStore(), worker.ready_models)
        async with serving(app) as http:
            sync = await http.post("/v2/models/add_sub/infer", json=infer_body(datatype="INT32"))
            job_id = await submit(http, infer_body(datatype="INT32"))
            done = await poll_until_done(http, job_id)
    assert sync.status_code == 400
    assert done.status_code == 200
    assert done.json()["status"] == "failed" and done.json()["error"] == sync.json()["error"]


async def test_a_cancelled_job_stays_cancelled_when_its_reply_arrives_later(repository):
    async with MemoryTransport() as transport:
        async with serving(build_gateway(transport, repository, MemoryJobStore())) as http:
            job_id = await submit(http, infer_body())
            cancelled = await http.delete(f"/v2/jobs/{job_id}")
            assert cancelled.status_code == 200 and cancelled.json()["status"] == "cancelled"
            async with Worker(transport, repository):
                await drained(transport)
            polled = await http.get(f"/v2/jobs/{job_id}")
            again = await http.delete(f"/v2/jobs/{job_id}")
    assert polled.status_code == 200 and polled.json()["status"] == "cancelled"
    assert again.status_code == 200 and again.json()["status"] == "cancelled"


async def test_a_finished_job_cannot_be_cancelled(repository):
    async with MemoryTransport() as transport, Worker(transport, repository) as worker:
        app = build_gateway(transport, repository, MemoryJobStore(), worker.ready_models)
        async with serving(app) as http:
            job_id = await submit(http, infer_body())
            await poll_until_done(http, job_id)
            refused = await http.delete(f"/v2/jobs/{job_id}")
    assert refused.status_code == 409 and "error" in refused.json()


async def test_a_job_expires_after_its_ttl_and_is_then_forgotten(repository):
    now = [0.0]
    store = MemoryJobStore(ttl_s=60, clock=lambda: now[0])
    async with MemoryTransport() as transport, Worker(transport, repository) as worker:
        app = build_gateway(transport, repository, store, worker.ready_models)
        async with serving(app) as http:
            job_id = await submit(http, infer_body())
            assert (await poll_until_done(http, job_id)).status_code == 200
            now[0] = 60.0
            expired = await http.get(f"/v2/jobs/{job_id}")
            expired_cancel = await http.delete(f"/v2/jobs/{job_id}")
            now[0] = 120.0
            forgotten = await http.get(f"/v2/jobs/{job_id}")
    assert expired.status_code == 410
    assert expired.json()["status"] == "expired" and "error" in expired.json()
    assert expired_cancel.status_code == 410 and expired_cancel.json()["status"] == "expired"
    assert forgotten.status_code == 404


@pytest.mark.parametrize("job_id", ["0" * 32, "not-a-job", "..%2F..%2Fetc"])
async def test_an_unknown_job_is_404(repository, job_id):
    async with MemoryTransport() as transport:
        async with serving(build_gateway(transport, repository, MemoryJobStore())) as http:
            polled = await http.get(f"/v2/jobs/{job_id}")
            cancelled = await http.delete(f"/v2/jobs/{job_id}")
    for response in (polled, cancelled):
        assert response.status_code == 404 and "error" in response.json()


async def test_without_the_preference_or_without_jobs_infer_stays_synchronous(repository):
    async with MemoryTransport() as transport, Worker(transport, repository) as worker:
        with_jobs = build_gateway(transport, repository, MemoryJobStore(), worker.ready_models)
        async with serving(with_jobs) as http:
            plain = await http.post("/v2/models/add_sub/infer", json=infer_body(),
                                    headers={"Prefer": "return=minimal"})
        router = ReplyRouter(transport, "gw-plain")
        service = InferenceService(transport, router, ModelCatalog(repository, worker.ready_models))
        await router.start()
        try:
            async with httpx.AsyncClient(transport=httpx.ASGITransport(app=create_app(service)),
                                         base_url="http://ferry") as http:
                declined = await http.post("/v2/models/add_sub/infer", json=infer_body(), headers=ASYNC)
                no_route = await http.get("/v2/jobs/" + "0" * 32)
        finally:
            await router.aclose()
    assert plain.status_code == 200 and "outputs" in plain.json()
    assert declined.status_code == 200 and "preference-applied" not in declined.headers
    assert no_route.status_code == 404


async def test_an_unready_model_is_refused_at_submit(repository):
    async with MemoryTransport() as transport:
        app = build_gateway(transport, repository, MemoryJobStore(), ready=lambda: {})
        async with serving(app) as http:
            refused = await http.post("/v2/models/add_sub/infer", json=infer_body(), headers=ASYNC)
    assert refused.status_code == 503


@pytest.mark.parametrize(("values", "expected"), [
    (["respond-async"], True),
    (["Respond-Async"], True),
    (["return=minimal, respond-async; wait=10"], True),
    (["return=minimal", " RESPOND-ASYNC "], True),
    (['handling=lenient; note="a, respond-async"'], False),
    (['x="q\\"respond-async,", return=minimal'], False),
    (["respond-asyncx", "wait=respond-async"], False),
    ([], False),
])
def test_the_prefer_header_is_read_as_rfc_7240_preferences(values, expected):
    assert prefers_async(values) is expected


async def test_a_job_submitted_through_one_gateway_is_answered_by_a_later_one(repository, redis_url):
    flushdb(redis_url)
    body = infer_body(binary_output=True)
    async with RedisTransport(redis_url) as transport:
        first = build_gateway(transport, repository, RedisJobStore(redis_url), gateway_id="gw-1")
        async with serving(first) as http:
            job_id = await submit(http, body)
    # Nothing has computed the job yet: the worker starts after gateway 1 is gone.
    async with RedisTransport(redis_url) as transport, Worker(transport, repository):
        second = build_gateway(transport, repository, RedisJobStore(redis_url), gateway_id="gw-2")
        async with serving(second) as http:
            done = await poll_until_done(http, job_id)
            sync = await http.post("/v2/models/add_sub/infer", json=body)
    assert done.status_code == 200 and sync.status_code == 200
    assert done.content == sync.content
    assert done.headers["inference-header-content-length"] == sync.headers["inference-header-content-length"]
    header = orjson.loads(done.content[: int(done.headers["inference-header-content-length"])])
    assert header["id"] == "req-7"


@pytest.fixture(params=["memory", "redis"])
async def store(request: pytest.FixtureRequest) -> AsyncIterator[JobStore]:
    if request.param == "memory":
        opened: JobStore = MemoryJobStore()
    else:
        url = request.getfixturevalue("redis_url")
        flushdb(url)
        opened = RedisJobStore(url, ttl_s=30)
    try:
        yield opened
    finally:
        await opened.aclose()


def a_job(job_id: str = "a" * 32) -> Job:
    rendering = Rendering("req-1", (RequestedOutput("OUTPUT0", True),), binary_default=False)
    return Job(job_id, "add_sub", "1", created_ns=123, rendering=rendering)


async def test_a_store_keeps_a_job_and_its_rendering(store: JobStore):
    await store.create(a_job())
    assert await store.get("a" * 32) == a_job()
    assert await store.get("b" * 32) is None


async def test_a_store_moves_a_job_out_of_queued_only_once(store: JobStore):
    await store.create(a_job())
    assert await store.finish("a" * 32, JobStatus.SUCCEEDED, b"result")
    assert not await store.finish("a" * 32, JobStatus.FAILED, b"other")
    finished = await store.cancel("a" * 32)
    assert finished is not None and finished.status == JobStatus.SUCCEEDED and finished.result == b"result"
    await store.create(a_job("c" * 32))
    cancelled = await store.cancel("c" * 32)
    assert cancelled is not None and cancelled.status == JobStatus.CANCELLED
    assert not await store.finish("c" * 32, JobStatus.SUCCEEDED, b"late")
    assert await store.cancel("d" * 32) is None


async def test_the_redis_store_expires_its_keys_after_the_ttl(redis_url):
    flushdb(redis_url)
    async with RedisJobStore(redis_url, ttl_s=30) as store:
        await store.create(a_job())
        await store.finish("a" * 32, JobStatus.SUCCEEDED, b"result")
        client = aioredis.Redis.from_url(redis_url)
        try:
            ttl_ms = await client.pttl(f"ferry.job.{'a' * 32}")
        finally:
            await client.aclose()
    assert 0 < ttl_ms <= 30_000


async def test_the_redis_store_keeps_a_4_mb_result_and_outlives_a_script_flush(redis_url):
    flushdb(redis_url)
    result = np.random.default_rng(7).bytes(4 << 20)
    async with RedisJobStore(redis_url, ttl_s=30) as store:
        await store.create(a_job())
        client = aioredis.Redis.from_url(redis_url)
        try:
            await client.script_flush()  # as a restarted server's cache is empty
        finally:
            await client.aclose()
        assert await store.finish("a" * 32, JobStatus.SUCCEEDED, result)
        assert not await store.begin("a" * 32)
        finished = await store.get("a" * 32)
        await store.discard("a" * 32)
        assert await store.get("a" * 32) is None
    assert finished is not None and finished.status == JobStatus.SUCCEEDED and finished.result == result


@pytest.mark.parametrize("size", [0, 64, SMALL_RESULT_BYTES, SMALL_RESULT_BYTES + 1, 300_000])
async def test_a_redis_job_reads_back_whole_with_its_result_in_the_reply_or_read_alone(redis_url, size):
    """A result up to SMALL_RESULT_BYTES comes back with the job's status, in the pipe; a larger
    one is read alone, outside it (the pipe's round trips do not count it)."""
    flushdb(redis_url)
    result = np.random.default_rng(size).bytes(size)
    async with RedisJobStore(redis_url, ttl_s=30) as store:
        await store.create(a_job())
        queued = await store.get("a" * 32)
        assert await store.finish("a" * 32, JobStatus.SUCCEEDED, result)
        pipe = store._pipes
        assert isinstance(pipe, CommandPipe)
        before = pipe.round_trips
        finished = await store.get("a" * 32)
        in_pipe = pipe.round_trips - before
        async with aioredis.Redis.from_url(redis_url) as raw:
            clients = await raw.execute_command("CLIENT", "LIST")
    # A connection's last command: the large result's HGET on one of its own.
    read_alone = b"cmd=hget" in (clients if isinstance(clients, bytes) else str(clients).encode())
    assert read_alone == (size > SMALL_RESULT_BYTES), clients
    assert queued is not None and queued.status == JobStatus.QUEUED and queued.result == b""
    assert finished is not None and finished.status == JobStatus.SUCCEEDED and finished.result == result
    assert finished.model == queued.model
    assert in_pipe == 1  # the script; a large result's HGET went alone


async def test_the_job_store_follows_the_broker_url(redis_url):
    memory, shared = open_job_store("memory://"), open_job_store(redis_url)
    try:
        assert isinstance(memory, MemoryJobStore) and isinstance(shared, RedisJobStore)
    finally:
        await memory.aclose()
        await shared.aclose()
