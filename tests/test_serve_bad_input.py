"""Bad input against a running ``ferry serve``: each class gets a 4xx with a
clear message, never disturbs other requests, and the server keeps serving."""

from __future__ import annotations

import asyncio
import shutil
import struct
from pathlib import Path

import httpx
import numpy as np
import orjson
import pytest

from tests.models import write_python_model
from tests.servers import ferry_serve

MODEL_REPO = Path(__file__).resolve().parent.parent / "model_repo"
BODY_LIMIT = 1_000_000

GUARDED = """
import numpy as np

class Model:
    def load(self, context):
        pass

    def infer(self, inputs):
        x = inputs["X"]
        if (x < 0).any():
            raise ValueError("X must not be negative")
        rows = np.full((x.shape[0], 1), x.shape[0], dtype=np.int32)
        return {"Y": x * 2, "ROWS": rows}

    def unload(self):
        pass
"""
GUARDED_CONFIG = """
name: "guarded"
backend: "python"
max_batch_size: 16
input [{ name: "X" data_type: TYPE_FP32 dims: [ 4 ] }]
output [{ name: "Y" data_type: TYPE_FP32 dims: [ 4 ] }, { name: "ROWS" data_type: TYPE_INT32 dims: [ 1 ] }]
dynamic_batching { max_queue_delay_microseconds: 50000 }
"""


@pytest.fixture(scope="module")
def base_url(tmp_path_factory: pytest.TempPathFactory):
    repo = tmp_path_factory.mktemp("repo")
    for name in ("add_sub", "text_stats"):
        shutil.copytree(MODEL_REPO / name, repo / name)
    write_python_model(repo, "guarded", GUARDED, GUARDED_CONFIG)
    with ferry_serve(repo, "--max-body-bytes", str(BODY_LIMIT)) as url:
        yield f"http://{url}"


@pytest.fixture
def http(base_url: str):
    with httpx.Client(base_url=base_url, timeout=30) as client:
        yield client


def add_sub_body(a: list[float] | None = None, shape: list[int] | None = None, datatype: str = "FP32") -> dict:
    a = a if a is not None else [float(i) for i in range(16)]
    return {"inputs": [
        {"name": "INPUT0", "shape": shape or [1, 16], "datatype": datatype, "data": a},
        {"name": "INPUT1", "shape": [1, 16], "datatype": "FP32", "data": [1.0] * 16},
    ]}


def assert_still_serving(http: httpx.Client) -> None:
    response = http.post("/v2/models/add_sub/infer", content=orjson.dumps(add_sub_body()))
    assert response.status_code == 200, response.text
    outputs = {o["name"]: o["data"] for o in response.json()["outputs"]}
    assert outputs["OUTPUT0"] == [i + 1.0 for i in range(16)]


def binary_body(header: dict, *blobs: bytes) -> tuple[bytes, dict[str, str]]:
    head = orjson.dumps(header)
    return head + b"".join(blobs), {"Inference-Header-Content-Length": str(len(head))}


def bytes_header(size: int) -> dict:
    return {"inputs": [{"name": "TEXT", "shape": [1, 1], "datatype": "BYTES",
                        "parameters": {"binary_data_size": size}}]}


OVERRUN = struct.pack("<I", 50) + b"short"
NAN_BODY = b'{"inputs":[{"name":"INPUT0","shape":[1,16],"datatype":"FP32","data":[NaN' + b",0" * 15 + b"]}]}"
INF_BODY = NAN_BODY.replace(b"NaN", b"Infinity")

CASES = [
    # (id, path, body, headers, status, message fragment)
    ("malformed-json", "/v2/models/add_sub/infer", b'{"inputs": [', {}, 400, "JSON"),
    ("unknown-model", "/v2/models/nope/infer", orjson.dumps(add_sub_body()), {}, 404, "nope"),
    ("unknown-version", "/v2/models/add_sub/versions/7/infer", orjson.dumps(add_sub_body()), {}, 404, "'add_sub' version 7 is not found"),
    ("wrong-datatype", "/v2/models/add_sub/infer",
     orjson.dumps(add_sub_body([0] * 16, datatype="INT32")), {}, 400, "INPUT0"),
    ("shape-vs-count", "/v2/models/add_sub/infer",
     orjson.dumps(add_sub_body([1.0] * 15)), {}, 400, "INPUT0"),
    ("bad-inner-dims", "/v2/models/add_sub/infer",
     orjson.dumps(add_sub_body([1.0] * 8, shape=[1, 8])), {}, 400, "INPUT0"),
    ("batch-too-large", "/v2/models/add_sub/infer",
     orjson.dumps(add_sub_body([1.0] * 16 * 9, shape=[9, 16])), {}, 400, "max_batch_size"),
    ("nan-literal", "/v2/models/add_sub/infer", NAN_BODY, {}, 400, "NaN"),
    ("infinity-literal", "/v2/models/add_sub/infer", INF_BODY, {}, 400, "Infinity"),
    ("bytes-prefix-overrun", "/v2/models/text_stats/infer",
     *binary_body(bytes_header(len(OVERRUN)), OVERRUN), 400, "TEXT"),
    ("header-length-past-body", "/v2/models/add_sub/infer",
     orjson.dumps(add_sub_body()), {"Inference-Header-Content-Length": "100000"}, 400,
     "Inference-Header-Content-Length"),
    ("dotdot-model-name", "/v2/models/%2E%2E/infer", orjson.dumps(add_sub_body()), {}, 400, ".."),
    ("dotdot-in-name", "/v2/models/add_sub..x/infer", orjson.dumps(add_sub_body()), {}, 400, ".."),
    ("slash-in-name", "/v2/models/add_sub%2F..%2Fetc/infer", orjson.dumps(add_sub_body()), {}, 400, "/"),
    ("slash-path", "/v2/models/a/b/infer", orjson.dumps(add_sub_body()), {}, 400, "/"),
]


@pytest.mark.parametrize(("path", "body", "headers", "status", "fragment"),
                         [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_bad_request_gets_a_clear_4xx_and_the_server_keeps_serving(http, path, body, headers, status, fragment):
    response = http.post(httpx.URL(path) if "%" not in path else path, content=body, headers=headers)
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert fragment in error, error
    assert_still_serving(http)


def test_oversized_body_gets_413_whether_declared_or_streamed(http):
    big = b"x" * (BODY_LIMIT + 1)
    declared = http.post("/v2/models/add_sub/infer", content=big)
    assert declared.status_code == 413 and "limit" in declared.json()["error"]

    def chunks():
        for _ in range(5):
            yield b"y" * (BODY_LIMIT // 4)

    streamed = http.post("/v2/models/add_sub/infer", content=chunks())
    assert streamed.status_code == 413
    assert_still_serving(http)


def test_unknown_model_metadata_and_config_are_404(http):
    for path in ("/v2/models/nope", "/v2/models/nope/config", "/v2/models/add_sub/versions/3"):
        response = http.get(path)
        assert response.status_code == 404 and "error" in response.json()


def test_a_model_that_rejects_a_value_fails_only_that_request(http):
    response = http.post("/v2/models/guarded/infer", content=orjson.dumps(guarded_body(-1.0)))
    assert response.status_code == 400 and "X must not be negative" in response.json()["error"]


def guarded_body(value: float) -> dict:
    return {"inputs": [{"name": "X", "shape": [1, 4], "datatype": "FP32", "data": [value] * 4}]}


async def test_bad_requests_inside_a_batch_fail_alone_and_every_good_one_is_correct(base_url):
    good_values = [float(v) for v in range(1, 25)]
    bad = [orjson.dumps(guarded_body(-5.0)),  # raises inside the model, mid-batch
           orjson.dumps({"inputs": [{"name": "X", "shape": [1, 3], "datatype": "FP32", "data": [1.0] * 3}]}),
           orjson.dumps({"inputs": [{"name": "X", "shape": [1, 4], "datatype": "FP32", "data": ["a"] * 4}]})]
    async with httpx.AsyncClient(base_url=base_url, timeout=30,
                                 limits=httpx.Limits(max_connections=64)) as client:
        async def post(body: bytes) -> httpx.Response:
            return await client.post("/v2/models/guarded/infer", content=body)

        bodies = [orjson.dumps(guarded_body(v)) for v in good_values]
        bodies[5:5] = bad[:1]
        bodies[12:12] = bad[1:2]
        bodies.append(bad[2])
        responses = await asyncio.gather(*(post(b) for b in bodies))
    by_body = dict(zip(bodies, responses))
    for value in good_values:
        response = by_body[orjson.dumps(guarded_body(value))]
        assert response.status_code == 200, response.text
        outputs = {o["name"]: o["data"] for o in response.json()["outputs"]}
        assert outputs["Y"] == [value * 2] * 4
    for body in bad:
        assert 400 <= by_body[body].status_code < 500
    rows = [max(o["data"]) for r in responses if r.status_code == 200
            for o in r.json()["outputs"] if o["name"] == "ROWS"]
    assert max(rows) > 1, "the good requests were never batched together"
    assert np.sum(rows) >= len(good_values)
