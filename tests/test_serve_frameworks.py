"""PyTorch and OpenVINO models served by a real ``ferry serve``, driven by
tritonclient; every answer is checked against the framework run directly."""

from __future__ import annotations

from pathlib import Path

import ml_dtypes
import numpy as np
import onnxruntime as ort
import pytest
import torch
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.servers import ferry_serve
from tests.torch_models import (Affine, BatchRows, Classifier, SmallCnn, Types, framework_config,
                                write_exported, write_onnx_for_openvino, write_onnx_from_torch,
                                write_openvino_ir, write_torchscript)

PYTORCH = 'backend: "pytorch"'
CPU = "instance_group [ { count: 1 kind: KIND_CPU } ]\n"
BATCHING = "dynamic_batching { max_queue_delay_microseconds: 200000 }\n"
CNN_IO = dict(inputs=[("IMAGE", "TYPE_FP32", [3, 16, 16])], outputs=[("LOGITS", "TYPE_FP32", [10])])


def build_repository(repo: Path) -> None:
    write_torchscript(repo, "torch_affine", Affine(), framework_config(
        "torch_affine", 'platform: "pytorch_libtorch"', 8,
        [("INPUT__0", "TYPE_FP32", [4]), ("INPUT__1", "TYPE_FP32", [1])],
        [("OUTPUT__0", "TYPE_FP32", [3]), ("OUTPUT__1", "TYPE_FP32", [1])], CPU))
    write_torchscript(repo, "torch_rows", BatchRows(), framework_config(
        "torch_rows", PYTORCH, 16, [("x", "TYPE_FP32", [2])],
        [("doubled", "TYPE_FP32", [2]), ("rows", "TYPE_INT32", [1])], BATCHING + CPU))
    # No backend line: the model.pt2 file tells it.
    write_exported(repo, "torch_classifier", Classifier(), (torch.randn(2, 4),), framework_config(
        "torch_classifier", "", 8, [("features", "TYPE_FP32", [4])],
        [("probs", "TYPE_FP32", [5]), ("label", "TYPE_INT64", [1])], BATCHING + CPU))
    write_torchscript(repo, "torch_types", Types(), framework_config(
        "torch_types", PYTORCH, 4,
        [("half", "TYPE_FP16", [3]), ("brain", "TYPE_BF16", [3]), ("count", "TYPE_INT64", [3]),
         ("mask", "TYPE_BOOL", [3])],
        [("OUT__0", "TYPE_FP16", [3]), ("OUT__1", "TYPE_BF16", [3]), ("OUT__2", "TYPE_INT64", [3]),
         ("OUT__3", "TYPE_BOOL", [3])], CPU))
    onnx_path = write_onnx_from_torch(repo.parent / "cnn.onnx", SmallCnn(), (torch.randn(2, 3, 16, 16),),
                                      ["IMAGE"], ["LOGITS"])
    write_openvino_ir(repo, "ov_cnn", onnx_path, framework_config(
        "ov_cnn", 'backend: "openvino"', 8, **CNN_IO, extra=BATCHING + CPU))
    write_onnx_for_openvino(repo, "ov_cnn_onnx", onnx_path, framework_config(
        "ov_cnn_onnx", 'backend: "openvino"', 8, **CNN_IO,
        extra='default_model_filename: "model.onnx"\n' + CPU))


@pytest.fixture(scope="module")
def repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    repo = tmp_path_factory.mktemp("frameworks") / "repo"
    repo.mkdir()
    build_repository(repo)
    return repo


@pytest.fixture(scope="module")
def url(repository: Path, tmp_path_factory: pytest.TempPathFactory):
    log = tmp_path_factory.mktemp("logs") / "ferry.log"
    with ferry_serve(repository, log_path=log) as address:
        yield address


@pytest.fixture
def client(url: str):
    triton = httpclient.InferenceServerClient(url, concurrency=8)
    yield triton
    triton.close()


def tensor(name: str, values: np.ndarray, datatype: str) -> httpclient.InferInput:
    item = httpclient.InferInput(name, list(values.shape), datatype)
    item.set_data_from_numpy(values)
    return item


def images(rows: int) -> np.ndarray:
    return np.random.default_rng(rows).standard_normal((rows, 3, 16, 16), dtype=np.float32)


def test_torchscript_positional_names_match_the_module(client):
    rng = np.random.default_rng(0)
    x, scale = rng.standard_normal((3, 4), dtype=np.float32), rng.random((3, 1), dtype=np.float32)
    result = client.infer("torch_affine", [tensor("INPUT__0", x, "FP32"), tensor("INPUT__1", scale, "FP32")])
    with torch.inference_mode():
        scaled, total = Affine().eval()(torch.tensor(x), torch.tensor(scale))
    np.testing.assert_allclose(result.as_numpy("OUTPUT__0"), scaled.numpy(), rtol=1e-6)
    np.testing.assert_allclose(result.as_numpy("OUTPUT__1"), total.numpy(), rtol=1e-6)


def test_concurrent_requests_are_batched_and_each_gets_its_rows(client):
    inputs = [np.full((1, 2), i, np.float32) for i in range(12)]
    pending = [client.async_infer("torch_rows", [tensor("x", x, "FP32")]) for x in inputs]
    results = [p.get_result() for p in pending]
    for x, result in zip(inputs, results):
        np.testing.assert_array_equal(result.as_numpy("doubled"), x * 2)
    assert max(int(r.as_numpy("rows")[0, 0]) for r in results) > 1, "no two requests shared a batch"


def test_exported_program_with_a_dict_result_matches_the_module(client):
    features = np.random.default_rng(1).standard_normal((5, 4), dtype=np.float32)
    result = client.infer("torch_classifier", [tensor("features", features, "FP32")])
    with torch.inference_mode():
        expected = Classifier().eval()(torch.tensor(features))
    np.testing.assert_allclose(result.as_numpy("probs"), expected["probs"].numpy(), rtol=1e-6)
    np.testing.assert_array_equal(result.as_numpy("label"), expected["label"].numpy())
    assert client.get_model_config("torch_classifier")["default_model_filename"] == "model.pt2"


def test_fp16_bf16_int64_and_bool_cross_the_wire(client):
    half = np.array([[0.5, -1.25, 3.0]], np.float16)
    brain = np.array([[1.5, -2.0, 256.0]], ml_dtypes.bfloat16)
    count = np.array([[2**40, -1, 0]], np.int64)
    mask = np.array([[True, False, True]])
    result = client.infer("torch_types", [tensor("half", half, "FP16"), tensor("brain", brain, "BF16"),
                                          tensor("count", count, "INT64"), tensor("mask", mask, "BOOL")])
    np.testing.assert_array_equal(result.as_numpy("OUT__0"), half * 2)
    expected_brain = Types()(torch.tensor(half), torch.tensor(brain.astype(np.float32)).bfloat16(),
                             torch.tensor(count), torch.tensor(mask))[1].float().numpy()
    np.testing.assert_array_equal(np.asarray(result.as_numpy("OUT__1"), np.float32), expected_brain)
    np.testing.assert_array_equal(result.as_numpy("OUT__2"), count + 1)
    np.testing.assert_array_equal(result.as_numpy("OUT__3"), ~mask)


@pytest.mark.parametrize("model", ["ov_cnn", "ov_cnn_onnx"])
def test_openvino_matches_onnxruntime(client, repository, model):
    session = ort.InferenceSession(str(repository.parent / "cnn.onnx"), providers=["CPUExecutionProvider"])
    # Four requests in flight at once, through the client's own async_infer: a tritonclient.http
    # client runs on gevent and must not be shared between threads.
    pending = [client.async_infer(model, [tensor("IMAGE", images(rows), "FP32")]) for rows in (1, 2, 3, 4)]
    results = [request.get_result() for request in pending]
    for rows, result in zip((1, 2, 3, 4), results):
        expected = session.run(["LOGITS"], {"IMAGE": images(rows)})[0]
        np.testing.assert_allclose(result.as_numpy("LOGITS"), expected, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize(("model", "inputs", "message"), [
    ("torch_affine", [("INPUT__0", np.zeros((1, 5), np.float32), "FP32"),
                      ("INPUT__1", np.zeros((1, 1), np.float32), "FP32")], "INPUT__0.*shape \\[1, 5\\]"),
    ("torch_affine", [("INPUT__0", np.zeros((1, 4), np.float64), "FP64"),
                      ("INPUT__1", np.zeros((1, 1), np.float32), "FP32")], "INPUT__0.*datatype FP64, expected FP32"),
    ("torch_affine", [("INPUT__0", np.zeros((1, 4), np.float32), "FP32")], "expects input 'INPUT__1'"),
    ("ov_cnn", [("IMAGE", np.zeros((1, 3, 8, 8), np.float32), "FP32")], "IMAGE.*shape \\[1, 3, 8, 8\\]"),
    ("ov_cnn", [("PIXELS", np.zeros((1, 3, 16, 16), np.float32), "FP32")], "has no input 'PIXELS'"),
])
def test_bad_input_gets_a_400_and_the_server_keeps_serving(client, model, inputs, message):
    with pytest.raises(InferenceServerException, match=message) as caught:
        client.infer(model, [tensor(*spec) for spec in inputs])
    assert caught.value.status() == "400"
    result = client.infer("ov_cnn", [tensor("IMAGE", images(1), "FP32")])
    assert result.as_numpy("LOGITS").shape == (1, 10)
    assert client.is_model_ready(model)


@pytest.mark.skipif(not torch.cuda.is_available(),
                    reason="torch.cuda.is_available() is False: no CUDA device to place a KIND_GPU model on")
def test_a_kind_gpu_model_is_served_from_cuda(tmp_path: Path):
    write_torchscript(tmp_path, "gpu_affine", Affine(), framework_config(
        "gpu_affine", PYTORCH, 8, [("x", "TYPE_FP32", [4]), ("scale", "TYPE_FP32", [1])],
        [("scaled", "TYPE_FP32", [3]), ("total", "TYPE_FP32", [1])],
        "instance_group [ { count: 1 kind: KIND_GPU gpus: [ 0 ] } ]\n"))
    rng = np.random.default_rng(2)
    x, scale = rng.standard_normal((4, 4), dtype=np.float32), rng.random((4, 1), dtype=np.float32)
    with ferry_serve(tmp_path) as address:
        triton = httpclient.InferenceServerClient(address)
        result = triton.infer("gpu_affine", [tensor("x", x, "FP32"), tensor("scale", scale, "FP32")])
        triton.close()
    with torch.inference_mode():
        scaled, _ = Affine().eval()(torch.tensor(x), torch.tensor(scale))
    np.testing.assert_allclose(result.as_numpy("scaled"), scaled.numpy(), rtol=1e-4, atol=1e-6)
