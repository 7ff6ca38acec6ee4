"""A ``ferry serve`` whose Redis goes away answers 503 with ``Retry-After``
on every door that needs the broker (synchronous infer, async jobs, streams,
job polls), not 500: the request was not taken, and may be retried."""

from __future__ import annotations

import shutil

import httpx
import orjson
import pytest

from tests.redis_server import RedisServer
from tests.servers import ferry_serve
from tests.test_serve_bad_input import MODEL_REPO, add_sub_body

BODY = orjson.dumps(add_sub_body())


@pytest.fixture
def redis():
    try:
        server = RedisServer()
    except FileNotFoundError as exc:
        pytest.fail(f"{exc}: run `make system-packages` (the Debian package redis-server)")
    with server:
        yield server


@pytest.fixture
def http(redis: RedisServer, tmp_path):
    shutil.copytree(MODEL_REPO / "add_sub", tmp_path / "add_sub")
    with ferry_serve(tmp_path, "--broker", redis.url) as address, \
            httpx.Client(base_url=f"http://{address}", timeout=10) as client:
        yield client


def test_every_door_answers_503_with_retry_after_while_the_broker_is_down(redis, http):
    assert http.post("/v2/models/add_sub/infer", content=BODY).status_code == 200
    job = http.post("/v2/models/add_sub/infer", content=BODY, headers={"Prefer": "respond-async"})
    assert job.status_code == 202

    redis.stop()
    attempts = {
        "infer": lambda: http.post("/v2/models/add_sub/infer", content=BODY),
        "async job": lambda: http.post("/v2/models/add_sub/infer", content=BODY,
                                       headers={"Prefer": "respond-async"}),
        "infer_stream": lambda: http.post("/v2/models/add_sub/infer_stream", content=BODY),
        "job poll": lambda: http.get(job.headers["Location"]),
    }
    for door, attempt in attempts.items():
        response = attempt()
        assert response.status_code == 503, (door, response.text)
        assert int(response.headers["Retry-After"]) >= 1, door
        assert "redis" in response.json()["error"], door
