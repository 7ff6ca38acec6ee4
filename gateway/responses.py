"""JSON and error responses as the V2 protocol renders them, and the guard every HTTP route runs in:
ferry's errors become their status (``gateway.status``); anything else is a
bug, logged with its traceback, and a 500."""

from __future__ import annotations

from collections.abc import Awaitable
from typing import Any

import orjson
import structlog
from starlette.responses import Response

from gateway.status import ANSWERED, BROKER_DOWN, error_headers, status_for
from gateway.v2_codec import render_error

log = structlog.get_logger("ferry.gateway.http")


def json_response(body: Any, status: int = 200, headers: dict[str, str] | None = None) -> Response:
    return Response(orjson.dumps(body), status_code=status, media_type="application/json", headers=headers)


def error_response(message: str, status: int, headers: dict[str, str] | None = None) -> Response:
    return Response(render_error(message), status_code=status, media_type="application/json", headers=headers)


async def guarded(answer: Awaitable[Response], path: str, unhandled_event: str) -> Response:
    """``answer``, or the response its error calls for."""
    try:
        return await answer
    except ANSWERED as exc:
        if isinstance(exc, BROKER_DOWN):
            log.warning("http.broker_unavailable", path=path, error=str(exc))
        return error_response(str(exc), status_for(exc), error_headers(exc))
    except Exception as exc:
        log.exception(unhandled_event, path=path)
        return error_response(f"internal error: {type(exc).__name__}: {exc}", 500)
