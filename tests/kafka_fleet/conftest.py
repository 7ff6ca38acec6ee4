from collections.abc import Iterator

import pytest

from tests.kafka_server import KafkaServer


@pytest.fixture
def kafka_server() -> Iterator[KafkaServer]:
    """A broker of this test's own, for tests that stop or restart it."""
    with KafkaServer() as server:
        yield server
