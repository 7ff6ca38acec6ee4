"""A request the model fails on, over Kafka: each failure re-publishes it with
``ferry-attempts`` one higher, so any worker of the group may retry it; after
``--max-deliveries`` it lands on the dead-letter topic with the reason and the
original bytes, and its client gets the error. The requests beside it are
answered as usual."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest

from broker import channels
from broker.envelope import decode_request
from tests.fleet.test_poison import (
    CLIENT_TIMEOUT_S, GOOD_VALUES, MAX_DELIVERIES, MODEL, POISON, RETRYING, infer, infer_error, repository,
)  # fmt: skip
from tests.kafka_fleet.processes import KafkaFleet
from tests.models import poison_error, recorded_values


@pytest.mark.parametrize("workers", [1, 2], ids=["one-worker", "two-workers"])
def test_a_request_the_model_fails_on_goes_to_the_dead_letter_topic_after_max_deliveries(
    kafka_bootstrap: str, tmp_path: Path, workers: int,
):
    record = tmp_path / "computed.txt"
    with KafkaFleet(kafka_bootstrap, repository(tmp_path, record), tmp_path) as fleet:
        gateway = fleet.gateway()
        for index in range(workers):
            worker = fleet.worker(f"w{index}", *RETRYING)
            fleet.wait_heartbeat(f"w{index}", worker)
        fleet.wait_model_ready(gateway, MODEL)

        with ThreadPoolExecutor(1 + len(GOOD_VALUES)) as pool:
            poisoned = pool.submit(infer_error, gateway, POISON)
            good = {value: pool.submit(infer, gateway, value) for value in GOOD_VALUES}
            error = poisoned.result(timeout=CLIENT_TIMEOUT_S)
            answers = {value: future.result(timeout=CLIENT_TIMEOUT_S) for value, future in good.items()}

        assert error.status() == "500", f"{error}\n{fleet.describe()}"
        assert poison_error(POISON) in error.message() and "dead-letter" in error.message(), error.message()
        assert {value: output.tolist() for value, output in answers.items()} == {v: [2 * v] for v in GOOD_VALUES}
        computed = recorded_values(record)
        assert computed.count(POISON) == MAX_DELIVERIES, f"{computed}\n{fleet.describe()}"
        assert sorted(v for v in computed if v != POISON) == list(GOOD_VALUES), computed

        [letter] = fleet.kcat.read_msgpack(fleet.topic(channels.dead_letter_channel()))
        assert isinstance(letter, dict) and letter["kind"] == "dead_letter", letter
        assert letter["attempts"] == MAX_DELIVERIES and letter["channel"] == channels.request_channel(MODEL)
        assert poison_error(POISON) in letter["reason"], letter["reason"]
        request = decode_request(letter["payload"])
        [tensor] = request.inputs
        assert np.frombuffer(tensor.data, dtype="<i4").tolist() == [POISON]
        # The first delivery and each re-publication are on the request topic: MAX_DELIVERIES copies in all.
        request_keys = [key for _, key in fleet.kcat.read_keys(fleet.topic(channels.request_channel(MODEL)))]
        assert request_keys.count(request.id) == MAX_DELIVERIES, request_keys
        assert len(request_keys) == MAX_DELIVERIES + len(GOOD_VALUES), request_keys
