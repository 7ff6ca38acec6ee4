"""A decoupled model on a Redis fleet answers a producer's request with one
entry per response on its reply stream, the last tagged final."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.fleet.processes import Fleet
from tests.models import write_countdown_model
from tests.redis_server import flushdb


@pytest.fixture
def clean_redis(redis_url: str) -> Iterator[str]:
    flushdb(redis_url)
    yield redis_url
    flushdb(redis_url)


def test_each_response_is_an_entry_on_the_reply_stream(clean_redis: str, tmp_path: Path) -> None:
    write_countdown_model(tmp_path / "repo")
    with Fleet(clean_redis, tmp_path / "repo", tmp_path) as fleet:
        fleet.worker("w1")
        body = json.dumps({"inputs": [{"name": "N", "datatype": "INT32", "shape": [1], "data": [3]}]})
        fleet.produce_json("ferry.countdown.requests", body.encode(), "c-1", "my.replies")
        got = fleet.read_replies("my.replies", 4)
    bodies: list[Any] = [reply.json() for reply in got]
    assert [b["parameters"]["triton_final_response"] for b in bodies] == [False, False, False, True]
    assert [b["outputs"][0]["data"] for b in bodies[:3]] == [[3], [2], [1]]
    assert {reply.headers["request-id"] for reply in got} == {"c-1"}
