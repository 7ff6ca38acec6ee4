"""Hostile HTTP against a running ``ferry serve``: bad framing, lying lengths,
absurd shapes and parameters, slow and silent clients. Each gets a 4xx (or
its connection closed), never a 5xx and never a hang, and a good request
right after it still succeeds. Every socket operation has a deadline.

The server runs with one-second header and body timeouts, so the slow-client
cases take seconds, not minutes."""

from __future__ import annotations

import re
import shutil
import socket
import struct
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import orjson
import pytest

from tests.servers import ferry_serve
from tests.test_serve_bad_input import MODEL_REPO, add_sub_body, assert_still_serving, binary_body, bytes_header

TIMEOUT_S = 1  # --header-timeout-s and --body-timeout-s
SILENT = 40  # connections that never send a byte
SLACK_S = 8  # how much later than a timeout a closed connection may be noticed, on a busy machine
INFER = "/v2/models/add_sub/infer"


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    repo = tmp_path_factory.mktemp("repo")
    for name in ("add_sub", "text_stats"):
        shutil.copytree(MODEL_REPO / name, repo / name)
    return repo


@pytest.fixture(scope="module")
def server(repo: Path, tmp_path_factory: pytest.TempPathFactory):
    log_path = tmp_path_factory.mktemp("log") / "serve.log"
    with ferry_serve(repo, "--max-body-bytes", "1000000", "--header-timeout-s", str(TIMEOUT_S),
                     "--body-timeout-s", str(TIMEOUT_S), log_path=log_path) as address:
        yield address, log_path


@pytest.fixture
def address(server) -> str:
    return server[0]


@pytest.fixture
def http(address: str):
    with httpx.Client(base_url=f"http://{address}", timeout=10) as client:
        yield client


# -- raw sockets -------------------------------------------------------------

def connect(address: str, timeout_s: float = 10) -> socket.socket:
    host, port = address.split(":")
    return socket.create_connection((host, int(port)), timeout=timeout_s)


def send(sock: socket.socket, data: bytes) -> bool:
    """False when the server has already hung up (it may answer before reading it all)."""
    try:
        sock.sendall(data)
        return True
    except OSError:
        return False


def read_until_closed(sock: socket.socket, within_s: float) -> bytes:
    deadline = time.monotonic() + within_s
    received = b""
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            raise AssertionError(f"the server held the connection over {within_s} s; got {received[:300]!r}")
        sock.settimeout(left)
        try:
            chunk = sock.recv(65536)
        except ConnectionResetError:
            return received
        except TimeoutError:
            continue
        if not chunk:
            return received
        received += chunk


def statuses(received: bytes) -> list[int]:
    return [int(code) for code in re.findall(rb"HTTP/1\.[01] (\d{3}) ", received)]


def exchange(address: str, data: bytes, within_s: float = TIMEOUT_S + SLACK_S) -> list[int]:
    with connect(address) as sock:
        send(sock, data)
        return statuses(read_until_closed(sock, within_s))


def post(body: bytes, *headers: bytes, path: bytes = INFER.encode()) -> bytes:
    head = b"POST " + path + b" HTTP/1.1\r\nHost: ferry\r\nConnection: close\r\n"
    return head + b"".join(h + b"\r\n" for h in headers) + b"\r\n" + body


GOOD = orjson.dumps(add_sub_body())
CHUNKED = b"Transfer-Encoding: chunked"

RESET = None  # the server hung up before its answer could be read (a close amid unread data is a reset)

FRAMING = [
    # (id, raw bytes, the statuses that may come first)
    ("garbage-request-line", b"HELLO THERE\r\n\r\n", {400}),
    ("unknown-method", b"FROBNICATE / HTTP/1.1\r\nHost: ferry\r\n\r\n", {400}),
    ("space-in-header-name", b"GET /v2/health/live HTTP/1.1\r\nHo st: ferry\r\n\r\n", {400}),
    ("nul-in-header-value", b"GET /v2/health/live HTTP/1.1\r\nHost: fe\x00rry\r\n\r\n", {400}),
    ("chunk-size-overflows", post(b"FFFFFFFFFFFFFFFFFFFFFFFF\r\nabc\r\n0\r\n\r\n", CHUNKED), {400}),
    ("chunk-size-not-hex", post(b"zz\r\nabc\r\n0\r\n\r\n", CHUNKED), {400}),
    ("chunk-size-absurd-then-stall", post(b"7FFFFFFF\r\n" + GOOD, CHUNKED), {408}),
    ("chunked-and-content-length", post(b"0\r\n\r\n", CHUNKED, b"Content-Length: 5"), {400}),
    ("two-content-lengths", post(GOOD, b"Content-Length: %d" % len(GOOD), b"Content-Length: 3"), {400}),
    ("negative-content-length", post(GOOD, b"Content-Length: -1"), {400}),
    ("content-length-overflows", post(GOOD, b"Content-Length: 99999999999999999999999999"), {400}),
    ("content-length-over-the-body-limit", post(GOOD, b"Content-Length: 1000000000000"), {413}),
    ("content-length-shorter-than-body", post(GOOD, b"Content-Length: 10"), {400}),
    ("content-length-longer-than-body", post(GOOD, b"Content-Length: %d" % (len(GOOD) + 500)), {408}),
    ("expect-continue-then-nothing", post(b"", b"Content-Length: 100", b"Expect: 100-continue"), {100}),
    ("header-block-of-a-megabyte", post(GOOD, *[b"X-Pad-%d: %s" % (i, b"p" * 1000) for i in range(1000)]),
     {400, RESET}),
    ("url-of-a-megabyte", post(GOOD, b"Content-Length: %d" % len(GOOD), path=b"/" + b"a" * 1_000_000), {400, RESET}),
]


@pytest.mark.parametrize(("data", "first"), [c[1:] for c in FRAMING], ids=[c[0] for c in FRAMING])
def test_bad_framing_gets_a_4xx_or_a_close_and_the_server_keeps_serving(address, http, data, first):
    codes = exchange(address, data)
    assert (codes[0] if codes else RESET) in first, codes
    assert all(code < 500 for code in codes), codes
    if 100 in first:
        assert codes == [100, 408], codes  # the client was invited to send, and then timed out
    assert_still_serving(http)


# -- bodies ------------------------------------------------------------------

def add_sub_with(**fields: object) -> bytes:
    return orjson.dumps({**add_sub_body(), **fields})


def shaped(shape: list, data: list | None = None, datatype: str = "FP32") -> bytes:
    return orjson.dumps({"inputs": [{"name": "INPUT0", "shape": shape, "datatype": datatype, "data": data or []}]})


def binary_shaped(shape: list, size: int = 0) -> tuple[bytes, dict[str, str]]:
    return binary_body({"inputs": [{"name": "INPUT0", "shape": shape, "datatype": "FP32",
                                    "parameters": {"binary_data_size": size}}]}, b"\x00" * size)


def bytes_tensor(blob: bytes, shape: list | None = None) -> tuple[bytes, dict[str, str]]:
    header = bytes_header(len(blob))
    header["inputs"][0]["shape"] = shape or [1, 1]
    return binary_body(header, blob)


def nested_data(depth: int) -> bytes:
    """A tensor whose one element sits ``depth`` lists deep (orjson cannot write it)."""
    return (b'{"inputs":[{"name":"INPUT0","shape":[1],"datatype":"FP32","data":'
            + b"[" * depth + b"1.0" + b"]" * depth + b"}]}")


def many_outputs(count: int, name_length: int = 8) -> list[dict]:
    return [{"name": f"o{i}".ljust(name_length, "x")} for i in range(count)]


HEADER_LENGTH = "Inference-Header-Content-Length"

BODIES = [
    # (id, path, body, headers, acceptable statuses)
    ("deep-json-arrays", INFER, b"[" * 200_000, {}, {400}),
    ("deep-json-objects", INFER, b'{"a":' * 200_000, {}, {400}),
    ("deep-tensor-data", INFER, nested_data(1000), {}, {400}),
    ("huge-dims", INFER, shaped([2**62, 2**62]), {}, {400}),
    ("dims-beyond-uint64", INFER, shaped([2**63, 1]).replace(b"%d" % 2**63, b"%d" % 2**70), {}, {400}),
    ("negative-dim", INFER, shaped([-1, 16], [1.0] * 16), {}, {400}),
    ("dim-product-overflows-int64", INFER, shaped([2**40 - 1] * 16), {}, {400}),
    ("binary-product-overflows", INFER, *binary_shaped([2**40 - 1] * 16), {400}),
    ("zero-times-huge-dim", INFER, *binary_shaped([0, 2**62]), {400}),
    ("seventeen-dims", INFER, shaped([1] * 17, [1.0]), {}, {400}),
    ("bytes-prefix-of-4-gib", "/v2/models/text_stats/infer",
     *bytes_tensor(struct.pack("<I", 0xFFFFFFFF) + b"tiny"), {400}),
    ("bytes-prefix-too-short", "/v2/models/text_stats/infer",
     *bytes_tensor(struct.pack("<I", 2) + b"hello"), {400}),
    ("bytes-prefix-cut-in-half", "/v2/models/text_stats/infer", *bytes_tensor(b"\x05\x00"), {400}),
    ("bytes-count-beyond-data", "/v2/models/text_stats/infer",
     *bytes_tensor(struct.pack("<I", 1) + b"a", shape=[1, 2**40 - 1]), {400}),
    ("superscript-two-version", "/v2/models/add_sub/versions/\u00b2/infer", GOOD, {}, {404}),
    ("fullwidth-one-version", "/v2/models/add_sub/versions/\uff11/infer", GOOD, {}, {404}),
    ("arabic-indic-one-version", "/v2/models/add_sub/versions/\u0661/infer", GOOD, {}, {404}),
    ("version-of-a-thousand-digits", "/v2/models/add_sub/versions/" + "0" * 999 + "1/infer", GOOD, {}, {404}),
    ("fullwidth-header-length", INFER, GOOD, {HEADER_LENGTH: "\uff11\uff12".encode()}, {400}),
    ("header-length-of-30-digits", INFER, GOOD, {HEADER_LENGTH: "9" * 30}, {400}),
    ("65-parameters", INFER, add_sub_with(parameters={f"p{i}": i for i in range(65)}), {}, {400}),
    ("10000-parameters", INFER, add_sub_with(parameters={f"p{i}": i for i in range(10_000)}), {}, {400}),
    ("a-parameter-of-500-kb", INFER, add_sub_with(parameters={"big": "x" * 500_000}), {}, {200}),
    ("257-outputs", INFER, add_sub_with(outputs=many_outputs(257)), {}, {400}),
    ("1025-outputs", INFER, add_sub_with(outputs=many_outputs(1025)), {}, {400}),
    ("20000-outputs", INFER, add_sub_with(outputs=many_outputs(20_000)), {}, {400}),
    ("an-output-name-of-300-chars", INFER, add_sub_with(outputs=many_outputs(1, 300)), {}, {400}),
    ("257-inputs", INFER, orjson.dumps({"inputs": [{"name": f"i{i}", "shape": [1], "datatype": "FP32",
                                                    "data": [1.0]} for i in range(257)]}), {}, {400}),
    ("an-input-name-of-300-chars", INFER, orjson.dumps({"inputs": [{"name": "I" * 300, "shape": [1],
                                                                    "datatype": "FP32", "data": [1.0]}]}), {}, {400}),
    ("timeout-2-to-62-us", INFER, add_sub_with(parameters={"timeout": 2**62}), {}, {400}),
    ("timeout-uint64-max", INFER, add_sub_with(parameters={"timeout": 2**64 - 1}), {}, {400}),
    ("timeout-negative", INFER, add_sub_with(parameters={"timeout": -1}), {}, {400}),
    ("priority-uint64-max", INFER, add_sub_with(parameters={"priority": 2**64 - 1}), {}, {400}),
    ("sequence-id-of-300-chars", INFER, add_sub_with(parameters={"sequence_id": "s" * 300}), {}, {400}),
]


@pytest.mark.parametrize(("path", "body", "headers", "expected"), [c[1:] for c in BODIES],
                         ids=[c[0] for c in BODIES])
def test_hostile_bodies_get_a_clear_4xx_and_the_server_keeps_serving(http, path, body, headers, expected):
    response = http.post(path, content=body, headers=headers)
    assert response.status_code in expected, response.text[:500]
    if response.status_code >= 400:
        assert response.json()["error"]
    assert_still_serving(http)


def test_the_async_job_door_refuses_over_limit_requests_up_front(http):
    response = http.post(INFER, content=add_sub_with(outputs=many_outputs(1025)),
                         headers={"Prefer": "respond-async"})
    assert response.status_code == 400 and "outputs" in response.json()["error"]
    assert_still_serving(http)


# -- slow and silent clients -------------------------------------------------

def wait_closed(sock: socket.socket) -> tuple[float, list[int]]:
    started = time.monotonic()
    codes = statuses(read_until_closed(sock, TIMEOUT_S + SLACK_S))
    return time.monotonic() - started, codes


def test_silent_connections_are_closed_after_the_header_timeout(address, http):
    sockets = [connect(address) for _ in range(SILENT)]
    try:
        with ThreadPoolExecutor(len(sockets)) as pool:
            results = list(pool.map(wait_closed, sockets))
    finally:
        for sock in sockets:
            sock.close()
    assert all(codes == [] for _, codes in results), results
    assert max(waited for waited, _ in results) < TIMEOUT_S + SLACK_S
    assert_still_serving(http)


def drip(address: str, data: bytes, every_s: float) -> list[int]:
    with connect(address) as sock:
        deadline = time.monotonic() + TIMEOUT_S + SLACK_S
        for byte in data:
            if time.monotonic() > deadline or not send(sock, bytes([byte])):
                break
            time.sleep(every_s)
        else:
            raise AssertionError("the server let a dripping client send its whole request")
        return statuses(read_until_closed(sock, SLACK_S))


def test_clients_dripping_their_headers_get_408(address, http):
    request = post(GOOD, b"Content-Length: %d" % len(GOOD))
    with ThreadPoolExecutor(16) as pool:
        results = list(pool.map(lambda _: drip(address, request, 0.1), range(16)))
    assert all(codes in ([408], []) for codes in results), results
    assert [408] in results
    assert_still_serving(http)


def stall_mid_body(address: str) -> tuple[float, list[int]]:
    with connect(address) as sock:
        send(sock, post(GOOD[:20], b"Content-Length: %d" % len(GOOD)))
        return wait_closed(sock)


def test_requests_stalled_mid_body_get_408(address, http):
    with ThreadPoolExecutor(16) as pool:
        results = list(pool.map(lambda _: stall_mid_body(address), range(16)))
    assert all(codes == [408] for _, codes in results), results
    assert_still_serving(http)


def test_a_connection_over_the_limit_is_refused_with_503_not_queued(repo):
    limit = 8
    # A long header timeout, so the connections that fill the server stay while the extra one comes.
    with ferry_serve(repo, "--max-connections", str(limit), "--header-timeout-s", "60") as address:
        sockets = [connect(address) for _ in range(limit)]
        try:
            with connect(address) as extra:
                send(extra, b"GET /v2/health/live HTTP/1.1\r\nHost: ferry\r\n\r\n")
                codes = statuses(read_until_closed(extra, SLACK_S))
        finally:
            for sock in sockets:
                sock.close()
        assert codes in ([503], []), codes  # 503, or reset before it could be read
        with httpx.Client(base_url=f"http://{address}", timeout=10) as fresh:
            deadline = time.monotonic() + SLACK_S  # until the server has seen the others go
            while not is_live(fresh) and time.monotonic() < deadline:
                time.sleep(0.1)
            assert_still_serving(fresh)


def is_live(client: httpx.Client) -> bool:
    try:
        return client.get("/v2/health/live").status_code == 200
    except httpx.TransportError:  # refused, and reset before the 503 could be read
        return False


def test_a_client_that_hangs_up_mid_body_is_logged_at_info_without_a_traceback(server, http):
    address, log_path = server
    with connect(address) as sock:
        send(sock, post(GOOD[:20], b"Content-Length: %d" % len(GOOD)))
        time.sleep(0.2)
    deadline = time.monotonic() + SLACK_S
    while b"http.client_disconnected" not in log_path.read_bytes() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert_still_serving(http)
    lines = [orjson.loads(line) for line in log_path.read_bytes().splitlines() if line.startswith(b"{")]
    disconnects = [line for line in lines if line.get("event") == "http.client_disconnected"]
    assert disconnects and all(line["level"] == "info" and "exception" not in line for line in disconnects)
    text = log_path.read_text(errors="replace")
    assert "Traceback" not in text and "http.unhandled" not in text and "Exception in ASGI" not in text


def test_the_connection_flags_are_validated_naming_the_flag(tmp_path):
    for flag, value in (("--header-timeout-s", "0"), ("--body-timeout-s", "-1"), ("--max-connections", "0")):
        result = subprocess.run([sys.executable, "-m", "ferry.cli.main", "serve", "--model-repository", str(tmp_path),
                                 flag, value], capture_output=True, timeout=60)
        assert result.returncode != 0 and flag.encode() in result.stderr, result.stderr
