"""``ferry serve``'s gRPC door, driven by ``tritonclient.grpc``, ``tritonclient.grpc.aio``
and a plain grpcio stub, unchanged. Results are compared with onnxruntime run directly."""

from __future__ import annotations

import asyncio
import queue
import shutil
from pathlib import Path

import grpc
import numpy as np
import onnxruntime as ort
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.grpc.aio as grpcaio
from tritonclient.grpc import service_pb2 as pb, service_pb2_grpc
from tritonclient.utils import InferenceServerException

from gateway.grpc.tensors import CONTENTS_FIELD
from tests.models import IDENTITY_DATATYPES, write_countdown_model, write_identity_model
from tests.workers.sequences.accumulator import write_accumulator
from tests.servers import ferry_serve, free_port

MODEL_REPO = Path(__file__).resolve().parent.parent / "model_repo"


@pytest.fixture(scope="module")
def repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    repo = tmp_path_factory.mktemp("repo")
    for name in ("add_sub", "cnn"):
        shutil.copytree(MODEL_REPO / name, repo / name)
    for datatype in IDENTITY_DATATYPES:
        write_identity_model(repo, f"identity_{datatype.lower()}", [datatype])
    write_countdown_model(repo)
    write_accumulator(repo)
    return repo


@pytest.fixture(scope="module")
def grpc_url(repository: Path, tmp_path_factory: pytest.TempPathFactory):
    port = free_port()
    log = tmp_path_factory.mktemp("logs") / "ferry.log"
    with ferry_serve(repository, "--grpc-port", str(port), log_path=log):
        yield f"127.0.0.1:{port}"


@pytest.fixture
def client(grpc_url: str):
    triton = grpcclient.InferenceServerClient(grpc_url)
    yield triton
    triton.close()


def add_sub_inputs(a: np.ndarray, b: np.ndarray) -> list[grpcclient.InferInput]:
    inputs = [grpcclient.InferInput(name, list(a.shape), "FP32") for name in ("INPUT0", "INPUT1")]
    inputs[0].set_data_from_numpy(a)
    inputs[1].set_data_from_numpy(b)
    return inputs


def onnx_direct(model_file: Path, feed: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    session = ort.InferenceSession(str(model_file), providers=["CPUExecutionProvider"])
    names = [o.name for o in session.get_outputs()]
    return dict(zip(names, session.run(names, feed)))


def test_health_metadata_and_config(client):
    assert client.is_server_live() and client.is_server_ready() and client.is_model_ready("add_sub")
    metadata = client.get_server_metadata()
    assert metadata.name == "ferry" and "statistics" in metadata.extensions
    model = client.get_model_metadata("add_sub")
    assert model.name == "add_sub" and model.versions == ["1"] and model.platform == "onnxruntime_onnx"
    assert [(t.name, t.datatype, list(t.shape)) for t in model.inputs] == [
        ("INPUT0", "FP32", [-1, 16]), ("INPUT1", "FP32", [-1, 16])]
    config = client.get_model_config("cnn").config
    assert config.max_batch_size == 64 and config.output[0].label_filename == "labels.txt"
    assert list(config.dynamic_batching.preferred_batch_size) == [16, 32, 64]


def test_add_sub_matches_onnxruntime(client, repository):
    rng = np.random.default_rng(1)
    a, b = (rng.standard_normal((3, 16)).astype(np.float32) for _ in range(2))
    result = client.infer("add_sub", add_sub_inputs(a, b), request_id="g-7")
    expected = onnx_direct(repository / "add_sub/1/model.onnx", {"INPUT0": a, "INPUT1": b})
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), expected["OUTPUT0"])
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), expected["OUTPUT1"])
    response = result.get_response()
    assert (response.id, response.model_name, response.model_version) == ("g-7", "add_sub", "1")


@pytest.mark.parametrize("datatype", IDENTITY_DATATYPES)
def test_every_datatype_round_trips_raw(client, datatype):
    if datatype == "BYTES":
        values = np.array([["héllo".encode(), b"", b"nul\x00inside"]], dtype=object)
    elif datatype == "BOOL":
        values = np.array([[True, False, True]])
    else:
        dtype = np.dtype(grpcclient.triton_to_np_dtype(datatype))
        values = (np.array([[1.5, -0.25, 3.0]], dtype=dtype) if dtype.kind == "f" else
                  np.array([[np.iinfo(dtype).min, 0, np.iinfo(dtype).max]], dtype=dtype))
    tensor = grpcclient.InferInput(f"IN_{datatype}", [1, 3], datatype)
    tensor.set_data_from_numpy(values)
    result = client.infer(f"identity_{datatype.lower()}", [tensor])
    np.testing.assert_array_equal(result.as_numpy(f"OUT_{datatype}"), values)


def test_typed_contents_through_a_plain_grpcio_stub(grpc_url):
    with grpc.insecure_channel(grpc_url) as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        request = pb.ModelInferRequest(model_name="identity_int8")
        request.inputs.add(name="IN_INT8", datatype="INT8", shape=[1, 3]).contents.int_contents.extend([-128, 0, 127])
        response = stub.ModelInfer(request)
        assert np.frombuffer(response.raw_output_contents[0], np.int8).tolist() == [-128, 0, 127]

        request = pb.ModelInferRequest(model_name="identity_bytes")
        request.inputs.add(name="IN_BYTES", datatype="BYTES", shape=[1, 2]).contents.bytes_contents.extend([b"a", b"bc"])
        response = stub.ModelInfer(request)
        assert response.outputs[0].datatype == "BYTES" and response.raw_output_contents[0] == b"\x01\0\0\0a\x02\0\0\0bc"

        request = pb.ModelInferRequest(model_name="identity_int8")
        request.inputs.add(name="IN_INT8", datatype="INT8", shape=[1, 3]).contents.int_contents.extend([1, 2, 300])
        with pytest.raises(grpc.RpcError) as raised:
            stub.ModelInfer(request)
        assert raised.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "outside the range of INT8" in raised.value.details()

        request = pb.ModelInferRequest(model_name="identity_fp16")
        request.inputs.add(name="IN_FP16", datatype="FP16", shape=[1, 1]).contents.fp32_contents.append(1.0)
        with pytest.raises(grpc.RpcError) as raised:
            stub.ModelInfer(request)
        assert "FP16 tensors must be sent in raw_input_contents" in raised.value.details()


TYPED = {  # values at each datatype's edges, sent in its typed contents field
    "BOOL": [True, False, True], "UINT8": [0, 7, 255], "UINT16": [0, 7, 65535], "UINT32": [0, 7, 2**32 - 1],
    "UINT64": [0, 7, 2**64 - 1], "INT8": [-128, 0, 127], "INT16": [-32768, 0, 32767],
    "INT32": [-2**31, 0, 2**31 - 1], "INT64": [-2**63, 0, 2**63 - 1], "FP32": [1.5, -0.25, 3e38],
    "FP64": [1.5, -0.25, 1e300], "BYTES": [b"h\xc3\xa9llo", b"", b"nul\x00inside"],
}


@pytest.mark.parametrize("datatype", sorted(TYPED))
def test_every_datatype_round_trips_as_typed_contents(grpc_url, datatype):
    values = TYPED[datatype]
    with grpc.insecure_channel(grpc_url) as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        request = pb.ModelInferRequest(model_name=f"identity_{datatype.lower()}")
        tensor = request.inputs.add(name=f"IN_{datatype}", datatype=datatype, shape=[1, len(values)])
        getattr(tensor.contents, CONTENTS_FIELD[datatype]).extend(values)
        response = stub.ModelInfer(request)
    raw = response.raw_output_contents[0]
    if datatype == "BYTES":
        assert raw == b"".join(len(v).to_bytes(4, "little") + v for v in values)
    else:
        expected = np.array(values, dtype=grpcclient.triton_to_np_dtype(datatype))
        np.testing.assert_array_equal(np.frombuffer(raw, expected.dtype), expected)


def test_errors_carry_tritons_codes_and_words(client):
    with pytest.raises(InferenceServerException) as unknown:
        client.get_model_metadata("wrong_model_name")
    assert unknown.value.status() == "StatusCode.NOT_FOUND"
    assert unknown.value.message().startswith("Request for unknown model: 'wrong_model_name'")
    a = np.zeros((1, 8), np.float32)
    with pytest.raises(InferenceServerException) as bad:
        client.infer("add_sub", add_sub_inputs(a, a))
    assert bad.value.status() == "StatusCode.INVALID_ARGUMENT" and "INPUT0" in bad.value.message()


def test_classification_statistics_and_repository(client, repository):
    images = np.random.default_rng(2).random((2, 3, 128, 128), dtype=np.float32)
    image = grpcclient.InferInput("IMAGE", list(images.shape), "FP32")
    image.set_data_from_numpy(images)
    result = client.infer("cnn", [image], outputs=[grpcclient.InferRequestedOutput("PROBS", class_count=2)])
    expected = onnx_direct(repository / "cnn/1/model.onnx", {"IMAGE": images})["PROBS"]
    classes = result.as_numpy("PROBS")
    assert classes.shape == (2, 2)
    assert [int(entry.split(b":")[1]) for entry in classes[0]] == np.argsort(-expected[0])[:2].tolist()

    (stats,) = client.get_inference_statistics("cnn").model_stats
    assert stats.name == "cnn" and stats.inference_stats.success.count >= 1 and stats.inference_count >= 2
    index = {(m.name, m.state) for m in client.get_model_repository_index().models}
    assert ("add_sub", "READY") in index and ("cnn", "READY") in index
    assert client.get_system_shared_memory_status().regions == {}


def test_log_and_trace_settings(client):
    logs = client.update_log_settings({"log_verbose_level": 1})
    assert logs.settings["log_verbose_level"].uint32_param == 1
    assert client.update_log_settings({"log_verbose_level": 0}).settings["log_info"].bool_param is True
    trace = client.get_trace_settings()
    assert list(trace.settings["trace_level"].value) == ["OFF"]  # no --trace-exporter
    with pytest.raises(InferenceServerException, match="--trace-exporter"):
        client.update_trace_settings(settings={"trace_level": ["TIMESTAMPS"]})


def test_the_asyncio_client_and_many_calls_at_once(grpc_url):
    async def run() -> list[np.ndarray]:
        client = grpcaio.InferenceServerClient(grpc_url)
        try:
            async def one(n: int) -> np.ndarray:
                a = np.full((1, 16), n, np.float32)
                result = await client.infer("add_sub", add_sub_inputs(a, a))
                return result.as_numpy("OUTPUT0")
            return await asyncio.gather(*(one(n) for n in range(32)))
        finally:
            await client.close()

    outputs = asyncio.run(run())
    assert [float(out[0, 0]) for out in outputs] == [2.0 * n for n in range(32)]


def stream_results(client: grpcclient.InferenceServerClient, sends: list[dict], expected: int,
                   timeout_s: float = 30.0) -> list:
    """Send ``sends`` on one stream; the first ``expected`` (result, error) pairs, in arrival order."""
    got: queue.Queue = queue.Queue()
    client.start_stream(callback=lambda result, error: got.put((result, error)))
    try:
        for send in sends:
            client.async_stream_infer(**send)
        return [got.get(timeout=timeout_s) for _ in range(expected)]
    finally:
        client.stop_stream()


def countdown(n: int) -> list[grpcclient.InferInput]:
    tensor = grpcclient.InferInput("N", [1], "INT32")
    tensor.set_data_from_numpy(np.array([n], np.int32))
    return [tensor]


def test_a_decoupled_model_streams_its_responses_and_the_final_flag(client):
    flagged = stream_results(client, [dict(model_name="countdown", inputs=countdown(3), request_id="c3",
                                           enable_empty_final_response=True)], 4)
    assert all(error is None for _, error in flagged), flagged
    outs = [r.as_numpy("OUT") for r, _ in flagged[:3]]
    assert [int(o[0]) for o in outs] == [3, 2, 1]
    finals = [r.get_response().parameters["triton_final_response"].bool_param for r, _ in flagged]
    assert finals == [False, False, False, True]
    assert all(r.get_response().id == "c3" for r, _ in flagged) and not flagged[3][0].get_response().outputs

    plain = stream_results(client, [dict(model_name="countdown", inputs=countdown(2))], 2)
    assert [int(r.as_numpy("OUT")[0]) for r, _ in plain] == [2, 1]


def test_a_sequence_keeps_its_order_and_state_on_one_stream(client):
    def step(x: int, start: bool = False, end: bool = False) -> dict:
        tensor = grpcclient.InferInput("X", [1, 1], "INT32")
        tensor.set_data_from_numpy(np.array([[x]], np.int32))
        return dict(model_name="accumulator", inputs=[tensor], sequence_id=4242, sequence_start=start,
                    sequence_end=end, outputs=[grpcclient.InferRequestedOutput("SUM")])
    results = stream_results(client, [step(1, start=True), step(2), step(3), step(4, end=True)], 4)
    assert [int(r.as_numpy("SUM").reshape(-1)[0]) for r, _ in results] == [1, 3, 6, 10]


def test_a_failed_request_on_a_stream_leaves_it_open_for_the_next(client):
    a = np.ones((1, 16), np.float32)
    results = stream_results(client, [dict(model_name="nope", inputs=add_sub_inputs(a, a)),
                                      dict(model_name="add_sub", inputs=add_sub_inputs(a, a))], 2)
    (_, error), (result, ok) = results
    assert error is not None and "Request for unknown model: 'nope' is not found" in error.message()
    assert ok is None and result.as_numpy("OUTPUT0").tolist() == [[2.0] * 16]


def test_64_concurrent_streams(grpc_url):
    async def run() -> list[float]:
        client = grpcaio.InferenceServerClient(grpc_url)
        try:
            async def one(n: int) -> float:
                async def requests():
                    a = np.full((1, 16), n, np.float32)
                    yield {"model_name": "add_sub", "inputs": add_sub_inputs(a, a)}
                async for result, error in client.stream_infer(requests()):
                    assert error is None, error
                    return float(result.as_numpy("OUTPUT0")[0, 0])
                raise AssertionError("the stream ended without a response")
            return await asyncio.gather(*(one(n) for n in range(64)))
        finally:
            await client.close()

    assert asyncio.run(run()) == [2.0 * n for n in range(64)]
