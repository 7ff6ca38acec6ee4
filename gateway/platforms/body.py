"""A platform route's own request body, read to at most ``limit`` bytes (and inflated,
as ``Content-Encoding`` says, to at most that too)."""

from __future__ import annotations

from starlette.requests import Request

from gateway.compression import decompress
from gateway.errors import PayloadTooLarge


async def read_body(request: Request, limit: int) -> bytes:
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise PayloadTooLarge(f"request body exceeds the {limit}-byte limit")
        chunks.append(chunk)
    return decompress(b"".join(chunks), request.headers.get("content-encoding"), limit)
