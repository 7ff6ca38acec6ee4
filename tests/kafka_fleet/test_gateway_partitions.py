"""Where a gateway on Kafka puts requests: every request of a sequence on one
partition (so one worker sees the whole sequence, in order), and requests
without one round the partitions, so each worker of the group gets an even
share."""

from __future__ import annotations

import shutil
from collections import Counter, defaultdict
from pathlib import Path

import numpy as np
import tritonclient.http as httpclient

from broker import channels
from tests.kafka_fleet.processes import KafkaFleet

MODEL_REPO = Path(__file__).resolve().parents[2] / "model_repo"
MODEL = "add_sub"
PARTITIONS = 4  # ferry's default for the topics it creates


def infer(client: httpclient.InferenceServerClient, value: float, **sequence: object) -> np.ndarray:
    inputs = [httpclient.InferInput("INPUT0", [1, 16], "FP32"), httpclient.InferInput("INPUT1", [1, 16], "FP32")]
    inputs[0].set_data_from_numpy(np.full((1, 16), value, dtype=np.float32))
    inputs[1].set_data_from_numpy(np.ones((1, 16), dtype=np.float32))
    return client.infer(MODEL, inputs, **sequence).as_numpy("OUTPUT0")  # type: ignore[no-any-return]


def test_a_sequence_keeps_to_one_partition_and_other_requests_spread_evenly(kafka_bootstrap: str, tmp_path: Path):
    shutil.copytree(MODEL_REPO / MODEL, tmp_path / "repo" / MODEL)
    with KafkaFleet(kafka_bootstrap, tmp_path / "repo", tmp_path) as fleet:
        gateway = fleet.gateway()
        fleet.worker("w1", "--models", MODEL)
        fleet.wait_model_ready(gateway, MODEL)
        client = httpclient.InferenceServerClient(gateway.url)
        try:
            for step in range(5):
                for sequence in ("seq-a", "seq-b", 42):
                    output = infer(client, step, sequence_id=sequence, sequence_start=step == 0,
                                   sequence_end=step == 4)
                    assert output.tolist() == [[step + 1.0] * 16]
            for value in range(2 * PARTITIONS):
                assert infer(client, value).tolist() == [[value + 1.0] * 16]
        finally:
            client.close()

        records = fleet.kcat.read_keys(fleet.topic(channels.request_channel(MODEL)))
    assert len(records) == 3 * 5 + 2 * PARTITIONS, records
    sequences: dict[str, set[int]] = defaultdict(set)
    for partition, key in records:
        if key:
            sequences[key].add(partition)
    assert {key: len(found) for key, found in sequences.items()} == {"seq-a": 1, "seq-b": 1, "42": 1}, sequences
    unkeyed = Counter(partition for partition, key in records if not key)
    assert unkeyed == {partition: 2 for partition in range(PARTITIONS)}, unkeyed
