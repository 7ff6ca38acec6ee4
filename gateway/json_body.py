"""A request body that must be one JSON object, refused with a 400 naming what it is otherwise."""

from __future__ import annotations

from typing import Any

import orjson

from gateway.errors import InvalidRequest


def json_object(raw: bytes, what: str = "the request body", expected: str = "a JSON object",
                allow_empty: bool = True) -> dict[str, Any]:
    """``raw`` parsed; an empty body is an empty object where ``allow_empty``."""
    if allow_empty and not raw.strip():
        return {}
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise InvalidRequest(f"{what} is not valid JSON: {exc}") from None
    if not isinstance(body, dict):
        raise InvalidRequest(f"{what} must be {expected}")
    return body
