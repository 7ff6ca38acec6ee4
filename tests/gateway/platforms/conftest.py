"""The platform contracts in-process through ASGI, on the embedded broker: a
client reaches a platform's routes by the port in its URL, as on a real host."""

from __future__ import annotations

import shutil
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx

from ferry.wiring.serve import build_app
from ferry.wiring.settings import ServeSettings
from gateway.platforms.ports import PortDispatch

MODEL_REPO = Path(__file__).resolve().parents[3] / "model_repo"
V2_URL = "http://ferry:8000"


def copy_add_sub(repo: Path, name: str = "add_sub") -> Path:
    shutil.copytree(MODEL_REPO / "add_sub", repo / name)
    if name != "add_sub":
        config = repo / name / "config.pbtxt"
        config.write_text(config.read_text().replace('name: "add_sub"', f'name: "{name}"'))
    return repo / name


@asynccontextmanager
async def serving(settings: ServeSettings, port: int) -> AsyncIterator[Callable[[str], httpx.AsyncClient]]:
    """``ferry serve``'s app with a platform contract on ``port``; yields a client
    factory by base URL (``V2_URL`` for the V2 port)."""
    app = build_app(settings)
    assert isinstance(app, PortDispatch) and port in app.ports
    main: Any = app.main
    async with main.router.lifespan_context(main):
        clients: list[httpx.AsyncClient] = []

        def client(base_url: str) -> httpx.AsyncClient:
            made = httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url=base_url, timeout=60)
            clients.append(made)
            return made

        try:
            yield client
        finally:
            for made in clients:
                await made.aclose()
