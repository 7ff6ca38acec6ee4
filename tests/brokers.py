"""Each broker kind, for tests parametrised over memory, Redis and Kafka."""

from __future__ import annotations

import uuid

import pytest

from tests.redis_server import flushdb

BROKERS = ["memory", "redis", "kafka"]


def broker_url(request: pytest.FixtureRequest, namespace: str) -> str:
    """The URL of a fresh broker of kind ``request.param``: memory, the session's
    Redis emptied, or a namespace of its own (one partition a topic, so a
    channel has the total order the others have) on the session's Kafka."""
    if request.param == "memory":
        return "memory://"
    if request.param == "redis":
        url: str = request.getfixturevalue("redis_url")
        flushdb(url)
        return url
    bootstrap = request.getfixturevalue("kafka_bootstrap")
    return f"kafka://{bootstrap}?partitions=1&namespace={namespace}-{uuid.uuid4().hex[:12]}."
