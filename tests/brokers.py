"""Each broker kind, for tests parametrised over memory, Redis (one server, and a Redis
Cluster) and Kafka, and fleets of real processes over Redis or Kafka."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from tests.fleet.processes import Fleet, ProcessFleet
from tests.kafka_fleet.processes import KafkaFleet
from tests.redis_cluster import flush_cluster
from tests.redis_server import flushdb

REDIS_KINDS = ["redis", "redis-cluster"]
BROKERS = ["memory", *REDIS_KINDS, "kafka"]


def emptied_redis(request: pytest.FixtureRequest, kind: str) -> str:
    """The session's redis-server (``redis``) or Redis Cluster (``redis-cluster``), emptied."""
    if kind == "redis":
        url: str = request.getfixturevalue("redis_url")
        flushdb(url)
        return url
    url = request.getfixturevalue("redis_cluster_url")
    flush_cluster(url)
    return url


def broker_url(request: pytest.FixtureRequest, namespace: str) -> str:
    """The URL of a fresh broker of kind ``request.param``: memory, the session's
    Redis emptied, or a namespace of its own (one partition a topic, so a
    channel has the total order the others have) on the session's Kafka."""
    if request.param == "memory":
        return "memory://"
    if request.param in REDIS_KINDS:
        return emptied_redis(request, request.param)
    bootstrap = request.getfixturevalue("kafka_bootstrap")
    return f"kafka://{bootstrap}?partitions=1&namespace={namespace}-{uuid.uuid4().hex[:12]}."


FLEET_BROKERS = [*REDIS_KINDS, "kafka"]


def open_fleet(request: pytest.FixtureRequest, broker: str, repository: Path, log_dir: Path,
               kafka_query: str = "") -> ProcessFleet:
    """Real processes over ``broker``: the session's Redis emptied, or a namespace of
    the session's Kafka (``kafka_query`` adds to its URL, e.g. consumer timeouts)."""
    if broker in REDIS_KINDS:
        return Fleet(emptied_redis(request, broker), repository, log_dir)
    return KafkaFleet(request.getfixturevalue("kafka_bootstrap"), repository, log_dir, kafka_query)
