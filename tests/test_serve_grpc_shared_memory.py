"""Triton's system shared memory extension over gRPC on a real ``ferry serve``, driven by
``tritonclient.grpc`` and ``tritonclient.utils.shared_memory`` unchanged, as Triton's
simple_grpc_shm_client.py and simple_grpc_shm_string_client.py drive Triton. One process
holds one set of regions, so a region registered over HTTP serves a gRPC request too."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import grpc
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
import tritonclient.utils.shared_memory as shm
from tritonclient import utils
from tritonclient.utils import InferenceServerException

from tests.models import write_identity_model
from tests.servers import ferry_serve, free_port
from tests.shm_segments import ClientRegions

MODEL_REPO = Path(__file__).resolve().parent.parent / "model_repo"
A, B = np.arange(16, dtype=np.float32).reshape(1, 16), np.ones((1, 16), dtype=np.float32)
SIZE = A.nbytes


@pytest.fixture(scope="module")
def urls(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str]]:
    repo = tmp_path_factory.mktemp("repo")
    shutil.copytree(MODEL_REPO / "add_sub", repo / "add_sub")
    write_identity_model(repo, "identity_bytes", ["BYTES"])
    port = free_port()
    log = tmp_path_factory.mktemp("logs") / "ferry.log"
    with ferry_serve(repo, "--allow-client-shm=true", "--grpc-port", str(port), log_path=log) as http_url:
        yield http_url, f"127.0.0.1:{port}"


@pytest.fixture
def client(urls: tuple[str, str]) -> Iterator[grpcclient.InferenceServerClient]:
    triton = grpcclient.InferenceServerClient(urls[1])
    triton.unregister_system_shared_memory()
    yield triton
    triton.unregister_system_shared_memory()
    triton.close()


@pytest.fixture
def regions() -> Iterator[ClientRegions]:
    with ClientRegions() as made:
        yield made



def add_sub_inputs(region: str) -> list[grpcclient.InferInput]:
    inputs = [grpcclient.InferInput("INPUT0", [1, 16], "FP32"), grpcclient.InferInput("INPUT1", [1, 16], "FP32")]
    inputs[0].set_shared_memory(region, SIZE)
    inputs[1].set_shared_memory(region, SIZE, offset=SIZE)
    return inputs


def shm_outputs(region: str, size: int = SIZE) -> list[grpcclient.InferRequestedOutput]:
    outputs = [grpcclient.InferRequestedOutput("OUTPUT0"), grpcclient.InferRequestedOutput("OUTPUT1")]
    outputs[0].set_shared_memory(region, size)
    outputs[1].set_shared_memory(region, size, offset=size)
    return outputs


def refused(call, *args, **kwargs) -> InferenceServerException:
    with pytest.raises(InferenceServerException) as caught:
        call(*args, **kwargs)
    return caught.value


def test_simple_grpc_shm_client(client, regions):
    output_handle, output_key = regions.new("output_data", SIZE * 2)
    client.register_system_shared_memory("output_data", output_key, SIZE * 2)
    input_handle, input_key = regions.new("input_data", SIZE * 2)
    shm.set_shared_memory_region(input_handle, [A])
    shm.set_shared_memory_region(input_handle, [B], offset=SIZE)
    client.register_system_shared_memory("input_data", input_key, SIZE * 2)

    results = client.infer("add_sub", add_sub_inputs("input_data"), outputs=shm_outputs("output_data"))

    output0, output1 = results.get_output("OUTPUT0"), results.get_output("OUTPUT1")
    assert (output0.datatype, list(output0.shape)) == ("FP32", [1, 16])
    assert list(results.get_response().raw_output_contents) == [b"", b""]  # as Triton: one empty per output
    assert output0.parameters["shared_memory_region"].string_param == "output_data"
    assert output1.parameters["shared_memory_offset"].int64_param == SIZE
    sums = shm.get_contents_as_numpy(output_handle, utils.triton_to_np_dtype(output0.datatype), output0.shape)
    diffs = shm.get_contents_as_numpy(output_handle, np.float32, output1.shape, offset=SIZE)
    np.testing.assert_array_equal(sums, A + B)
    np.testing.assert_array_equal(diffs, A - B)
    status = client.get_system_shared_memory_status(as_json=True)["regions"]
    assert {name: (row["key"], int(row["byte_size"])) for name, row in status.items()} == {
        "input_data": (input_key, SIZE * 2), "output_data": (output_key, SIZE * 2)}
    client.unregister_system_shared_memory()
    assert client.get_system_shared_memory_status().regions == {}


def test_simple_grpc_shm_string_client(client, regions):
    strings = np.array([[str(i).encode() for i in range(16)]], dtype=object)
    serialized = utils.serialize_byte_tensor(strings)
    size = utils.serialized_byte_size(serialized)
    input_handle, input_key = regions.new("input0_data", size)
    output_handle, output_key = regions.new("output0_data", size)
    shm.set_shared_memory_region(input_handle, [serialized])
    client.register_system_shared_memory("input0_data", input_key, size)
    client.register_system_shared_memory("output0_data", output_key, size)
    infer_input = grpcclient.InferInput("IN_BYTES", [1, 16], "BYTES")
    infer_input.set_shared_memory("input0_data", size)
    requested = grpcclient.InferRequestedOutput("OUT_BYTES")
    requested.set_shared_memory("output0_data", size)

    output = client.infer("identity_bytes", [infer_input], outputs=[requested]).get_output("OUT_BYTES")

    echoed = shm.get_contents_as_numpy(output_handle, utils.triton_to_np_dtype(output.datatype), output.shape)
    assert echoed.tolist() == strings.tolist()


def test_a_region_registered_over_http_serves_a_grpc_request(client, regions, urls):
    handle, key = regions.new("io", SIZE * 2)
    shm.set_shared_memory_region(handle, [A, B])
    http = httpclient.InferenceServerClient(urls[0])
    try:
        http.register_system_shared_memory("io", key, SIZE * 2)
    finally:
        http.close()
    np.testing.assert_array_equal(client.infer("add_sub", add_sub_inputs("io")).as_numpy("OUTPUT1"), A - B)
    assert list(client.get_system_shared_memory_status("io").regions) == ["io"]


def test_errors_carry_tritons_codes(client, regions):
    _, key = regions.new("small", SIZE)
    client.register_system_shared_memory("small", key, SIZE)
    twice = refused(client.register_system_shared_memory, "small", key, SIZE)
    assert twice.status() == str(grpc.StatusCode.ALREADY_EXISTS)
    assert twice.message() == "shared memory region 'small' already in manager"
    missing = refused(client.register_system_shared_memory, "m", "/ferry_no_such_key", 64)
    assert missing.status() == str(grpc.StatusCode.INVALID_ARGUMENT)
    assert missing.message().startswith("Unable to open shared memory region: '/ferry_no_such_key'")
    unknown = refused(client.infer, "add_sub", add_sub_inputs("nope"))
    assert (unknown.status(), unknown.message()) == (
        str(grpc.StatusCode.INVALID_ARGUMENT), "input 'INPUT0': Unable to find shared memory region: 'nope'")
    past = refused(client.infer, "add_sub", add_sub_inputs("small"))
    assert past.status() == str(grpc.StatusCode.INVALID_ARGUMENT)
    assert past.message().startswith("input 'INPUT1': Invalid offset for shared memory region: 'small'")
    absent = refused(client.get_system_shared_memory_status, "absent")
    assert (absent.status(), absent.message()) == (
        str(grpc.StatusCode.NOT_FOUND), "Unable to find system shared memory region: 'absent'")
