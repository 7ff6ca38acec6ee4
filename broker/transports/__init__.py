"""Transport implementations, and ``open_transport`` to pick one from a URL."""

from __future__ import annotations

from urllib.parse import urlsplit

from broker.errors import BrokerError
from broker.transport import Transport
from broker.transports.memory import MemoryTransport


def open_transport(url: str) -> Transport:
    scheme = urlsplit(url).scheme
    if scheme == "memory":
        return MemoryTransport()
    raise BrokerError(f"unsupported broker URL '{url}': expected memory://")


__all__ = ["MemoryTransport", "open_transport"]
