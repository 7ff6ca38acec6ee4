"""``ferry lag`` against a real Kafka broker: messages kcat produced to a
model's request topic count as lag while nobody consumes them (end offset
minus committed offset, what KEDA's kafka scaler reads), and Kafka's own
consumer-group tool agrees once the group has committed offsets."""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

from broker import channels
from tests.fleet.processes import REPO_ROOT
from tests.kafka.fetch_jars import fetch_jars
from tests.kafka_fleet.processes import KafkaFleet, wait_for
from tests.kafka_server import JVM_OPTIONS, java_executable, log4j2_properties

MODEL_REPO = Path(__file__).resolve().parents[2] / "model_repo"
MODEL = "add_sub"
JSON_HEADERS = {"content-type": "application/json"}


def v2_body() -> bytes:
    return json.dumps({"inputs": [{"name": name, "shape": [1, 16], "datatype": "FP32", "data": [1.0] * 16}
                                  for name in ("INPUT0", "INPUT1")]}).encode()


def ferry_lag(fleet: KafkaFleet) -> dict[str, tuple[int, int]]:
    done = subprocess.run([sys.executable, "-m", "ferry.cli.main", "lag", "--broker", fleet.broker_url,
                           "--model-repository", str(fleet.repository), "--format", "json"],
                          cwd=REPO_ROOT, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    return {row["model"]: (row["lag"], row["pending"]) for row in json.loads(done.stdout)}


def kafka_group_lag(bootstrap: str, group: str) -> int:
    """The LAG column of Kafka's own ``kafka-consumer-groups --describe``, summed over partitions."""
    with tempfile.TemporaryDirectory(prefix="ferry-kafka-groups-") as scratch:
        config = Path(scratch) / "log4j2.properties"
        config.write_text(log4j2_properties(Path(scratch) / "tool.log", "warn"))
        done = subprocess.run(
            [java_executable(), *JVM_OPTIONS, f"-Dlog4j2.configurationFile={config}", "-cp", fetch_jars().classpath,
             "org.apache.kafka.tools.consumer.group.ConsumerGroupCommand", "--bootstrap-server", bootstrap,
             "--describe", "--group", group],
            capture_output=True, text=True, timeout=60, check=False, stdin=subprocess.DEVNULL)
    assert done.returncode == 0, done.stdout + done.stderr
    lines = [line.split() for line in done.stdout.splitlines() if line.strip()]
    header = next(index for index, cells in enumerate(lines) if "LAG" in cells)
    column = lines[header].index("LAG")
    return sum(int(cells[column]) for cells in lines[header + 1:])


def test_ferry_lag_counts_what_no_consumer_has_read(kafka_bootstrap: str, tmp_path: Path):
    shutil.copytree(MODEL_REPO / MODEL, tmp_path / "repo" / MODEL)
    with KafkaFleet(kafka_bootstrap, tmp_path / "repo", tmp_path) as fleet:
        topic = fleet.topic(channels.request_channel(MODEL))
        produced = [(f"r{index}", v2_body()) for index in range(5)]
        fleet.kcat.produce_lines(topic, produced, JSON_HEADERS)
        assert len(fleet.kcat.read_keys(topic)) == len(produced)
        assert ferry_lag(fleet) == {MODEL: (len(produced), 0)}

        # A worker reads and commits them all, then leaves.
        worker = fleet.worker("w1")
        wait_for(lambda: ferry_lag(fleet) == {MODEL: (0, 0)}, 60, "the worker to commit the backlog", worker)
        worker.send(signal.SIGTERM)
        assert worker.wait(30) == 0, worker.describe()

        later = [(f"s{index}", v2_body()) for index in range(3)]
        fleet.kcat.produce_lines(topic, later, JSON_HEADERS)
        assert ferry_lag(fleet) == {MODEL: (len(later), 0)}
        assert kafka_group_lag(kafka_bootstrap, fleet.topic(channels.worker_group(MODEL))) == len(later)
