"""The parts of kafka-python the Kafka transport uses, imported in one place.

kafka-python 3.0 reads its protocol schemas with
``importlib.resources.read_text`` while importing, which warns
(DeprecationWarning) on Python 3.11+; the warning is about kafka-python's
own code, so it is silenced here rather than in every user's warning filter.
Its loggers are set to WARNING: at INFO they report every reconnect and
rebalance.

kafka-python 3.0 clients connect in their constructors, and one that fails
to (no broker listening) leaves its I/O thread and a socket behind for good.
``reachable`` is a plain TCP probe to try first, so that retrying through a
broker outage does not pile up those leftovers.
"""

from __future__ import annotations

import logging
import socket
import warnings
from collections.abc import Sequence

with warnings.catch_warnings():
    warnings.simplefilter("ignore", DeprecationWarning)
    from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer, TopicPartition
    from kafka.admin import ConfigResource, ConfigResourceType, OffsetSpec
    from kafka.consumer.subscription_state import ConsumerRebalanceListener
    from kafka.coordinator.assignors.cooperative_sticky import CooperativeStickyAssignor
    from kafka.errors import (
        KafkaConnectionError, KafkaError, MessageSizeTooLargeError, TopicAlreadyExistsError,
        UnknownBrokerIdError, UnknownTopicOrPartitionError,
    )
    from kafka.record import util as _record_util
    from kafka.structs import MemberState, OffsetAndMetadata

# Without the crc32c package kafka-python checksums every record batch in pure
# Python: about 15 times slower at 200 KB messages (30 against 450 msg/s).
FAST_CRC = getattr(_record_util, "crc32c_c", None) is not None

logging.getLogger("kafka").setLevel(logging.WARNING)


def reachable(bootstrap: Sequence[str], timeout_s: float) -> bool:
    """Whether any bootstrap server accepts a TCP connection."""
    for server in bootstrap:
        host, _, port = server.rpartition(":")
        try:
            with socket.create_connection((host.strip("[]") or "localhost", int(port)), timeout=timeout_s):
                return True
        except (OSError, ValueError):
            continue
    return False


__all__ = [
    "FAST_CRC", "ConfigResource", "ConfigResourceType", "ConsumerRebalanceListener", "CooperativeStickyAssignor",
    "KafkaAdminClient", "KafkaConnectionError", "KafkaConsumer", "KafkaError", "KafkaProducer", "MemberState",
    "MessageSizeTooLargeError", "OffsetAndMetadata", "OffsetSpec", "TopicAlreadyExistsError", "TopicPartition",
    "UnknownBrokerIdError", "UnknownTopicOrPartitionError", "reachable",
]  # fmt: skip
