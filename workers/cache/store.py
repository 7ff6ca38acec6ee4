"""The seam between the worker and where cached answers live."""

from __future__ import annotations

from typing import Protocol


class ResponseCache(Protocol):
    kind: str  # "local" or "redis", for logs

    async def get(self, key: bytes) -> bytes | None:
        """The answer kept under ``key``, or None; a store that cannot be read is a miss."""
        ...

    async def put(self, key: bytes, value: bytes) -> None:
        """Keep ``value`` under ``key`` if it fits; a store that cannot be written keeps nothing."""
        ...

    async def aclose(self) -> None: ...
