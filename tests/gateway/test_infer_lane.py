"""The infer lane on a real uvicorn server (``GuardedHttpTools``): infer requests are answered
past ASGI by the app's infer handler, with keep-alive, pipelining, ``Expect: 100-continue`` and
``Connection: close`` as uvicorn answers them; everything else still reaches the ASGI app."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import socket
from collections.abc import AsyncIterator

import orjson
import pytest
import uvicorn
from starlette.applications import Starlette
from starlette.datastructures import Headers
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from gateway.http_server import ConnectionLimits, GuardedHttpTools, Refusals
from gateway.infer_lane import InferLane, InferRequest, LaneHeaders, LaneRequest, lane_of
from gateway.platforms.ports import PortDispatch
from gateway.responses import Rendered

Recorded = list[tuple[str, int]]


class Handler:
    """Answers with what it saw: the path parameters, the body, one header, and who asked."""

    def __init__(self) -> None:
        self.recorded: Recorded = []

    async def __call__(self, request: InferRequest) -> Rendered:
        chunks = [chunk async for chunk in request.stream()]
        if request.path_params["model"] == "broken":
            raise RuntimeError("a bug in the handler")
        if request.path_params["model"] == "echo":  # the body back, as binary parts after a JSON head
            whole = b"".join(chunks)
            return Rendered(b'{"echo":true}', tail=(whole[:1000], memoryview(whole)[1000:]),
                            media_type="application/octet-stream")
        body = {"params": request.path_params, "body": b"".join(chunks).decode(), "lane": isinstance(request,
                LaneRequest), "x": request.headers.get("x-test")}
        status = 404 if request.path_params["model"] == "missing" else 200
        return Rendered(orjson.dumps(body), status, headers={"X-Answer": "yes"})

    def record(self, model: str, status: int, seconds: float) -> None:
        assert seconds >= 0
        self.recorded.append((model, status))


def app_with_lane(handler: Handler) -> Starlette:
    async def infer(request: Request) -> Response:
        return (await handler(request)).response()

    async def other(request: Request) -> Response:
        return JSONResponse({"asgi": request.url.path})

    app = Starlette(routes=[Route("/v2/models/{model}/infer", infer, methods=["POST"]),
                            Route("/v2/health/ready", other, methods=["GET"])])
    app.state.infer_lane = InferLane(handler, handler.record)
    return app


@contextlib.asynccontextmanager
async def serving(app: Starlette | PortDispatch, **config: object) -> AsyncIterator[int]:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = int(sock.getsockname()[1])
    protocol = functools.partial(GuardedHttpTools, limits=ConnectionLimits(), refusals=Refusals(), lane=lane_of(app))
    settings = uvicorn.Config(app, lifespan="off", log_config=None, http=protocol, **config)  # type: ignore[arg-type]
    server = uvicorn.Server(settings)
    task = asyncio.create_task(server.serve(sockets=[sock]))
    try:
        while not server.started:
            assert not task.done(), "the server stopped while starting"
            await asyncio.sleep(0.01)
        yield port
    finally:
        server.should_exit = True
        await asyncio.wait_for(task, 10)
        sock.close()


def post(path: str, body: bytes = b"{}", *extra: str) -> bytes:
    head = [f"POST {path} HTTP/1.1", "host: ferry", f"content-length: {len(body)}", *extra]
    return ("\r\n".join(head) + "\r\n\r\n").encode() + body


async def read_response(reader: asyncio.StreamReader) -> tuple[int, dict[str, str], bytes]:
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
    status_line, *lines = head.decode("latin-1").split("\r\n")[:-2]
    headers = {name.lower(): value.strip() for name, _, value in (line.partition(":") for line in lines)}
    body = await asyncio.wait_for(reader.readexactly(int(headers.get("content-length", "0"))), 10)
    return int(status_line.split()[1]), headers, body


@pytest.fixture
def handler() -> Handler:
    return Handler()


async def test_an_infer_request_is_answered_on_the_lane_and_counted(handler: Handler) -> None:
    async with serving(app_with_lane(handler)) as port:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(post("/v2/models/add_sub/versions/2/infer", b'{"a":1}', "x-test: here"))
        status, headers, body = await read_response(reader)
        writer.close()
    assert status == 200
    assert orjson.loads(body) == {"params": {"model": "add_sub", "version": "2"}, "body": '{"a":1}', "lane": True,
                                  "x": "here"}
    assert headers["content-type"] == "application/json"
    assert headers["x-answer"] == "yes"
    assert "date" in headers and "server" in headers  # uvicorn's default headers, as through ASGI
    assert handler.recorded == [("add_sub", 200)]


async def test_pipelined_requests_are_answered_in_order_on_and_off_the_lane(handler: Handler) -> None:
    async with serving(app_with_lane(handler)) as port:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        get = b"GET /v2/health/ready HTTP/1.1\r\nhost: ferry\r\n\r\n"
        writer.write(post("/v2/models/one/infer") + get + post("/v2/models/missing/infer", b"[2]")
                     + post("/v2/models/three/infer", b"[3]"))
        answers = [await read_response(reader) for _ in range(4)]
        writer.close()
    assert [status for status, _, _ in answers] == [200, 200, 404, 200]
    assert orjson.loads(answers[0][2])["params"] == {"model": "one"}
    assert orjson.loads(answers[1][2]) == {"asgi": "/v2/health/ready"}
    assert orjson.loads(answers[2][2])["body"] == "[2]"
    assert orjson.loads(answers[3][2])["params"] == {"model": "three"}
    assert handler.recorded == [("one", 200), ("missing", 404), ("three", 200)]


async def test_expect_100_continue_gets_its_interim_answer_before_the_body_is_sent(handler: Handler) -> None:
    async with serving(app_with_lane(handler)) as port:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        whole = post("/v2/models/m/infer", b'{"late":true}', "expect: 100-continue")
        head, _, body = whole.partition(b"\r\n\r\n")
        writer.write(head + b"\r\n\r\n")
        interim = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
        assert interim.startswith(b"HTTP/1.1 100 Continue")
        writer.write(body)
        status, _, answer = await read_response(reader)
        writer.close()
    assert status == 200
    assert orjson.loads(answer)["body"] == '{"late":true}'


async def test_connection_close_is_honoured(handler: Handler) -> None:
    async with serving(app_with_lane(handler)) as port:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(post("/v2/models/m/infer", b"{}", "connection: close"))
        status, headers, _ = await read_response(reader)
        assert await asyncio.wait_for(reader.read(), 10) == b""  # closed after the answer
        writer.close()
    assert status == 200
    assert headers["connection"] == "close"


async def test_a_handler_that_raises_is_a_500_and_the_connection_serves_on(handler: Handler) -> None:
    async with serving(app_with_lane(handler)) as port:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(post("/v2/models/broken/infer"))
        status, _, body = await read_response(reader)
        writer.write(post("/v2/models/fine/infer"))
        after, _, _ = await read_response(reader)
        writer.close()
    assert (status, body) == (500, b"Internal Server Error")
    assert after == 200
    assert handler.recorded == [("broken", 500), ("fine", 200)]


async def test_a_root_path_and_a_platform_port_are_left_to_asgi(handler: Handler) -> None:
    async with serving(app_with_lane(handler), root_path="/ferry") as port:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(post("/v2/models/m/infer"))
        _, _, body = await read_response(reader)
        writer.close()
    assert orjson.loads(body)["lane"] is False
    main = app_with_lane(handler)
    with socket.socket() as probe:  # a port no one listens on: the dispatch's platform port
        probe.bind(("127.0.0.1", 0))
        platform_port = probe.getsockname()[1]
    lane = lane_of(PortDispatch(main, {platform_port: main}))
    assert lane is not None
    assert lane.accepts({"method": "POST", "path": "/v2/models/m/infer", "server": ("127.0.0.1", 1)}) == {"model": "m"}
    assert lane.accepts({"method": "POST", "path": "/v2/models/m/infer", "server": ("127.0.0.1", platform_port)}) \
        is None
    assert handler.recorded == []  # the ASGI route does not count: the app's middleware would


async def test_an_app_without_a_lane_answers_through_asgi(handler: Handler) -> None:
    app = app_with_lane(handler)
    del app.state.infer_lane
    assert lane_of(app) is None
    async with serving(app) as port:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(post("/v2/models/m/infer"))
        status, _, body = await read_response(reader)
        writer.close()
    assert status == 200
    assert orjson.loads(body)["lane"] is False


@pytest.mark.parametrize("size", [2_000, 3 * 224 * 224 * 2, 3_000_000])  # joined, or sent as parts
async def test_a_body_in_many_chunks_arrives_whole_and_parts_go_out_in_order(handler: Handler, size: int) -> None:
    payload = bytes(range(256)) * (size // 256) + b"!" * (size % 256)
    async with serving(app_with_lane(handler)) as port:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        request = post("/v2/models/echo/infer", payload)
        for start in range(0, len(request), 50_000):  # in pieces, so that uvicorn pauses and resumes reading
            writer.write(request[start:start + 50_000])
            await writer.drain()
            await asyncio.sleep(0.001)
        status, headers, body = await read_response(reader)
        writer.close()
    assert status == 200
    assert headers["content-type"] == "application/octet-stream"
    assert body == b'{"echo":true}' + payload


def test_lane_headers_read_as_starlettes_do() -> None:
    raw = [(b"prefer", b"respond-async"), (b"x-test", b"first"), (b"prefer", b"wait=5"), (b"x-test", b"second")]
    lane, starlette = LaneHeaders(raw), Headers(raw=raw)
    for name in ("prefer", "X-Test", "x-test", "absent"):
        assert lane.get(name) == starlette.get(name)
        assert (name in lane) == (name in starlette)
        assert lane.getlist(name) == starlette.getlist(name)
    assert lane["PREFER"] == "respond-async"
    assert sorted(lane) == ["prefer", "x-test"] and len(lane) == 2


async def test_a_header_value_with_a_line_break_is_never_written_and_a_500_goes_instead(handler: Handler) -> None:
    async def splitting(request: InferRequest) -> Rendered:
        return Rendered(b"{}", headers={"X-Evil": "a\r\nset-cookie: x=1"})

    app = app_with_lane(handler)
    app.state.infer_lane = InferLane(splitting, handler.record)
    async with serving(app) as port:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(post("/v2/models/m/infer"))
        status, headers, body = await read_response(reader)
        writer.close()
    assert (status, body) == (500, b"Internal Server Error")
    assert "set-cookie" not in headers
    assert handler.recorded == [("m", 500)]  # counted as it was answered


async def test_a_client_gone_mid_body_ends_the_request_instead_of_leaving_it_waiting(handler: Handler) -> None:
    seen: list[str] = []

    async def reading(request: InferRequest) -> Rendered:
        try:
            async for _ in request.stream():
                pass
        except ClientDisconnect:
            seen.append("disconnect")
            raise
        return Rendered(b"{}")

    app = app_with_lane(handler)
    app.state.infer_lane = InferLane(reading, handler.record)
    async with serving(app) as port:
        _, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(post("/v2/models/m/infer", b"x" * 100_000)[:50_000])  # headers and half the body
        await writer.drain()
        await asyncio.sleep(0.2)  # the request is waiting for the rest
        writer.close()
        for _ in range(200):
            if handler.recorded:
                break
            await asyncio.sleep(0.01)
    assert seen == ["disconnect"]
    assert handler.recorded == [("m", 500)]  # nothing could be written: counted as failed
