"""A decoupled model on a Redis fleet answers a producer's request with one
entry per response on its reply stream, the last tagged final."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from tests.fleet.processes import Fleet
from tests.gateway.test_streaming import COUNTDOWN, COUNTDOWN_CONFIG
from tests.models import write_python_model
from tests.redis_server import flushdb


@pytest.fixture
def clean_redis(redis_url: str) -> Iterator[str]:
    flushdb(redis_url)
    yield redis_url
    flushdb(redis_url)


def replies(client: redis.Redis, stream: str, count: int, timeout_s: float = 30.0) -> list[dict[bytes, bytes]]:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        entries = client.xrange(stream)
        if len(entries) >= count:
            return [fields for _, fields in entries]
        time.sleep(0.05)
    raise AssertionError(f"{len(client.xrange(stream))} of {count} replies on {stream}")


def test_each_response_is_an_entry_on_the_reply_stream(clean_redis: str, tmp_path: Path) -> None:
    write_python_model(tmp_path / "repo", "countdown", COUNTDOWN, COUNTDOWN_CONFIG)
    with Fleet(clean_redis, tmp_path / "repo", tmp_path) as fleet:
        fleet.worker("w1")
        body = json.dumps({"inputs": [{"name": "N", "datatype": "INT32", "shape": [1], "data": [3]}]})
        fleet.redis.xadd("ferry.countdown.requests", {"d": body, "h.content-type": "application/json",
                                                      "h.reply-to": "my.replies", "h.request-id": "c-1"})
        got = replies(fleet.redis, "my.replies", 4)
    bodies = [json.loads(fields[b"d"]) for fields in got]
    assert [b["parameters"]["triton_final_response"] for b in bodies] == [False, False, False, True]
    assert [b["outputs"][0]["data"] for b in bodies[:3]] == [[3], [2], [1]]
    assert {fields[b"h.request-id"] for fields in got} == {b"c-1"}
