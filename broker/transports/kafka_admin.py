"""What the Kafka transport asks of the cluster's admin API, each a blocking call
made on the transport's I/O thread with its admin client: creating a topic,
reading a topic's record limit, capping a topic, and a group's lag per partition."""

from __future__ import annotations

import time
from typing import Any

import structlog

from broker.errors import TransportError
from broker.transports.kafka_api import (
    ConfigResource, ConfigResourceType, KafkaAdminClient, KafkaError, OffsetSpec, TopicAlreadyExistsError,
    TopicPartition, UnknownTopicOrPartitionError,
)  # fmt: skip
from broker.transports.kafka_settings import KafkaSettings

log = structlog.get_logger("ferry.broker.kafka")

MAX_REPLICATION = 3
# A group's coordinator can be briefly unavailable (a fresh cluster creating
# __consumer_offsets on the first lookup, a coordinator moving): read again.
COORDINATOR_RETRY_S = 10.0
COORDINATOR_BACKOFF_S = 0.2


def create_topic(admin: KafkaAdminClient, topic: str, settings: KafkaSettings) -> None:
    """Create ``topic`` with the settings' partitions, replicated over up to three brokers;
    a topic that already exists is left as it is."""
    brokers = len(admin.describe_cluster()["brokers"])
    replicas = settings.replication_factor or min(MAX_REPLICATION, max(1, brokers))
    if replicas > brokers:
        raise TransportError(f"kafka: replication_factor={replicas} for topic '{topic}', but the cluster "
                             f"has {brokers} broker(s)")
    in_sync = settings.min_insync_replicas or max(1, replicas - 1)
    spec = {
        "num_partitions": settings.partitions,
        "replication_factor": replicas,
        "configs": {"max.message.bytes": str(settings.max_message_bytes + (1 << 20)),
                    "min.insync.replicas": str(in_sync)},
    }
    try:
        admin.create_topics({topic: spec}, wait_for_metadata=True)
    except TopicAlreadyExistsError:
        pass


def topic_limit(admin: KafkaAdminClient, topic: str) -> int | None:
    """The topic's ``max.message.bytes``; None when the cluster will not say."""
    resource = ConfigResource(ConfigResourceType.TOPIC, topic, configs=["max.message.bytes"])
    try:
        described = admin.describe_configs([resource])
        return int(described["topic"][topic]["max.message.bytes"]["value"])
    except (KafkaError, KeyError, TypeError, ValueError) as exc:
        log.info("kafka.topic_limit_unknown", topic=topic, error=str(exc))
        return None


def cap_topic(admin: KafkaAdminClient, topic: str, max_count: int) -> int:
    """Delete records so that each partition keeps its share of ``max_count``, its newest;
    returns how many went."""
    bounds = _partition_bounds(admin, topic)
    if not bounds:
        return 0
    tps = sorted(bounds, key=lambda tp: tp.partition)
    cuts = {tp: bounds[tp][1] - quota for tp, quota in zip(tps, shares(max_count, len(tps)))
            if bounds[tp][1] - bounds[tp][0] > quota}
    if cuts:
        admin.delete_records(cuts)
    return sum(cut - bounds[tp][0] for tp, cut in cuts.items())


def group_lag_bases(admin: KafkaAdminClient, topic: str, group: str) -> dict[int, tuple[int, int]] | None:
    """Per partition: (the group's committed offset or the log start, the log end); None if no topic."""
    bounds = _partition_bounds(admin, topic)
    if bounds is None:
        return None
    committed = _committed_offsets(admin, group, list(bounds))
    bases = {}
    for tp, (start, end) in bounds.items():
        mark = committed.get(tp)
        base = mark.offset if mark is not None and mark.offset >= 0 else start
        bases[tp.partition] = (base, end)
    return bases


def shares(total: int, parts: int) -> list[int]:
    """``total`` split over ``parts`` as evenly as whole numbers allow, larger shares first."""
    return [total // parts + (1 if part < total % parts else 0) for part in range(parts)]


def _partition_bounds(admin: Any, topic: str) -> dict[TopicPartition, tuple[int, int]] | None:
    """Per partition of ``topic``: (log start, log end) offsets; None if there is no such topic."""
    (described,) = admin.describe_topics([topic])
    if described["error_code"] == UnknownTopicOrPartitionError.errno:
        return None
    tps = [TopicPartition(topic, p["partition_index"]) for p in described["partitions"]]
    starts = admin.list_partition_offsets({tp: OffsetSpec.EARLIEST for tp in tps})
    ends = admin.list_partition_offsets({tp: OffsetSpec.LATEST for tp in tps})
    return {tp: (starts[tp].offset, ends[tp].offset) for tp in tps}


def _committed_offsets(admin: KafkaAdminClient, group: str, tps: list[TopicPartition]) -> dict[Any, Any]:
    deadline = time.monotonic() + COORDINATOR_RETRY_S
    while True:
        try:
            return dict(admin.list_group_offsets({group: tps}).get(group, {}))
        except KafkaError as exc:
            if not exc.retriable or time.monotonic() >= deadline:
                raise
            time.sleep(COORDINATOR_BACKOFF_S)
