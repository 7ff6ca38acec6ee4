"""Starting a process's parts in order and handing each to the one ``AsyncExitStack``
that stops them, the last started first."""

from __future__ import annotations

from collections.abc import Awaitable
from contextlib import AsyncExitStack
from typing import Protocol


class Closable(Protocol):
    def aclose(self) -> Awaitable[None]: ...


class Part(Closable, Protocol):
    def start(self) -> Awaitable[None]: ...


def close_later(stack: AsyncExitStack, *resources: Closable | None) -> None:
    """Close each resource when ``stack`` unwinds; None is skipped (a part the settings turned off)."""
    for resource in resources:
        if resource is not None:
            stack.push_async_callback(resource.aclose)


async def start_all(stack: AsyncExitStack, *parts: Part | None) -> None:
    """Start each part in turn, each closed by ``stack`` should a later one fail to start."""
    for part in parts:
        if part is not None:
            await part.start()
            close_later(stack, part)
