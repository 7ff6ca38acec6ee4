"""The seam between an ensemble and its steps' models: send one step's
request, await its one response."""

from __future__ import annotations

from typing import Protocol

from broker.envelope import Request, Response


class StepCaller(Protocol):
    async def start(self) -> None:
        """Be ready to receive replies; each ensemble calls it, so it is idempotent."""

    async def call(self, channel: str, request: Request, timeout_s: float) -> Response:
        """Publish ``request`` on ``channel`` (the caller sets ``reply_to``) and
        return its response; raises RequestTimeout after ``timeout_s``."""
