"""A consumer's partitions moving in a rebalance: what it had handed out and
acked is committed on the way out, and each move is logged."""

from __future__ import annotations

from typing import Any

from broker.transports.kafka_api import (
    ConsumerRebalanceListener, KafkaConsumer, KafkaError, OffsetAndMetadata, TopicPartition,
)  # fmt: skip
from broker.transports.kafka_inbox import Commit, Inbox, Partition


class Rebalance(ConsumerRebalanceListener):  # type: ignore[misc]  # kafka-python is untyped
    """Runs on kafka-python's I/O thread, which also sends heartbeats, so it
    must not block: a synchronous commit from here would wait on that very
    thread. The async commit goes out on the coordinator connection ahead of
    our JoinGroup, so the partition's next owner (assigned only after we
    rejoin) sees it.

    Before it commits, a revoke waits up to ``settle_s`` for the records
    handed out here to be acked (``Inbox.wait_acked``): the next owner reads
    on from the commit, and a record answered here after it would be answered
    twice. The wait holds up this consumer's heartbeats too, so ``settle_s``
    stays well inside the session timeout.

    Each move is logged, with the records handed out here and still not
    acked (``unacked``): their partition's next owner delivers them again.
    """

    def __init__(self, consumer: KafkaConsumer, inbox: Inbox, namespace: str, logger: Any, settle_s: float) -> None:
        self._consumer = consumer
        self._inbox = inbox
        self._namespace = namespace
        self._log = logger
        self._settle_s = settle_s

    def on_partitions_revoked(self, revoked: Any) -> None:
        partitions = self._partitions(revoked)
        unacked = self._inbox.wait_acked(partitions, self._settle_s)
        self._log.info("kafka.partitions_revoked", partitions=_names(partitions), unacked=unacked)
        points = self._inbox.drop(partitions)
        if points:
            try:
                self._consumer.commit_async(commit_offsets(points, self._namespace), callback=self._left)
            except KafkaError as exc:
                self._log.warning("kafka.revoke_commit_failed", error=repr(exc))

    def on_partitions_assigned(self, assigned: Any) -> None:
        self._log.info("kafka.partitions_assigned", partitions=_names(self._partitions(assigned)))

    def on_partitions_lost(self, lost: Any) -> None:
        # Evicted: our generation is dead, a commit would be refused.
        partitions = self._partitions(lost)
        self._log.warning("kafka.partitions_lost", partitions=_names(partitions),
                          unacked=self._inbox.unacked(partitions))
        self._inbox.drop(partitions)

    def _left(self, _committed: object, response: object) -> None:
        # Acked records past the last commit that went through are delivered again.
        if isinstance(response, Exception):
            self._log.warning("kafka.revoke_commit_failed", error=repr(response))

    def _partitions(self, tps: Any) -> list[Partition]:
        return [(tp.topic.removeprefix(self._namespace), tp.partition) for tp in tps]


def _names(partitions: list[Partition]) -> list[str]:
    return sorted(f"{topic}-{partition}" for topic, partition in partitions)


def commit_offsets(commits: dict[Partition, Commit], namespace: str) -> dict[TopicPartition, OffsetAndMetadata]:
    return {TopicPartition(namespace + topic, partition): OffsetAndMetadata(offset, metadata, -1)
            for (topic, partition), (offset, metadata) in commits.items()}  # fmt: skip
