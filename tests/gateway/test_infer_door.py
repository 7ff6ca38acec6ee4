"""``InferDoor``: a plain ``POST .../infer`` goes to the infer handler with the path
parameters the app's route would have given it; anything else goes on to the app."""

from __future__ import annotations

import httpx
import pytest
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.types import Receive, Scope, Send

from gateway.infer_door import InferDoor


async def infer(request: Request) -> Response:
    return JSONResponse({"door": dict(request.path_params), "body": (await request.body()).decode()})


async def app(scope: Scope, receive: Receive, send: Send) -> None:
    await JSONResponse({"app": scope["path"]})(scope, receive, send)


async def answer(method: str, path: str, root_path: str = "") -> dict[str, object]:
    transport = httpx.ASGITransport(app=InferDoor(app, infer), root_path=root_path)
    async with httpx.AsyncClient(transport=transport, base_url="http://ferry") as http:
        reply = await http.request(method, path, content=b"{}")
        assert reply.status_code == 200
        return dict(reply.json())


@pytest.mark.parametrize("path, params", [
    ("/v2/models/add_sub/infer", {"model": "add_sub"}),
    ("/v2/models/add_sub/versions/3/infer", {"model": "add_sub", "version": "3"}),
    ("/v2/models/a%20b/infer", {"model": "a b"}),
])
async def test_a_plain_infer_post_goes_to_the_handler_with_its_path_parameters(path: str,
                                                                              params: dict[str, str]) -> None:
    assert await answer("POST", path) == {"door": params, "body": "{}"}


@pytest.mark.parametrize("method, path", [
    ("GET", "/v2/models/add_sub/infer"),
    ("POST", "/v2/models/add_sub/infer_stream"),
    ("POST", "/v2/models/a/b/infer"),
    ("POST", "/v2/models//infer"),
    ("POST", "/v2/models/add_sub/versions//infer"),
    ("POST", "/v2/models/add_sub/infer/"),
    ("POST", "/x/v2/models/add_sub/infer"),
])
async def test_anything_else_goes_on_to_the_app(method: str, path: str) -> None:
    assert "app" in await answer(method, path)


async def test_a_path_below_a_root_path_is_left_to_the_apps_router() -> None:
    assert "app" in await answer("POST", "/ferry/v2/models/add_sub/infer", root_path="/ferry")
