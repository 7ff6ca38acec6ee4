"""One write per response: the transport a uvicorn response cycle writes through.

uvicorn writes a response's status line and headers as soon as the app starts
its response, and the body as a second write. On a socket each write is a
system call, and on loopback the kernel's whole delivery to the reader (and
waking it) runs inside the writer's call, so two writes cost the server about
twice what one does. ``HeldHead`` holds a write while nothing else is held; the
next write goes out with it as one (``writelines``: one vectored send, nothing
copied). What no write follows within the same turn of the event loop (a
response without a body, a streamed response's last chunk) goes out at the
next turn, and before the transport closes.
"""

from __future__ import annotations

import asyncio
from typing import Any


class HeldHead:
    __slots__ = ("_transport", "_loop", "_held")

    def __init__(self, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop) -> None:
        self._transport = transport
        self._loop = loop
        self._held: bytes | None = None

    def write(self, data: bytes | bytearray | memoryview) -> None:
        held = self._held
        if held is None:
            self._held = bytes(data)
            self._loop.call_soon(self._flush)
            return
        self._held = None
        self._transport.writelines((held, data))

    def close(self) -> None:
        self._flush()
        self._transport.close()

    def _flush(self) -> None:
        held, self._held = self._held, None
        if held is not None and not self._transport.is_closing():
            self._transport.write(held)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)
