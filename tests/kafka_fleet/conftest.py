import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.kafka_fleet.processes import FerryProcess, KafkaFleet
from tests.kafka_server import KafkaServer

MODEL_REPO = Path(__file__).resolve().parents[2] / "model_repo"


@pytest.fixture
def kafka_server() -> Iterator[KafkaServer]:
    """A broker of this test's own, for tests that stop or restart it."""
    with KafkaServer() as server:
        yield server


@pytest.fixture(scope="module")
def add_sub_fleet(kafka_bootstrap: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[KafkaFleet]:
    """One worker serving model_repo's add_sub, for a test module's outside clients."""
    root = tmp_path_factory.mktemp("add-sub-fleet")
    shutil.copytree(MODEL_REPO / "add_sub", root / "repo" / "add_sub")
    with KafkaFleet(kafka_bootstrap, root / "repo", root) as started:
        started.worker("w1", "--models", "add_sub")
        yield started


@pytest.fixture(scope="module")
def add_sub_worker(add_sub_fleet: KafkaFleet) -> FerryProcess:
    return add_sub_fleet.processes[0]
