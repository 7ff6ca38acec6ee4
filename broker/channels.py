"""Every channel and group name ferry uses, in one place.

Request channels follow the Kafka-friendly ``ferry.<model>.requests`` form so
one name works on every transport.
"""

from __future__ import annotations

PREFIX = "ferry"


def request_channel(model: str, prefix: str = PREFIX) -> str:
    return f"{prefix}.{model}.requests"


def worker_group(model: str, prefix: str = PREFIX) -> str:
    return f"{prefix}.{model}.workers"


def reply_channel(gateway_id: str, prefix: str = PREFIX) -> str:
    return f"{prefix}.replies.{gateway_id}"


def reply_group(gateway_id: str, prefix: str = PREFIX) -> str:
    return f"{prefix}.replies.{gateway_id}.readers"


def dead_letter_channel(prefix: str = PREFIX) -> str:
    return f"{prefix}.deadletter"


def heartbeat_key(worker_id: str, prefix: str = PREFIX) -> str:
    return f"{prefix}.heartbeat.{worker_id}"


def heartbeat_pattern(prefix: str = PREFIX) -> str:
    """A glob matching every worker's heartbeat key."""
    return f"{prefix}.heartbeat.*"
