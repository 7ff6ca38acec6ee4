"""Transport implementations, and ``open_transport`` to pick one from a URL."""

from __future__ import annotations

from urllib.parse import urlsplit

from broker.errors import BrokerError
from broker.transport import Transport
from broker.transports.memory import MemoryTransport
from broker.transports.redis import RedisTransport


def open_transport(url: str) -> Transport:
    """``memory://`` for the embedded broker, ``redis://host:port/db`` for Redis Streams."""
    scheme = urlsplit(url).scheme
    if scheme == "memory":
        return MemoryTransport()
    if scheme == "redis":
        return RedisTransport(url)
    raise BrokerError(f"unsupported broker URL '{url}': expected memory:// or redis://")


__all__ = ["MemoryTransport", "RedisTransport", "open_transport"]
