"""A worker SIGKILLed mid-run over Kafka loses nothing: when its group
session times out its partitions go to the other worker, which reads on from
the committed offsets; every request is answered once, correctly."""

from __future__ import annotations

from pathlib import Path

from broker import channels
from tests.fleet.test_worker_crash import (
    MODEL, REQUESTS, SLOW_ADD_SUB, SLOW_ADD_SUB_CONFIG, Clients, assert_each_answered_once_and_right, run_with_a_kill,
)  # fmt: skip
from tests.kafka_fleet.processes import KafkaFleet
from tests.kafka_server import create_topic
from tests.models import write_python_model

# The broker's floor (group.min.session.timeout.ms): a dead member's partitions move after this.
SESSION_TIMEOUT_MS = 6_000
PARTITIONS = 4
WORKER_OPTIONS = ("--models", MODEL, "--heartbeat-s", "0.5")


def test_a_worker_killed_mid_run_loses_no_request_and_answers_each_once(kafka_bootstrap: str, tmp_path: Path):
    repo = tmp_path / "repo"
    write_python_model(repo, MODEL, SLOW_ADD_SUB, SLOW_ADD_SUB_CONFIG)
    with KafkaFleet(kafka_bootstrap, repo, tmp_path, f"session_timeout_ms={SESSION_TIMEOUT_MS}") as fleet:
        request_topic = fleet.topic(channels.request_channel(MODEL))
        create_topic(kafka_bootstrap, request_topic, PARTITIONS)
        gateway = fleet.gateway()
        workers = {worker_id: fleet.worker(worker_id, *WORKER_OPTIONS) for worker_id in ("w1", "w2")}
        fleet.wait_model_ready(gateway, MODEL)

        clients = Clients(gateway.url)
        answered_at_kill, _, elapsed = run_with_a_kill(
            clients, gateway, workers["w1"].kill, lambda: fleet.worker("w1", *WORKER_OPTIONS, wait=False))

        assert_each_answered_once_and_right(clients, answered_at_kill, fleet)
        assert fleet.kcat.partitions(request_topic) == PARTITIONS
        assert len(fleet.kcat.read_keys(request_topic)) == REQUESTS  # nothing released or re-published
        assert fleet.kcat.read_keys(fleet.topic(channels.dead_letter_channel())) == []
        replies = reply_count(fleet)
        print(f"\n{REQUESTS} requests in {elapsed:.1f} s; killed after {answered_at_kill}; "
              f"{replies} replies on the reply topic ({replies - REQUESTS} computed twice)")
        assert replies >= REQUESTS
        assert gateway.errors() == [], gateway.describe()
        assert elapsed < 90.0, f"{REQUESTS} requests took {elapsed:.1f} s"


def reply_count(fleet: KafkaFleet) -> int:
    """Replies on the gateway's reply topic: more than the requests when the
    killed worker replied to some it had not yet committed."""
    [topic] = [name for name in fleet.kcat.topics() if name.startswith(fleet.topic(channels.reply_channel("")))]
    return len(fleet.kcat.read_keys(topic))
