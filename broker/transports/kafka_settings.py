"""Settings of the Kafka transport, read once from its URL.

``kafka://HOST:PORT[,HOST:PORT...][?partitions=N&...]``: any field below
except ``bootstrap`` may be given as a query parameter. ``namespace`` is put
before every topic and group name on the cluster (never in what the
transport hands back), so several deployments, or tests, can share a cluster.

Why these defaults (they exist to keep groups stable under slow models):

- Each group member's thread polls every ``poll_interval_ms`` whether or not
  the application is fetching: when its buffer is full it pauses its
  partitions and goes on polling. So ``max_poll_interval_ms`` only has to
  catch a wedged thread, never a busy model, and 60 s is ample.
- ``session_timeout_ms`` (10 s) is how long a crashed worker's partitions
  wait before the group hands them to another member. Heartbeats come from
  kafka-python's own I/O thread, so a busy event loop never misses one;
  much shorter would evict members during a broker failover. 6 s is the
  broker's default floor (``group.min.session.timeout.ms``).
- ``heartbeat_interval_ms`` (1 s): a member learns of a rebalance from a
  heartbeat reply, so this bounds how long a join waits on existing members.
- ``join_timeout_ms`` (30 s): a member out of a stable group this long starts
  over with a fresh consumer (``kafka_watch``: kafka-python can wedge mid-join
  under load). A healthy join ends within a session timeout, so keep it well
  above ``session_timeout_ms``.
- ``max_message_bytes`` (64 MiB) sizes the producer's requests and buffer,
  the consumer's fetches, and the ``max.message.bytes`` of topics we create.
  ``max_partition_fetch_bytes`` stays small (8 MiB): the broker returns at
  least one whole batch however large, so big messages still get through,
  while small ones do not pile up tens of MiB per partition.
- ``replication_factor`` (0: 3, or as many brokers as the cluster has when
  fewer) and ``min_insync_replicas`` (0: one less than the replication
  factor, at least 1) are given to the topics ferry creates. The producer
  sends with ``acks=all`` and idempotence, so a record it was told is
  written is on ``min_insync_replicas`` brokers, once: one broker may die
  with nothing acknowledged lost.
- ``max_poll_records`` bounds one poll's hand-over, and so how far past
  ``buffer_records``/``buffer_bytes`` the buffer may overshoot before the
  thread pauses fetching.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from typing import Any
from urllib.parse import parse_qsl, urlsplit

from broker.errors import BrokerError

MIB = 1 << 20


@dataclass(frozen=True, slots=True)
class KafkaSettings:
    bootstrap: tuple[str, ...]
    partitions: int = 4
    namespace: str = ""
    session_timeout_ms: int = 10_000
    heartbeat_interval_ms: int = 1_000
    join_timeout_ms: int = 30_000
    max_poll_interval_ms: int = 60_000
    poll_interval_ms: int = 100
    max_poll_records: int = 100
    max_message_bytes: int = 64 * MIB
    max_partition_fetch_bytes: int = 8 * MIB
    # Pause fetching at max(buffer_records, 2 x the largest max_count asked for) records, or at buffer_bytes.
    buffer_records: int = 16
    buffer_bytes: int = 256 * MIB
    # How long a fetch with no timeout may wait for its member to join and catch up.
    catch_up_timeout_s: float = 15.0
    # How long a publish or an admin call waits for a broker before failing.
    request_timeout_ms: int = 10_000
    # Of the topics ferry creates; 0: chosen from the cluster's size (see above).
    replication_factor: int = 0
    min_insync_replicas: int = 0

    @classmethod
    def from_url(cls, url: str, **overrides: Any) -> KafkaSettings:
        parts = urlsplit(url)
        if parts.scheme != "kafka" or not parts.netloc:
            raise BrokerError(f"not a Kafka URL: '{url}' (expected kafka://HOST:PORT[,HOST:PORT...])")
        bootstrap = tuple(host for host in parts.netloc.split(",") if host)
        known = {f.name: f.type for f in fields(cls) if f.name != "bootstrap"}
        values: dict[str, Any] = {}
        for name, text in parse_qsl(parts.query):
            if name not in known:
                raise BrokerError(f"unknown Kafka URL parameter '{name}' in '{url}'")
            values[name] = {"str": str, "float": float}.get(str(known[name]), int)(text)
        return replace(cls(bootstrap), **values, **overrides)
