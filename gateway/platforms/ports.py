"""One ASGI app per listening port: the main app answers every port but those
a platform contract took, and alone runs the lifespan."""

from __future__ import annotations

from collections.abc import Mapping

from starlette.types import ASGIApp, Receive, Scope, Send


class PortDispatch:
    def __init__(self, main: ASGIApp, by_port: Mapping[int, ASGIApp]) -> None:
        self.main = main
        self._by_port = dict(by_port)

    @property
    def ports(self) -> tuple[int, ...]:
        return tuple(self._by_port)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        server = scope.get("server")
        app = self._by_port.get(server[1], self.main) if scope["type"] != "lifespan" and server else self.main
        await app(scope, receive, send)
