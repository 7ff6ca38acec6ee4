"""The transport seam: moving opaque bytes between channels.

A channel is a named, durable, ordered log (a Redis stream, a Kafka topic, or
an in-memory deque). Readers join a *group*; each message goes to one member
of a group and stays pending until that member acks it, so a consumer that
dies before acking leaves its work to be claimed by another.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol


@dataclass(frozen=True, slots=True)
class Delivery:
    channel: str
    group: str
    message_id: str
    payload: bytes
    attempts: int = 1
    headers: tuple[tuple[str, bytes], ...] = ()


class Transport(Protocol):
    async def publish(self, channel: str, payload: bytes) -> str:
        """Append ``payload`` to ``channel``; return its message id."""

    async def fetch(
        self, channel: str, group: str, consumer: str, max_count: int, timeout_s: float
    ) -> list[Delivery]:
        """Up to ``max_count`` messages for ``consumer`` of ``group``, waiting at
        most ``timeout_s`` for the first. Empty on timeout."""

    async def ack(self, delivery: Delivery) -> None:
        """Mark ``delivery`` done for its group."""

    async def aclose(self) -> None:
        """Release resources; later calls raise TransportClosed."""
