"""Triton's system shared memory extension on a real ``ferry serve``, driven by the
official tritonclient (``tritonclient.http`` and ``tritonclient.utils.shared_memory``)
unchanged, as Triton's simple_http_shm_client.py and simple_http_shm_string_client.py
drive Triton; ``add_sub`` stands in for Triton's ``simple`` (FP32 where it has INT32)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import gevent
import numpy as np
import pytest
import tritonclient.http as httpclient
import tritonclient.utils.shared_memory as shm
from tritonclient import utils
from tritonclient.utils import InferenceServerException

from tests.models import write_identity_model
from tests.servers import ferry_serve
from tests.shm_segments import ClientRegions, contents, write_gated_model

ROOT = Path(__file__).resolve().parent.parent
MODEL_REPO = ROOT / "model_repo"
A, B = np.arange(16, dtype=np.float32).reshape(1, 16), np.ones((1, 16), dtype=np.float32)
SIZE = A.nbytes


@pytest.fixture(scope="module")
def gate(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("gate")


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, gate: Path) -> Iterator[str]:
    repo = tmp_path_factory.mktemp("repo")
    shutil.copytree(MODEL_REPO / "add_sub", repo / "add_sub")
    write_identity_model(repo, "identity_bytes", ["BYTES"])
    write_gated_model(repo, gate)
    log = tmp_path_factory.mktemp("logs") / "ferry.log"
    with ferry_serve(repo, "--allow-client-shm=true", log_path=log) as url:
        yield url


@pytest.fixture
def client(server: str) -> Iterator[httpclient.InferenceServerClient]:
    triton = httpclient.InferenceServerClient(server)
    triton.unregister_system_shared_memory()
    triton.unregister_cuda_shared_memory()
    yield triton
    triton.unregister_system_shared_memory()
    triton.close()


@pytest.fixture
def regions() -> Iterator[ClientRegions]:
    with ClientRegions() as made:
        yield made



def add_sub_inputs(region: str) -> list[httpclient.InferInput]:
    inputs = [httpclient.InferInput("INPUT0", [1, 16], "FP32"), httpclient.InferInput("INPUT1", [1, 16], "FP32")]
    inputs[0].set_shared_memory(region, SIZE)
    inputs[1].set_shared_memory(region, SIZE, offset=SIZE)
    return inputs


def shm_outputs(region: str, size: int = SIZE) -> list[httpclient.InferRequestedOutput]:
    outputs = [httpclient.InferRequestedOutput("OUTPUT0", binary_data=True),
               httpclient.InferRequestedOutput("OUTPUT1", binary_data=True)]
    outputs[0].set_shared_memory(region, size)
    outputs[1].set_shared_memory(region, size, offset=size)
    return outputs


def refused(call, *args, **kwargs) -> InferenceServerException:
    with pytest.raises(InferenceServerException) as caught:
        call(*args, **kwargs)
    return caught.value


def test_simple_http_shm_client(client, regions):
    output_handle, output_key = regions.new("output_data", SIZE * 2)
    client.register_system_shared_memory("output_data", output_key, SIZE * 2)
    input_handle, input_key = regions.new("input_data", SIZE * 2)
    shm.set_shared_memory_region(input_handle, [A])
    shm.set_shared_memory_region(input_handle, [B], offset=SIZE)
    client.register_system_shared_memory("input_data", input_key, SIZE * 2)

    results = client.infer("add_sub", add_sub_inputs("input_data"), outputs=shm_outputs("output_data"))

    output0, output1 = results.get_output("OUTPUT0"), results.get_output("OUTPUT1")
    assert (output0["datatype"], output0["shape"]) == ("FP32", [1, 16]) and "data" not in output0
    sums = shm.get_contents_as_numpy(output_handle, utils.triton_to_np_dtype(output0["datatype"]), output0["shape"])
    diffs = shm.get_contents_as_numpy(output_handle, np.float32, output1["shape"], offset=SIZE)
    np.testing.assert_array_equal(sums, A + B)
    np.testing.assert_array_equal(diffs, A - B)
    status = client.get_system_shared_memory_status()
    assert sorted(status, key=lambda row: row["name"]) == [
        {"name": "input_data", "key": input_key, "offset": 0, "byte_size": SIZE * 2},
        {"name": "output_data", "key": output_key, "offset": 0, "byte_size": SIZE * 2}]
    client.unregister_system_shared_memory()
    assert client.get_system_shared_memory_status() == []


def test_simple_http_shm_string_client(client, regions):
    strings = np.array([[str(i).encode() for i in range(16)]], dtype=object)
    serialized = utils.serialize_byte_tensor(strings)
    size = utils.serialized_byte_size(serialized)
    input_handle, input_key = regions.new("input0_data", size)
    output_handle, output_key = regions.new("output0_data", size)
    shm.set_shared_memory_region(input_handle, [serialized])
    client.register_system_shared_memory("input0_data", input_key, size)
    client.register_system_shared_memory("output0_data", output_key, size)
    infer_input = httpclient.InferInput("IN_BYTES", [1, 16], "BYTES")
    infer_input.set_shared_memory("input0_data", size)
    requested = httpclient.InferRequestedOutput("OUT_BYTES", binary_data=True)
    requested.set_shared_memory("output0_data", size)

    output = client.infer("identity_bytes", [infer_input], outputs=[requested]).get_output("OUT_BYTES")

    echoed = shm.get_contents_as_numpy(output_handle, utils.triton_to_np_dtype(output["datatype"]), output["shape"])
    assert echoed.tolist() == strings.tolist()


def test_inputs_in_shared_memory_outputs_in_the_body_and_back(client, regions):
    handle, key = regions.new("io", SIZE * 2)
    shm.set_shared_memory_region(handle, [A, B])
    client.register_system_shared_memory("io", key, SIZE * 2)
    np.testing.assert_array_equal(client.infer("add_sub", add_sub_inputs("io")).as_numpy("OUTPUT0"), A + B)
    plain = [httpclient.InferInput("INPUT0", [1, 16], "FP32"), httpclient.InferInput("INPUT1", [1, 16], "FP32")]
    plain[0].set_data_from_numpy(B)
    plain[1].set_data_from_numpy(B)
    client.infer("add_sub", plain, outputs=shm_outputs("io"))
    np.testing.assert_array_equal(shm.get_contents_as_numpy(handle, np.float32, [1, 16]), B + B)


def test_status_and_unregister_of_one_region(client, regions):
    _, key = regions.new("one", 64)
    client.register_system_shared_memory("one", key, 32, offset=16)
    client.register_system_shared_memory("two", key, 16)
    assert client.get_system_shared_memory_status("one") == [
        {"name": "one", "key": key, "offset": 16, "byte_size": 32}]
    client.unregister_system_shared_memory("one")
    assert [row["name"] for row in client.get_system_shared_memory_status()] == ["two"]
    error = refused(client.get_system_shared_memory_status, "one")
    assert (error.status(), error.message()) == ("404", "Unable to find system shared memory region: 'one'")
    assert "system_shared_memory" in client.get_server_metadata()["extensions"]


def test_registering_a_name_twice_a_missing_key_or_a_range_past_the_segment_is_a_400(client, regions):
    _, key = regions.new("r", 64)
    client.register_system_shared_memory("r", key, 64)
    twice = refused(client.register_system_shared_memory, "r", key, 64)
    assert (twice.status(), twice.message()) == ("400", "shared memory region 'r' already in manager")
    missing = refused(client.register_system_shared_memory, "m", "/ferry_no_such_key", 64)
    assert missing.status() == "400"
    assert missing.message().startswith("Unable to open shared memory region: '/ferry_no_such_key'")
    past = refused(client.register_system_shared_memory, "p", key, 64, offset=8)
    assert past.status() == "400"
    assert past.message().startswith("failed to register shared memory region 'p': invalid args")


def test_an_unknown_region_or_a_slice_past_its_region_is_a_400(client, regions):
    _, key = regions.new("small", SIZE)
    client.register_system_shared_memory("small", key, SIZE)
    unknown = refused(client.infer, "add_sub", add_sub_inputs("nope"))
    assert (unknown.status(), unknown.message()) == (
        "400", "input 'INPUT0': Unable to find shared memory region: 'nope'")
    past = refused(client.infer, "add_sub", add_sub_inputs("small"))
    assert past.status() == "400"
    assert past.message().startswith("input 'INPUT1': Invalid offset for shared memory region: 'small'")


def test_an_output_region_too_small_for_the_tensor_is_a_400(client, regions):
    handle, key = regions.new("io", SIZE * 2)
    shm.set_shared_memory_region(handle, [A, B])
    client.register_system_shared_memory("io", key, SIZE * 2)
    error = refused(client.infer, "add_sub", add_sub_inputs("io"), outputs=shm_outputs("io", SIZE // 2))
    assert (error.status(), error.message()) == ("400", (
        "shared memory size specified with the request for output 'OUTPUT0' (32 bytes) should be at least "
        "64 bytes to hold the results"))
    np.testing.assert_array_equal(shm.get_contents_as_numpy(handle, np.float32, [2, 16]), np.vstack([A, B]))


def test_a_region_unregistered_while_a_request_uses_it_is_a_400_and_left_alone(client, regions, server, gate):
    handle, key = regions.new("gated", 32)
    shm.set_shared_memory_region(handle, [np.ones(4, np.float32), np.full(4, 7, np.float32)])
    client.register_system_shared_memory("gated", key, 32)
    infer_input = httpclient.InferInput("IN", [4], "FP32")
    infer_input.set_shared_memory("gated", 16)
    requested = httpclient.InferRequestedOutput("OUT")
    requested.set_shared_memory("gated", 16, offset=16)
    pending = client.async_infer("gated", [infer_input], outputs=[requested])
    while not (gate / "entered").exists():
        gevent.sleep(0.01)  # lets tritonclient's greenlet send the request
    other = httpclient.InferenceServerClient(server)
    other.unregister_system_shared_memory("gated")
    other.close()
    (gate / "open").touch()
    error = refused(pending.get_result)
    assert (error.status(), error.message()) == ("400", (
        "output 'OUT': shared memory region 'gated' was unregistered while the request was in flight; "
        "nothing was written to it"))
    assert contents(key)[16:] == np.full(4, 7, np.float32).tobytes()


def test_allow_client_shm_refuses_several_http_processes(tmp_path):
    # A region is registered with one process; SO_REUSEPORT would hand a client's next connection to any.
    command = [sys.executable, "-m", "ferry.cli.main", "serve", "--model-repository", str(tmp_path),
               "--allow-client-shm", "--http-workers", "2"]
    result = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert result.returncode == 1 and "--allow-client-shm needs --http-workers 1" in result.stderr
