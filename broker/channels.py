"""Every channel and group name ferry uses, in one place.

Request channels follow the Kafka-friendly ``ferry.<model>.requests`` form so
one name works on every transport. On Redis a channel is the stream of the same
name, but for a model's priority levels (``redis_key``): a Redis Cluster keeps
those on one slot, so that one XREADGROUP reads them all. Keys only Redis holds
carry their hash tags in their names.
"""

from __future__ import annotations

import re
from functools import lru_cache

PREFIX = "ferry"


def request_channel(model: str, prefix: str = PREFIX, level: int = 0) -> str:
    """A model's request channel; a model with priority levels has one per
    level (1 is the highest), ``ferry.<model>.requests.p<level>``."""
    base = f"{prefix}.{model}.requests"
    return f"{base}.p{level}" if level > 0 else base


def request_channels(model: str, levels: int, prefix: str = PREFIX) -> tuple[str, ...]:
    """Every request channel of a model, highest priority first."""
    if levels <= 0:
        return (request_channel(model, prefix),)
    return tuple(request_channel(model, prefix, level) for level in range(1, levels + 1))


_LEVEL = re.compile(r"(.+\.requests)\.(p[0-9]+)")


@lru_cache(maxsize=4096)  # on every publish, fetch and ack; a fleet has few channels
def redis_key(channel: str) -> str:
    """The Redis stream that holds ``channel``: the channel's own name, except that a priority
    level's stream is ``{ferry.<model>.requests}.p<level>``. Redis Cluster hashes a key with a
    ``{tag}`` by its tag alone, so every level of a model lands on one slot (Kafka topic names
    cannot hold braces, so the channel keeps the plain name)."""
    level = _LEVEL.fullmatch(channel)
    return f"{{{level[1]}}}.{level[2]}" if level else channel


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


def heartbeat_channel(prefix: str = PREFIX) -> str:
    """Where heartbeats go on brokers without expiring keys (Kafka)."""
    return f"{prefix}.heartbeats"


def heartbeat_pattern(prefix: str = PREFIX) -> str:
    """A glob matching every worker's heartbeat key."""
    return f"{prefix}.heartbeat.*"


def job_reply_channel(prefix: str = PREFIX) -> str:
    return f"{prefix}.jobs.replies"


def job_reply_group(prefix: str = PREFIX) -> str:
    # One group shared by every gateway, so each job reply is stored once.
    return f"{prefix}.jobs.replies.gateways"


def job_key(job_id: str, prefix: str = PREFIX) -> str:
    return f"{prefix}.job.{job_id}"


def session_channel(model: str, worker_id: str, prefix: str = PREFIX) -> str:
    """A worker's own stream for the sequences it holds (Redis fleets only), read in one
    XREADGROUP with the model's request channels: hash-tagged by the model's request
    channel, so that a Redis Cluster keeps it on their slot."""
    return f"{_session_head(model, prefix)}{worker_id}"


def _session_head(model: str, prefix: str) -> str:
    return f"{{{request_channel(model, prefix)}}}.sessions."


def session_channel_pattern(model: str, prefix: str = PREFIX) -> str:
    return f"{_session_head(model, prefix)}*"


def session_channel_owner(channel: str, model: str, prefix: str = PREFIX) -> str | None:
    """The worker id in a session channel's name, or None for another channel."""
    head = _session_head(model, prefix)
    return channel[len(head):] if channel.startswith(head) and len(channel) > len(head) else None


def adopter_key(channel: str) -> str:
    """Which live worker serves a session channel whose owner died."""
    return f"{channel}.adopter"


def _sequence_tag(sequence_id: int | str) -> str:
    # 7 and "7" are different sequences. In braces: a Redis Cluster keeps a sequence's session
    # and state keys on one slot, which the script that drops both needs.
    return f"{{i{sequence_id}}}" if isinstance(sequence_id, int) else f"{{s{sequence_id}}}"


def session_key(model: str, sequence_id: int | str, prefix: str = PREFIX) -> str:
    """The session channel that holds a live sequence."""
    return f"{prefix}.{model}.session.{_sequence_tag(sequence_id)}"


def state_key(model: str, sequence_id: int | str, prefix: str = PREFIX) -> str:
    """A sequence's last checkpoint."""
    return f"{prefix}.{model}.state.{_sequence_tag(sequence_id)}"


def control_channel(prefix: str = PREFIX) -> str:
    """Load and unload requests for every worker (model control)."""
    return f"{prefix}.control"


def control_group(worker_id: str, prefix: str = PREFIX) -> str:
    # A group per worker, so every worker reads every control message (a broadcast).
    return f"{prefix}.control.{worker_id}"


def control_reply_channel(gateway_id: str, prefix: str = PREFIX) -> str:
    return f"{prefix}.control.replies.{gateway_id}"


def claim_key(claim_id: str, prefix: str = PREFIX) -> str:
    """A claim-checked tensor's bytes in Redis: a key of its own, without a hash
    tag, so that a Redis Cluster spreads them over its slots."""
    return f"{prefix}.claim.{claim_id}"
