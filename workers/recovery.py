"""Taking over work a dead consumer left pending, retrying failures, and
giving up on poison.

A worker periodically claims request deliveries that have sat unacked for
longer than ``idle_s`` and handles them like fresh ones. With
``retry_failures`` (the default on a shared broker, where another worker may
succeed), a request whose model raised is released unacked for any worker to
claim at once rather than answered with the error. A delivery handed out
``max_deliveries`` times is not tried again: it goes to the dead-letter
channel and its sender gets an error, so one message that kills or fails
every worker it reaches cannot take the fleet down in turn.
"""

from __future__ import annotations

from dataclasses import dataclass

from broker.envelope import ErrorInfo
from broker.transport import Delivery

# Errors worth another try on another worker: the model or its runtime failed.
# A bad request, an unknown model or a passed deadline would fail the same way.
RETRIABLE_CODES = frozenset({"internal", "unavailable"})


@dataclass(frozen=True, slots=True)
class RecoverySettings:
    interval_s: float = 1.0
    idle_s: float = 10.0
    max_deliveries: int = 5
    retry_failures: bool = False


def exhausted(delivery: Delivery, settings: RecoverySettings) -> bool:
    return delivery.attempts > settings.max_deliveries


def dead_letter_reason(delivery: Delivery, last_error: ErrorInfo | None = None) -> str:
    reason = f"delivered {delivery.attempts} times"
    return reason if last_error is None else f"{reason}; last error: {last_error.message}"


def exhausted_error(delivery: Delivery, settings: RecoverySettings, last_error: ErrorInfo | None = None) -> ErrorInfo:
    cause = "without completing" if last_error is None else f"and failed each time ({last_error.message})"
    return ErrorInfo(
        last_error.code if last_error is not None else "unavailable",
        f"request was delivered {delivery.attempts} times {cause} "
        f"(at most {settings.max_deliveries} allowed); it was sent to the dead-letter channel",
    )
