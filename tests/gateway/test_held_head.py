"""One write per response (``gateway.held_head``): a response's head goes out with its body,
and a head nothing follows still goes out, before the connection closes too."""

from __future__ import annotations

import asyncio
import shutil
import socket
from pathlib import Path

import orjson
import pytest

from gateway.held_head import HeldHead
from tests.procfs import child_pids, listens_on
from tests.servers import ferry_serve
from tests.test_serve_bad_input import MODEL_REPO, add_sub_body


class Recorded(asyncio.Transport):
    """A transport that keeps what each call was given."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[tuple[str, tuple[bytes, ...]]] = []
        self.closed = False

    def write(self, data) -> None:  # type: ignore[no-untyped-def]
        self.calls.append(("write", (bytes(data),)))

    def writelines(self, list_of_data) -> None:  # type: ignore[no-untyped-def]
        self.calls.append(("writelines", tuple(bytes(each) for each in list_of_data)))

    def close(self) -> None:
        self.closed = True

    def is_closing(self) -> bool:
        return self.closed

    def get_extra_info(self, name, default=None):  # type: ignore[no-untyped-def]
        return ("127.0.0.1", 1) if name == "peername" else default


async def test_a_head_and_its_body_go_out_as_one_call() -> None:
    transport = Recorded()
    held = HeldHead(transport, asyncio.get_running_loop())
    held.write(b"HTTP/1.1 200 OK\r\n\r\n")
    assert transport.calls == []
    held.write(b"body")
    await asyncio.sleep(0)  # the flush scheduled for the head finds nothing left
    assert transport.calls == [("writelines", (b"HTTP/1.1 200 OK\r\n\r\n", b"body"))]


async def test_a_head_no_body_follows_goes_out_at_the_next_turn_and_a_later_chunk_after_it() -> None:
    transport = Recorded()
    held = HeldHead(transport, asyncio.get_running_loop())
    held.write(b"head")
    await asyncio.sleep(0)
    assert transport.calls == [("write", (b"head",))]
    held.write(b"chunk")
    await asyncio.sleep(0)
    assert transport.calls == [("write", (b"head",)), ("write", (b"chunk",))]
    assert held.get_extra_info("peername") == ("127.0.0.1", 1)  # the rest is the transport's


async def test_closing_sends_what_is_held_first_and_nothing_goes_to_a_closed_transport() -> None:
    transport = Recorded()
    held = HeldHead(transport, asyncio.get_running_loop())
    held.write(b"head")
    held.close()
    assert transport.calls == [("write", (b"head",))] and transport.closed
    held.write(b"late")
    await asyncio.sleep(0)
    assert transport.calls == [("write", (b"head",))]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory):
    """``ferry serve``'s address and pid."""
    repo = tmp_path_factory.mktemp("repo")
    shutil.copytree(MODEL_REPO / "add_sub", repo / "add_sub")
    with ferry_serve(repo) as address:
        port = int(address.rpartition(":")[2])
        [pid] = [child for child in child_pids() if listens_on(child, port)]
        yield address, pid


def write_calls(pid: int) -> int:
    """How many write system calls the process has made (``syscw``; a send on a socket is one)."""
    for line in Path(f"/proc/{pid}/io").read_text().splitlines():
        if line.startswith("syscw:"):
            return int(line.split()[1])
    raise AssertionError(f"/proc/{pid}/io has no syscw")


def read_response(sock: socket.socket) -> bytes:
    """A whole response with a content-length."""
    received = b""
    while True:
        chunk = sock.recv(1 << 16)
        assert chunk, f"the server closed after {received!r}"
        received += chunk
        head, blank, body = received.partition(b"\r\n\r\n")
        if blank and (length := _content_length(head)) is not None and len(body) >= length:
            return received


def _content_length(head: bytes) -> int | None:
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            return int(value)
    return None


def _request(path: str) -> bytes:
    if not path.endswith("/infer"):
        return b"GET %s HTTP/1.1\r\nhost: x\r\n\r\n" % path.encode()
    body = orjson.dumps(add_sub_body())
    return b"POST %s HTTP/1.1\r\nhost: x\r\ncontent-length: %d\r\n\r\n%s" % (path.encode(), len(body), body)


@pytest.mark.parametrize("path", ["/v2/models/add_sub/infer", "/v2/models/add_sub", "/v2/health/ready"])
def test_each_response_is_one_write(server: tuple[str, int], path: str) -> None:
    """The infer door's, the router's, and one without a body: about one write call each
    (two without ``HeldHead``; the slack is for anything else the server writes meanwhile)."""
    address, pid = server
    host, port = address.split(":")
    request, count = _request(path), 100
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(request)
        read_response(sock)
        before = write_calls(pid)
        for _ in range(count):
            sock.sendall(request)
            assert read_response(sock).startswith(b"HTTP/1.1 200")
        assert write_calls(pid) - before < 1.3 * count
