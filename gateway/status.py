"""The one place where ferry's errors become HTTP status codes."""

from __future__ import annotations

from gateway.errors import (
    GatewayError, InvalidRequest, JobConflict, JobNotFound, ModelUnavailable, PayloadTooLarge, UpstreamTimeout,
)
from workers.errors import ModelNotFound, WorkerError

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

_BY_CLASS: tuple[tuple[type[Exception], int], ...] = (
    (PayloadTooLarge, 413),
    (InvalidRequest, 400),
    (ModelUnavailable, 503),
    (UpstreamTimeout, 504),
    (ModelNotFound, 404),
    (JobNotFound, 404),
    (JobConflict, 409),
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
