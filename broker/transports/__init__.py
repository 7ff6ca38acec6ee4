"""Transport implementations, and ``open_transport`` to pick one from a URL."""

from __future__ import annotations

from urllib.parse import urlsplit

from broker.errors import BrokerError
from broker.redis_url import is_redis_url
from broker.transport import Transport
from broker.transports.kafka import KafkaTransport
from broker.transports.memory import MemoryTransport
from broker.transports.redis import RedisTransport


def open_transport(url: str) -> Transport:
    """``memory://`` for the embedded broker, ``redis://host:port/db`` for Redis Streams
    (``redis+cluster://host:port[,host:port...]`` on a Redis Cluster),
    ``kafka://host:port[,host:port...][?partitions=N]`` for Kafka."""
    scheme = urlsplit(url).scheme
    if scheme == "memory":
        return MemoryTransport()
    if is_redis_url(url):
        return RedisTransport(url)
    if scheme == "kafka":
        return KafkaTransport(url)
    raise BrokerError(f"unsupported broker URL '{url}': expected memory://, redis://, "
                      "redis+cluster:// or kafka://")


__all__ = ["KafkaTransport", "MemoryTransport", "RedisTransport", "open_transport"]
