"""Business logic scripting over a Redis fleet: a Triton Python model on one worker
loops over a model that only another worker serves; its requests travel the broker."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import tritonclient.http as httpclient

from tests.fleet.processes import Fleet, wait_for
from tests.redis_server import flushdb
from tests.triton_python.models import ADD_SUB, ADD_SUB_CONFIG, BLS, BLS_CONFIG, write

WORKER = ("--heartbeat-s", "0.2")


def test_a_bls_model_calls_a_model_served_by_another_worker(redis_url: str, tmp_path: Path) -> None:
    flushdb(redis_url)
    repo = tmp_path / "repo"
    write(repo, "doubler", ADD_SUB, ADD_SUB_CONFIG.format(name="doubler", process="yes"))
    write(repo, "looper", BLS.replace("{callee}", "doubler"), BLS_CONFIG.format(name="looper", process="yes"))
    with Fleet(redis_url, repo, tmp_path) as fleet:
        gateway = fleet.gateway()
        caller = fleet.worker("w-looper", *WORKER, "--models", "looper")
        callee = fleet.worker("w-doubler", *WORKER, "--models", "doubler")
        fleet.wait_model_ready(gateway, "looper")
        fleet.wait_model_ready(gateway, "doubler")
        with httpclient.InferenceServerClient(gateway.url.removeprefix("http://"), network_timeout=60.0) as client:
            for start, limit, expected, calls in ((1.0, 50.0, 64.0, 6), (3.0, 2.0, 3.0, 0), (0.75, 5.0, 6.0, 3)):
                x, bound = httpclient.InferInput("X", [1], "FP32"), httpclient.InferInput("LIMIT", [1], "FP32")
                x.set_data_from_numpy(np.array([start], dtype=np.float32))
                bound.set_data_from_numpy(np.array([limit], dtype=np.float32))
                result = client.infer("looper", [x, bound])
                assert (float(result.as_numpy("Y")[0]), int(result.as_numpy("CALLS")[0])) == (expected, calls)

            def doubled() -> int:
                (row,) = client.get_inference_statistics("doubler")["model_stats"]
                return row["inference_count"]

            wait_for(lambda: doubled() == 9, 10, "the doubler's nine calls in its worker's heartbeat", gateway)
        loaded = {e.get("model") for e in caller.log_events() if e.get("event") == "model.loaded"}
        assert loaded == {"looper"}, caller.describe()  # the calls cannot have been answered there
        assert {e.get("model") for e in callee.log_events() if e.get("event") == "model.loaded"} == {"doubler"}
