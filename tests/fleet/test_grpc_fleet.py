"""Triton's gRPC door of a gateway on a Redis fleet of two workers: tritonclient.grpc
and its asyncio client, a sequence and a decoupled model over one stream, statistics."""

from __future__ import annotations

import asyncio
import queue
from pathlib import Path

import numpy as np
import tritonclient.grpc as grpcclient
import tritonclient.grpc.aio as grpcaio

from tests.fleet.processes import Fleet, wait_for
from tests.models import write_add_sub, write_countdown_model
from tests.redis_server import flushdb
from tests.servers import free_port
from tests.workers.sequences.accumulator import write_accumulator

WORKER = ("--heartbeat-s", "0.2")


def add_sub_inputs(n: int) -> list[grpcclient.InferInput]:
    inputs = [grpcclient.InferInput(name, [1, 16], "FP32") for name in ("INPUT0", "INPUT1")]
    for tensor in inputs:
        tensor.set_data_from_numpy(np.full((1, 16), n, np.float32))
    return inputs


def test_grpc_through_a_redis_fleet(redis_url: str, tmp_path: Path):
    flushdb(redis_url)
    repo = tmp_path / "repo"
    write_add_sub(repo)
    write_countdown_model(repo)
    write_accumulator(repo)
    port = free_port()
    with Fleet(redis_url, repo, tmp_path) as fleet:
        gateway = fleet.gateway("--grpc-port", str(port))
        fleet.worker("w1", *WORKER)
        fleet.worker("w2", *WORKER)
        for model in ("add_sub", "countdown", "accumulator"):
            fleet.wait_model_ready(gateway, model)
        url = f"127.0.0.1:{port}"
        client = grpcclient.InferenceServerClient(url)
        assert client.is_server_ready() and client.get_model_metadata("add_sub").versions == ["1"]

        async def many() -> list[float]:
            aio = grpcaio.InferenceServerClient(url)
            try:
                results = await asyncio.gather(*(aio.infer("add_sub", add_sub_inputs(n)) for n in range(40)))
                return [float(r.as_numpy("OUTPUT0")[0, 0]) for r in results]
            finally:
                await aio.close()
        assert asyncio.run(many()) == [2.0 * n for n in range(40)]

        got: queue.Queue = queue.Queue()
        client.start_stream(callback=lambda result, error: got.put((result, error)))
        for step, x in enumerate((5, 6, 7)):
            tensor = grpcclient.InferInput("X", [1, 1], "INT32")
            tensor.set_data_from_numpy(np.array([[x]], np.int32))
            client.async_stream_infer("accumulator", [tensor], sequence_id=77, sequence_start=step == 0,
                                      sequence_end=step == 2, outputs=[grpcclient.InferRequestedOutput("SUM")])
        sums = []
        for _ in range(3):
            result, error = got.get(timeout=30)
            assert error is None, error
            sums.append(int(result.as_numpy("SUM").reshape(-1)[0]))
        assert sums == [5, 11, 18]
        n = grpcclient.InferInput("N", [1], "INT32")
        n.set_data_from_numpy(np.array([3], np.int32))
        client.async_stream_infer("countdown", [n], enable_empty_final_response=True)
        counted = [got.get(timeout=30) for _ in range(4)]
        client.stop_stream()
        assert [int(r.as_numpy("OUT")[0]) for r, _ in counted[:3]] == [3, 2, 1]
        assert counted[3][0].get_response().parameters["triton_final_response"].bool_param

        def served() -> int:
            (stats,) = client.get_inference_statistics("add_sub").model_stats
            return stats.inference_stats.success.count
        wait_for(lambda: served() == 40, 10, "both workers' statistics to reach the gateway", gateway)
        client.close()
