"""A stateful model over Kafka: the partition key (the sequence id) sends every
step of a sequence to the worker holding its state, so two workers serve
interleaved sequences correctly, and a sequence that was never started gets
its clear error."""

from __future__ import annotations

from pathlib import Path

import pytest
from tritonclient.utils import InferenceServerException
import tritonclient.http as httpclient

from tests.fleet.test_sessions import step
from tests.kafka_fleet.processes import KafkaFleet
from tests.workers.sequences.accumulator import write_accumulator


def test_sequences_keep_to_the_worker_holding_their_state(kafka_bootstrap: str, tmp_path: Path) -> None:
    # Each sequence waits while the five others take a step; under load that can pass the 5 s
    # default idle timeout, which this test is not about.
    write_accumulator(tmp_path / "repo", strategy="oldest { }", idle_us=60_000_000)
    with KafkaFleet(kafka_bootstrap, tmp_path / "repo", tmp_path) as fleet:
        fleet.worker("w1")
        fleet.worker("w2")
        gateway = fleet.gateway()
        fleet.wait_model_ready(gateway, "accumulator")
        client = httpclient.InferenceServerClient(gateway.url, network_timeout=60.0)
        seen: dict[int, list[tuple[int, int, str]]] = {s: [] for s in range(1, 7)}
        for x in range(1, 5):
            for sequence_id in seen:
                seen[sequence_id].append(step(client, sequence_id, x, start=x == 1, end=x == 4))
        with pytest.raises(InferenceServerException) as refused:
            step(client, 99, 1)
        client.close()
    for sequence_id, steps in seen.items():
        assert [s[0] for s in steps] == [1, 3, 6, 10], f"sequence {sequence_id}"
        assert len({s[1] for s in steps}) == 1, f"sequence {sequence_id} moved between workers"
    assert refused.value.status() == "400" and "sequence_start" in str(refused.value)
