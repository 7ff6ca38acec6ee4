"""Claim-check tensors on a Kafka fleet: a 4 MB tensor, four times the topic's
``max.message.bytes``, travels through the claim store (the ``--job-store``
Redis) instead of failing."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import redis
from kafka.admin import KafkaAdminClient, NewTopic
from tritonclient.utils import InferenceServerException

from broker import channels
from tests.fleet.processes import wait_for
from tests.kafka_fleet.processes import KafkaFleet
from tests.models import infer_slow_model, write_slow_model
from tests.redis_server import flushdb

ELEMENTS = 1 << 20  # FP32: 4 MiB
TOPIC_LIMIT = 1_048_588  # Kafka's default max.message.bytes


def infer(url: str, x: np.ndarray) -> np.ndarray:
    return infer_slow_model(url, "big", x)


def tight_topic(fleet: KafkaFleet) -> None:
    """The request topic created beforehand, as an operator would, with Kafka's default 1 MB limit."""
    admin = KafkaAdminClient(bootstrap_servers=fleet.bootstrap)
    try:
        admin.create_topics([NewTopic(fleet.topic(channels.request_channel("big")), 4, 1,
                                      topic_configs={"max.message.bytes": str(TOPIC_LIMIT)})])
    finally:
        admin.close()


def test_a_4mb_tensor_round_trips_through_a_1mb_topic_and_its_bytes_are_gone_after_the_reply(
        kafka_bootstrap: str, redis_url: str, tmp_path: Path):
    flushdb(redis_url)
    write_slow_model(tmp_path / "repo", "big", 0.0, dims=(-1,))
    x = np.random.default_rng(3).standard_normal(ELEMENTS).astype(np.float32)
    options = ("--job-store", redis_url)
    with KafkaFleet(kafka_bootstrap, tmp_path / "repo", tmp_path) as fleet, \
            redis.Redis.from_url(redis_url) as claims:
        tight_topic(fleet)
        gateway, worker = fleet.gateway(*options), fleet.worker("w1", "--models", "big", *options)
        wait_for(lambda: gateway.status("/v2/models/big/ready") == 200, 90, "big ready", worker)
        for _ in range(2):
            np.testing.assert_array_equal(infer(gateway.url, x), 2 * x)
        wait_for(lambda: list(claims.scan_iter("ferry.claim.*")) == [], 10, "no claim key left", worker)
        events = [event.get("event", "") for process in (gateway, worker) for event in process.log_events()]
        assert not [event for event in events if "claims" in event], fleet.describe()


def test_without_a_claim_store_a_tensor_over_the_topic_limit_gets_a_clear_error(
        kafka_bootstrap: str, tmp_path: Path):
    write_slow_model(tmp_path / "repo", "big", 0.0, dims=(-1,))
    options = ()
    with KafkaFleet(kafka_bootstrap, tmp_path / "repo", tmp_path) as fleet:
        tight_topic(fleet)
        gateway, worker = fleet.gateway(*options), fleet.worker("w1", "--models", "big", *options)
        wait_for(lambda: gateway.status("/v2/models/big/ready") == 200, 90, "big ready", worker)
        with pytest.raises(InferenceServerException, match="max.message.bytes.*--claim-check-store") as caught:
            infer(gateway.url, np.ones(ELEMENTS, np.float32))
        assert caught.value.status() == "413"
        np.testing.assert_array_equal(infer(gateway.url, np.ones(1000, np.float32)), np.full(1000, 2, np.float32))
