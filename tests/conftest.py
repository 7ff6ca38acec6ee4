from collections.abc import Iterator

import pytest

from tests.redis_server import RedisServer


@pytest.fixture(scope="session")
def redis_url() -> Iterator[str]:
    """A real redis-server for the whole session; tests empty its DB themselves."""
    try:
        server = RedisServer()
    except FileNotFoundError as exc:
        pytest.skip(str(exc))
    with server:
        yield server.url
