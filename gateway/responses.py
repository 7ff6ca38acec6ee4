"""JSON and error responses as the V2 protocol renders them, and the guard every HTTP route runs in:
ferry's errors become their status (``gateway.status``); anything else is a
bug, logged with its traceback, and a 500.

``Rendered`` is a whole response as bytes, for the infer route: Starlette's
``Response`` when it goes out through ASGI, written as it is on the infer lane
(``gateway.infer_lane``)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import orjson
import structlog
from starlette.responses import Response

from broker.quick_init import quick_init
from gateway.status import ANSWERED, BROKER_DOWN, error_headers, status_for
from gateway.v2_codec import render_error

log = structlog.get_logger("ferry.gateway.http")

T = TypeVar("T")


@quick_init
@dataclass(frozen=True, slots=True)
class Rendered:
    body: bytes
    status: int = 200
    media_type: str = "application/json"
    headers: dict[str, str] | None = None
    tail: tuple[bytes | memoryview, ...] = ()  # what follows ``body`` (binary tensors), not copied behind it

    def response(self) -> Response:
        content = b"".join((self.body, *self.tail)) if self.tail else self.body
        return Response(content, status_code=self.status, media_type=self.media_type, headers=self.headers)


def rendered_json(body: Any, status: int = 200, headers: dict[str, str] | None = None) -> Rendered:
    return Rendered(orjson.dumps(body), status, headers=headers)


def rendered_error(message: str, status: int, headers: dict[str, str] | None = None) -> Rendered:
    return Rendered(render_error(message), status, headers=headers)


def json_response(body: Any, status: int = 200, headers: dict[str, str] | None = None) -> Response:
    return rendered_json(body, status, headers).response()


def error_response(message: str, status: int, headers: dict[str, str] | None = None) -> Response:
    return rendered_error(message, status, headers).response()


async def guarded(answer: Awaitable[Response], path: str, unhandled_event: str) -> Response:
    """``answer``, or the response its error calls for."""
    return await guard(answer, path, unhandled_event, error_response)


async def guard(answer: Awaitable[T], path: str, unhandled_event: str,
                failed: Callable[[str, int, dict[str, str] | None], T]) -> T:
    """``answer``, or ``failed(message, status, headers)`` for its error."""
    try:
        return await answer
    except ANSWERED as exc:
        if isinstance(exc, BROKER_DOWN):
            log.warning("http.broker_unavailable", path=path, error=str(exc))
        return failed(str(exc), status_for(exc), error_headers(exc))
    except Exception as exc:
        log.exception(unhandled_event, path=path)
        return failed(f"internal error: {type(exc).__name__}: {exc}", 500, None)
