"""Taking over work a dead consumer left pending, and giving up on poison.

A worker periodically claims request deliveries that have sat unacked for
longer than ``idle_s`` and handles them like fresh ones. A delivery handed
out more than ``max_deliveries`` times is not computed again: it goes to the
dead-letter channel and its sender gets an error, so one message that kills
every worker it reaches cannot take the fleet down in turn.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from broker.envelope import ErrorInfo
from broker.transport import Delivery


@dataclass(frozen=True, slots=True)
class RecoverySettings:
    interval_s: float = 1.0
    idle_s: float = 10.0
    max_deliveries: int = 5


@runtime_checkable
class Reclaiming(Protocol):
    """A transport that can hand stale pending deliveries to another consumer."""

    async def claim_stale(
        self, channel: str, group: str, consumer: str, min_idle_s: float, max_count: int
    ) -> list[Delivery]: ...


def exhausted(delivery: Delivery, settings: RecoverySettings) -> bool:
    return delivery.attempts > settings.max_deliveries


def dead_letter_reason(delivery: Delivery) -> str:
    return f"delivered {delivery.attempts} times"


def exhausted_error(delivery: Delivery, settings: RecoverySettings) -> ErrorInfo:
    return ErrorInfo(
        "unavailable",
        f"request was delivered {delivery.attempts} times without completing "
        f"(at most {settings.max_deliveries} allowed); it was sent to the dead-letter channel",
    )
