"""The one place where ferry's errors become HTTP status codes.

A broker that cannot be reached is a 503 with ``Retry-After``: the request
was not taken, and the same request may well succeed in a moment.
"""

from __future__ import annotations

from broker.errors import MessageTooLarge, TransportClosed, TransportError
from gateway.errors import (
    ClientDisconnected, FeatureDisabled, GatewayError, InvalidRequest, JobConflict, JobNotFound, ModelUnavailable,
    PayloadTooLarge, QueueFull, RegionNotFound, UnsupportedEncoding, UpstreamTimeout,
)
from workers.errors import ModelNotFound, WorkerError

BROKER_DOWN = (TransportError, TransportClosed)
# What a route answers with its status; any other exception is a bug, and a 500.
ANSWERED: tuple[type[Exception], ...] = (GatewayError, WorkerError, MessageTooLarge, *BROKER_DOWN)
BROKER_RETRY_AFTER_S = 1

_BY_CODE = {
    "invalid_argument": 400,
    "not_found": 404,
    "invalid_config": 400,
    "unavailable": 503,
    "resource_exhausted": 503,
    "timeout": 504,
    "session_lost": 410,
    "internal": 500,
}

_BY_CLASS: tuple[tuple[type[Exception] | tuple[type[Exception], ...], int], ...] = (
    (PayloadTooLarge, 413),
    (MessageTooLarge, 413),
    (UnsupportedEncoding, 415),  # Triton answers 501; a client's choice of encoding is a 4xx here
    (InvalidRequest, 400),
    (ModelUnavailable, 503),
    (UpstreamTimeout, 504),
    (ModelNotFound, 404),
    (JobNotFound, 404),
    (JobConflict, 409),
    (RegionNotFound, 404),
    (FeatureDisabled, 501),
    (ClientDisconnected, 499),  # never sent (no one is listening), but counted in metrics as nginx does
    (BROKER_DOWN, 503),
)


def status_for_code(code: str) -> int:
    return _BY_CODE.get(code, 500)


def status_for(exc: Exception) -> int:
    for cls, status in _BY_CLASS:
        if isinstance(exc, cls):
            return status
    if isinstance(exc, WorkerError):
        return status_for_code(exc.code)
    if isinstance(exc, GatewayError):
        return 400
    return 500


def error_headers(exc: Exception) -> dict[str, str]:
    """``Retry-After`` for an error worth retrying soon, ``Accept-Encoding`` for an
    encoding refused; else none."""
    if isinstance(exc, UnsupportedEncoding):
        return {"Accept-Encoding": exc.accepted}
    if isinstance(exc, QueueFull):
        return {"Retry-After": str(exc.retry_after_s)}
    if isinstance(exc, BROKER_DOWN):
        return {"Retry-After": str(BROKER_RETRY_AFTER_S)}
    return {}
