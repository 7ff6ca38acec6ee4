import sys
import warnings
from collections.abc import Iterator

import pytest

from tests.kafka_server import left_client_sockets
from tests.redis_server import RedisServer

# A coroutine never awaited fails the test where the garbage collector finds it (warnings are
# errors), often far from where it was made; recording each coroutine's origin (as asyncio's
# debug mode does) makes that warning name the lines that created it.
sys.set_coroutine_origin_tracking_depth(12)


@pytest.fixture(autouse=True)
def _kafka_client_sockets_left_to_the_collector() -> None:
    """Not a fault of the test the collector happens to run in: see ``tests.kafka_server.BROKER_PORTS``.
    (pytest keeps one warnings context from a test's setup to its teardown, so this holds for all three.)"""
    pattern = left_client_sockets()
    if pattern is not None:
        warnings.filterwarnings("ignore", message=pattern, category=ResourceWarning)


@pytest.fixture(scope="session")
def redis_url() -> Iterator[str]:
    """A real redis-server for the whole session; tests empty its DB themselves.

    A missing redis-server fails the tests that need it rather than skipping
    them, so a machine set up wrong cannot pass quietly: ``make test``
    installs it (``make system-packages``)."""
    try:
        server = RedisServer()
    except FileNotFoundError as exc:
        pytest.fail(f"{exc}: run `make system-packages` (the Debian package redis-server)")
    with server:
        yield server.url


@pytest.fixture(scope="session")
def redis_cluster_url() -> Iterator[str]:
    """A real Redis Cluster (three masters, a replica each) for the whole session, started
    only when a test asks for it; tests empty it themselves (``flush_cluster``)."""
    from tests.redis_cluster import RedisCluster

    try:
        cluster = RedisCluster()
    except FileNotFoundError as exc:
        pytest.fail(f"{exc}: run `make system-packages` (the Debian packages redis-server and redis-tools)")
    with cluster:
        yield cluster.url


@pytest.fixture(params=["redis", "redis-cluster"])
def fleet_redis_url(request: pytest.FixtureRequest) -> str:
    """An emptied Redis for a fleet: the session's redis-server, then its Redis Cluster."""
    from tests.brokers import emptied_redis

    return emptied_redis(request, request.param)


@pytest.fixture(scope="session")
def kafka_bootstrap() -> Iterator[str]:
    """A real single-node Kafka broker for the whole session, started only when a test asks for it.

    Fails, like a failed jar fetch or broker start, when there is no java 17.
    The jars are fetched lazily into ~/.cache/ferry on first use.
    """
    from tests.kafka_server import JavaNotFoundError, KafkaServer

    try:
        server = KafkaServer()
    except JavaNotFoundError as exc:
        pytest.fail(f"{exc}: the Kafka tests need java 17 on the PATH")
    with server:
        yield server.bootstrap
