"""Triton Python-backend models served unchanged by ``ferry serve``, through
``tritonclient.http`` and ``tritonclient.grpc``, with each instance in a process of
its own (ferry's default) and in the worker's process."""

from __future__ import annotations

import queue
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.servers import ferry_serve, free_port
from tests.triton_python.models import write_all


@pytest.fixture(scope="module", params=["yes", "no"], ids=["instance-process", "in-worker"])
def server(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory):
    repo = tmp_path_factory.mktemp("repo")
    write_all(repo, process=request.param)
    grpc_port = free_port()
    log = tmp_path_factory.mktemp("logs") / "ferry.log"
    with ferry_serve(repo, "--grpc-port", str(grpc_port), log_path=log) as url:
        yield url, f"127.0.0.1:{grpc_port}", log


def add_sub(client: httpclient.InferenceServerClient, a: np.ndarray, b: np.ndarray) -> httpclient.InferResult:
    inputs = [httpclient.InferInput(n, list(a.shape), "FP32") for n in ("INPUT0", "INPUT1")]
    inputs[0].set_data_from_numpy(a)
    inputs[1].set_data_from_numpy(b)
    return client.infer("add_sub", inputs)


def test_add_sub_answers_over_http_and_grpc_batched(server) -> None:
    url, grpc_url, _ = server
    rng = np.random.default_rng(3)
    pairs = [(rng.random((1, 4), dtype=np.float32), rng.random((1, 4), dtype=np.float32)) for _ in range(24)]

    def one(pair):
        with httpclient.InferenceServerClient(url) as client:
            return add_sub(client, *pair)

    with ThreadPoolExecutor(8) as pool:  # concurrent requests: the dynamic batcher stacks them
        results = list(pool.map(one, pairs))
    for (a, b), result in zip(pairs, results):
        np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + b)
        np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), a - b)
    with grpcclient.InferenceServerClient(grpc_url) as client:
        a, b = pairs[0]
        inputs = [grpcclient.InferInput(n, [1, 4], "FP32") for n in ("INPUT0", "INPUT1")]
        inputs[0].set_data_from_numpy(a)
        inputs[1].set_data_from_numpy(b)
        np.testing.assert_array_equal(client.infer("add_sub", inputs).as_numpy("OUTPUT0"), a + b)
        with httpclient.InferenceServerClient(url) as http:
            (row,) = http.get_inference_statistics("add_sub")["model_stats"]
        assert row["inference_count"] == 25 and row["execution_count"] < 25  # batched


def test_a_triton_error_with_invalid_arg_is_a_400(server) -> None:
    url, _, _ = server
    with httpclient.InferenceServerClient(url) as client:
        inputs = [httpclient.InferInput("INPUT0", [1, 4], "FP32"), httpclient.InferInput("INPUT1", [1, 4], "FP32")]
        inputs[0].set_data_from_numpy(np.ones((1, 4), np.float32))
        inputs[1].set_data_from_numpy(np.ones((1, 4), np.float32))
        # The config's shapes are checked first; a wrong one is the same 400 as for any model.
        bad = [httpclient.InferInput("INPUT0", [1, 3], "FP32"), inputs[1]]
        bad[0].set_data_from_numpy(np.ones((1, 3), np.float32))
        with pytest.raises(InferenceServerException) as refused:
            client.infer("add_sub", bad)
        assert refused.value.status() == "400"


def test_a_decoupled_model_streams_every_response_over_grpc(server) -> None:
    _, grpc_url, _ = server
    got: queue.Queue = queue.Queue()
    with grpcclient.InferenceServerClient(grpc_url) as client:
        client.start_stream(callback=lambda result, error: got.put((result, error)))
        tensor = grpcclient.InferInput("IN", [3], "INT32")
        tensor.set_data_from_numpy(np.array([7, 8, 9], dtype=np.int32))
        client.async_stream_infer("repeat", [tensor], request_id="r1", enable_empty_final_response=True)
        answers = []
        while True:
            result, error = got.get(timeout=30)
            assert error is None, error
            final = result.get_response().parameters["triton_final_response"].bool_param
            if not final:
                answers.append((int(result.as_numpy("OUT")[0]), int(result.as_numpy("IDX")[0])))
            else:
                break
        client.stop_stream()
    assert answers == [(7, 0), (8, 1), (9, 2)]


def test_auto_complete_config_fills_in_the_config(server) -> None:
    url, _, _ = server
    with httpclient.InferenceServerClient(url) as client:
        config = client.get_model_config("auto")
        assert config["max_batch_size"] == 4 and "dynamic_batching" in config
        assert [(i["name"], i["data_type"], i["dims"]) for i in config["input"]] == [("TEXT", "TYPE_STRING", [1])]
        assert [o["name"] for o in config["output"]] == ["LENGTH"]
        text = httpclient.InferInput("TEXT", [2, 1], "BYTES")
        text.set_data_from_numpy(np.array([[b"ferry"], [b"triton!"]], dtype=object))
        lengths = client.infer("auto", [text]).as_numpy("LENGTH")
    np.testing.assert_array_equal(lengths, [[5], [7]])


def test_a_bls_model_loops_over_another_model_until_its_condition_holds(server) -> None:
    url, _, _ = server
    with httpclient.InferenceServerClient(url) as client:
        def loop(start: float, bound: float) -> tuple[float, int]:
            x, limit = httpclient.InferInput("X", [1], "FP32"), httpclient.InferInput("LIMIT", [1], "FP32")
            x.set_data_from_numpy(np.array([start], dtype=np.float32))
            limit.set_data_from_numpy(np.array([bound], dtype=np.float32))
            result = client.infer("bls", [x, limit])
            return float(result.as_numpy("Y")[0]), int(result.as_numpy("CALLS")[0])

        # Answers that call nothing are quick; ferry must still not run the model on its event
        # loop (where quick batches go), or the next one's calls could never be answered.
        for _ in range(12):
            assert loop(5.0, 1.0) == (5.0, 0)
        assert loop(1.5, 100.0) == (192.0, 7)  # 1.5 doubled seven times


def test_an_async_bls_model_gathers_its_requests(server) -> None:
    url, _, _ = server
    with httpclient.InferenceServerClient(url) as client:
        x = httpclient.InferInput("X", [5], "FP32")
        x.set_data_from_numpy(np.array([1, 2, 3, 4, 5], dtype=np.float32))
        result = client.infer("fanout", [x])
    assert float(result.as_numpy("SUM")[0]) == 30.0  # each value doubled by add_sub, then summed
