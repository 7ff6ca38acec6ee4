"""The transport seam: moving opaque bytes between channels.

A channel is a named, durable, ordered log (a Redis stream, a Kafka topic, or
an in-memory deque). Readers join a *group*; each message goes to one member
of a group and stays pending until that member acks it, so a consumer that
dies before acking leaves its work to be claimed by another.
"""

from __future__ import annotations

from dataclasses import dataclass
from collections.abc import Sequence
from typing import Protocol, runtime_checkable


Headers = tuple[tuple[str, bytes], ...]


@dataclass(frozen=True, slots=True)
class Delivery:
    channel: str
    group: str
    message_id: str
    payload: bytes
    attempts: int = 1
    headers: Headers = ()
    consumer: str = ""

    def header(self, name: str) -> bytes | None:
        """The last value of header ``name`` (case-insensitive), or None."""
        wanted = name.lower()
        found = None
        for key, value in self.headers:
            if key.lower() == wanted:
                found = value
        return found


class Transport(Protocol):
    async def publish(self, channel: str, payload: bytes, *, key: str | None = None,
                      headers: Headers = ()) -> str:
        """Append ``payload`` to ``channel``; return its message id. ``key``
        picks the partition where the channel has partitions (Kafka); headers
        travel with the message and come back in ``Delivery.headers``."""

    async def fetch(
        self, channel: str, group: str, consumer: str, max_count: int, timeout_s: float
    ) -> list[Delivery]:
        """Up to ``max_count`` messages for ``consumer`` of ``group``, waiting at
        most ``timeout_s`` for the first. Empty on timeout."""

    async def fetch_first(
        self, channels: Sequence[str], group: str, consumer: str, max_count: int, timeout_s: float
    ) -> list[Delivery]:
        """Like ``fetch`` over several channels: messages from the first of
        ``channels`` (in order) that has any, so earlier channels are drained
        first. Waiting, it returns what arrives on any of them."""

    async def ack(self, delivery: Delivery) -> None:
        """Mark ``delivery`` done for its group."""

    async def ack_all(self, deliveries: Sequence[Delivery]) -> None:
        """``ack`` each of ``deliveries``, in one round trip where the broker allows."""

    async def reply(self, channel: str, payload: bytes, delivery: Delivery, *, key: str | None = None,
                    headers: Headers = ()) -> None:
        """Publish ``payload`` onto ``channel`` as the answer to ``delivery``, then ack
        ``delivery``: acked only once the answer is on its channel (so a failure leaves it
        pending, to be computed again), in one round trip where the broker allows."""

    async def trim(self, channel: str) -> int:
        """Drop messages every group has acked; never one a group has yet to
        read or ack. Returns how many were dropped."""

    async def cap(self, channel: str, max_count: int) -> int:
        """Keep only the newest ``max_count`` messages of ``channel``, dropping
        older ones whether read or not (a bounded log, like the dead letters).
        Returns how many were dropped."""

    async def backlog(self, channel: str, group: str) -> tuple[int, int]:
        """(messages not yet delivered to ``group``, delivered but not acked)."""

    async def aclose(self) -> None:
        """Release resources; later calls raise TransportClosed."""


@runtime_checkable
class Reclaiming(Protocol):
    """A transport that can hand stale pending deliveries to another consumer."""

    async def claim_stale(
        self, channel: str, group: str, consumer: str, min_idle_s: float, max_count: int
    ) -> list[Delivery]:
        """Take over up to ``max_count`` deliveries unacked for ``min_idle_s``;
        each comes back with its delivery count in ``attempts``."""

    async def release(self, delivery: Delivery) -> None:
        """Make an unacked delivery claimable at once, keeping its count."""


@runtime_checkable
class Renewing(Protocol):
    """A transport on which another member of a group takes over a delivery left unacked for the
    claim threshold even while its holder still handles it (Redis): the holder renews those."""

    async def renew(self, channel: str, group: str, consumer: str, message_ids: Sequence[str],
                    min_idle_s: float) -> int:
        """Make those of ``message_ids`` that ``consumer`` holds, unacked ``min_idle_s`` or more, as
        if just delivered (their delivery counts kept); returns how many were."""


@runtime_checkable
class Holding(Protocol):
    """A transport that can tell whether messages are still in their channel, for a broker
    that may come back from a failure without messages it had acknowledged (Redis)."""

    failures: int  # calls that have failed on the broker so far: each may be a loss

    async def holds(self, channel: str, message_ids: Sequence[str]) -> list[bool]:
        """For each of ``message_ids`` (as ``publish`` returned them), whether ``channel`` still
        holds it: False once it is trimmed after every group acked it, or lost."""
