"""``ferry serve`` end to end, driven by the official tritonclient, unchanged.

Every result is compared with onnxruntime run directly on the same file.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import ml_dtypes
import numpy as np
import onnxruntime as ort
import pytest
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.models import IDENTITY_DATATYPES, write_identity_model, write_python_model
from tests.servers import ferry_serve

MODEL_REPO = Path(__file__).resolve().parent.parent / "model_repo"

BF16_ECHO = """
import numpy as np

class Model:
    def load(self, context):
        pass

    def infer(self, inputs):
        return {"OUT": inputs["IN"].astype(np.float32) * 2}

    def unload(self):
        pass
"""
BF16_CONFIG = """
name: "bf16_double"
backend: "python"
max_batch_size: 4
input [{ name: "IN" data_type: TYPE_BF16 dims: [ -1 ] }]
output [{ name: "OUT" data_type: TYPE_FP32 dims: [ -1 ] }]
"""


@pytest.fixture(scope="module")
def repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    repo = tmp_path_factory.mktemp("repo")
    for name in ("add_sub", "cnn", "text_stats"):
        shutil.copytree(MODEL_REPO / name, repo / name)
    for datatype in IDENTITY_DATATYPES:
        write_identity_model(repo, f"identity_{datatype.lower()}", [datatype])
    write_python_model(repo, "bf16_double", BF16_ECHO, BF16_CONFIG)
    # As found in many Triton repositories: the model file and no config.pbtxt.
    (repo / "bare_add_sub" / "1").mkdir(parents=True)
    shutil.copy(MODEL_REPO / "add_sub/1/model.onnx", repo / "bare_add_sub/1/model.onnx")
    return repo


@pytest.fixture(scope="module")
def client(repository: Path, tmp_path_factory: pytest.TempPathFactory):
    log = tmp_path_factory.mktemp("logs") / "ferry.log"
    with ferry_serve(repository, log_path=log) as url:
        triton = httpclient.InferenceServerClient(url)
        yield triton
        triton.close()


def onnx_direct(model_file: Path, feed: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    session = ort.InferenceSession(str(model_file), providers=["CPUExecutionProvider"])
    names = [o.name for o in session.get_outputs()]
    return dict(zip(names, session.run(names, feed)))


def test_health_metadata_and_config(client: httpclient.InferenceServerClient):
    assert client.is_server_live()
    assert client.is_server_ready()
    assert client.is_model_ready("add_sub")
    assert client.is_model_ready("cnn", "1")
    assert not client.is_model_ready("no_such_model")
    metadata = client.get_model_metadata("add_sub")
    assert metadata["name"] == "add_sub"
    assert metadata["versions"] == ["1"]
    assert {i["name"]: (i["datatype"], i["shape"]) for i in metadata["inputs"]} == {
        "INPUT0": ("FP32", [-1, 16]), "INPUT1": ("FP32", [-1, 16])}
    config = client.get_model_config("cnn")
    assert config["max_batch_size"] == 64
    assert config["input"][0]["data_type"] == "TYPE_FP32"
    assert config["dynamic_batching"]["preferred_batch_size"] == [16, 32, 64]
    assert client.get_server_metadata()["name"] == "ferry"


@pytest.mark.parametrize("binary_in", [True, False])
@pytest.mark.parametrize("binary_out", [True, False])
def test_add_sub_matches_onnxruntime(client, repository, binary_in, binary_out):
    rng = np.random.default_rng(1)
    a = rng.standard_normal((3, 16)).astype(np.float32)
    b = rng.standard_normal((3, 16)).astype(np.float32)
    inputs = [httpclient.InferInput("INPUT0", [3, 16], "FP32"), httpclient.InferInput("INPUT1", [3, 16], "FP32")]
    inputs[0].set_data_from_numpy(a, binary_data=binary_in)
    inputs[1].set_data_from_numpy(b, binary_data=binary_in)
    outputs = [httpclient.InferRequestedOutput(n, binary_data=binary_out) for n in ("OUTPUT0", "OUTPUT1")]
    result = client.infer("add_sub", inputs, outputs=outputs, request_id="req-7")
    expected = onnx_direct(repository / "add_sub/1/model.onnx", {"INPUT0": a, "INPUT1": b})
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), expected["OUTPUT0"])
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), expected["OUTPUT1"])
    response = result.get_response()
    assert response["id"] == "req-7" and response["model_version"] == "1"


@pytest.mark.parametrize("algorithm", ["gzip", "deflate"])
@pytest.mark.parametrize("binary", [True, False])
def test_compressed_requests_and_responses(client, repository, algorithm, binary):
    rng = np.random.default_rng(3)
    a, b = (rng.standard_normal((2, 16)).astype(np.float32) for _ in range(2))
    inputs = [httpclient.InferInput("INPUT0", [2, 16], "FP32"), httpclient.InferInput("INPUT1", [2, 16], "FP32")]
    inputs[0].set_data_from_numpy(a, binary_data=binary)
    inputs[1].set_data_from_numpy(b, binary_data=binary)
    outputs = [httpclient.InferRequestedOutput(n, binary_data=binary) for n in ("OUTPUT0", "OUTPUT1")]
    result = client.infer("add_sub", inputs, outputs=outputs, request_compression_algorithm=algorithm,
                          response_compression_algorithm=algorithm)
    expected = onnx_direct(repository / "add_sub/1/model.onnx", {"INPUT0": a, "INPUT1": b})
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), expected["OUTPUT0"])
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), expected["OUTPUT1"])


def test_cnn_batch_matches_onnxruntime(client, repository):
    images = np.random.default_rng(2).random((4, 3, 128, 128), dtype=np.float32)
    image_input = httpclient.InferInput("IMAGE", list(images.shape), "FP32")
    image_input.set_data_from_numpy(images)
    result = client.infer("cnn", [image_input])
    expected = onnx_direct(repository / "cnn/1/model.onnx", {"IMAGE": images})["PROBS"]
    np.testing.assert_allclose(result.as_numpy("PROBS"), expected, rtol=1e-5, atol=1e-7)


CNN_LABELS = ["airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck"]


@pytest.mark.parametrize("binary", [True, False])
def test_classification_gives_the_top_classes_with_their_labels(client, repository, binary):
    images = np.random.default_rng(4).random((2, 3, 128, 128), dtype=np.float32)
    image_input = httpclient.InferInput("IMAGE", list(images.shape), "FP32")
    image_input.set_data_from_numpy(images)
    top = httpclient.InferRequestedOutput("PROBS", binary_data=binary, class_count=3)
    result = client.infer("cnn", [image_input], outputs=[top])
    classes = result.as_numpy("PROBS")
    assert classes.shape == (2, 3) and result.get_output("PROBS")["datatype"] == "BYTES"
    expected = onnx_direct(repository / "cnn/1/model.onnx", {"IMAGE": images})["PROBS"]
    for row, probs in zip(classes, expected):
        # Binary outputs come back as bytes, JSON ones as str.
        parsed = [(entry.decode() if isinstance(entry, bytes) else entry).split(":") for entry in row]
        assert [int(index) for _, index, _ in parsed] == np.argsort(-probs, kind="stable")[:3].tolist()
        assert [label for _, _, label in parsed] == [CNN_LABELS[int(index)] for _, index, _ in parsed]
        np.testing.assert_allclose([float(score) for score, _, _ in parsed], np.sort(probs)[::-1][:3], atol=2e-6)


def test_classification_without_labels_gives_score_and_index(client):
    a = np.arange(16, dtype=np.float32).reshape(1, 16)
    inputs = [httpclient.InferInput("INPUT0", [1, 16], "FP32"), httpclient.InferInput("INPUT1", [1, 16], "FP32")]
    inputs[0].set_data_from_numpy(a)
    inputs[1].set_data_from_numpy(np.ones((1, 16), np.float32))
    result = client.infer("add_sub", inputs, outputs=[httpclient.InferRequestedOutput("OUTPUT1", class_count=2)])
    assert result.as_numpy("OUTPUT1").tolist() == [[b"14.000000:15", b"13.000000:14"]]


def _identity_values(datatype: str, rng: np.random.Generator) -> np.ndarray:
    if datatype == "BYTES":
        return np.array([["héllo".encode(), b"", b"nul\x00inside"]], dtype=object)
    if datatype == "BOOL":
        return np.array([[True, False, True]])
    dtype = np.dtype(httpclient.triton_to_np_dtype(datatype))
    if dtype.kind == "f":
        return np.array([[1.5, -0.25, 65504.0 if datatype == "FP16" else 3e38]], dtype=dtype)
    info = np.iinfo(dtype)
    return np.array([[info.min, 0, info.max]], dtype=dtype)


@pytest.mark.parametrize("datatype", IDENTITY_DATATYPES)
@pytest.mark.parametrize("binary", [True, False])
def test_every_datatype_round_trips_like_onnxruntime(client, repository, datatype, binary):
    values = _identity_values(datatype, np.random.default_rng(3))
    tensor = httpclient.InferInput(f"IN_{datatype}", list(values.shape), datatype)
    tensor.set_data_from_numpy(values, binary_data=binary)
    out = httpclient.InferRequestedOutput(f"OUT_{datatype}", binary_data=binary)
    model = f"identity_{datatype.lower()}"
    result = client.infer(model, [tensor], outputs=[out])
    got = result.as_numpy(f"OUT_{datatype}")
    feed_value = values
    if datatype == "BYTES":  # onnxruntime takes str for string tensors
        feed_value = np.array([[v.decode() for v in values[0]]], dtype=object)
    expected = onnx_direct(repository / model / "1/model.onnx", {f"IN_{datatype}": feed_value})[f"OUT_{datatype}"]
    if datatype == "BYTES":
        assert [g if isinstance(g, bytes) else g.encode() for g in got.reshape(-1)] == \
            [e.encode() for e in expected.reshape(-1)]
    else:
        assert got.dtype == expected.dtype
        np.testing.assert_array_equal(got, expected)


def test_bytes_through_the_python_backend(client):
    text = np.array([["ferry ß".encode()], ["ok".encode()]], dtype=object)
    tensor = httpclient.InferInput("TEXT", [2, 1], "BYTES")
    tensor.set_data_from_numpy(text)
    result = client.infer("text_stats", [tensor])
    assert result.as_numpy("UPPER").reshape(-1).tolist() == ["FERRY SS".encode(), b"OK"]
    assert result.as_numpy("LENGTH").reshape(-1).tolist() == [7, 2]


def test_bf16_binary_input(client):
    values = np.array([[1.0, -2.5, 0.125]], dtype=ml_dtypes.bfloat16)
    tensor = httpclient.InferInput("IN", [1, 3], "BF16")
    tensor.set_data_from_numpy(values)
    result = client.infer("bf16_double", [tensor])
    np.testing.assert_array_equal(result.as_numpy("OUT"), np.array([[2.0, -5.0, 0.25]], dtype=np.float32))


def test_errors_reach_the_client_as_exceptions_with_the_message(client):
    tensor = httpclient.InferInput("INPUT0", [1, 16], "INT32")
    tensor.set_data_from_numpy(np.zeros((1, 16), dtype=np.int32))
    other = httpclient.InferInput("INPUT1", [1, 16], "FP32")
    other.set_data_from_numpy(np.zeros((1, 16), dtype=np.float32))
    with pytest.raises(InferenceServerException, match="INPUT0.*datatype INT32, expected FP32"):
        client.infer("add_sub", [tensor, other])


def test_an_unknown_model_is_refused_as_triton_refuses_it(client):
    # Triton's own examples check the message's start this way.
    with pytest.raises(InferenceServerException) as raised:
        client.get_model_metadata("wrong_model_name")
    assert raised.value.message().startswith("Request for unknown model: 'wrong_model_name'")
    assert raised.value.status() == "404"


def test_bytes_that_are_not_utf8_are_refused_for_an_onnx_string_input(client):
    tensor = httpclient.InferInput("IN_BYTES", [1, 1], "BYTES")
    tensor.set_data_from_numpy(np.array([[b"\xff\xfe"]], dtype=object))
    with pytest.raises(InferenceServerException, match="IN_BYTES.*UTF-8"):
        client.infer("identity_bytes", [tensor])


def test_an_onnx_model_without_config_is_completed_from_the_model_and_served(client, repository):
    config = client.get_model_config("bare_add_sub")
    assert config["max_batch_size"] == 4 and config["platform"] == "onnxruntime_onnx"
    assert [(i["name"], i["data_type"], i["dims"]) for i in config["input"]] == [
        ("INPUT0", "TYPE_FP32", [16]), ("INPUT1", "TYPE_FP32", [16])]
    a = np.full((2, 16), 3.0, dtype=np.float32)
    inputs = [httpclient.InferInput(n, [2, 16], "FP32") for n in ("INPUT0", "INPUT1")]
    for tensor in inputs:
        tensor.set_data_from_numpy(a)
    result = client.infer("bare_add_sub", inputs)
    expected = onnx_direct(repository / "bare_add_sub/1/model.onnx", {"INPUT0": a, "INPUT1": a})
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), expected["OUTPUT0"])
