"""The Redis response cache shared by a fleet: an answer one worker computed is
a hit on another, so the model runs once for the whole fleet."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import tritonclient.http as httpclient

from tests.fleet.processes import Fleet, wait_for
from tests.models import recorded_values, write_recording_model
from tests.redis_server import flushdb

WORKER = ("--heartbeat-s", "0.2")


def ask(client: httpclient.InferenceServerClient, value: int) -> int:
    tensor = httpclient.InferInput("INPUT0", [1], "INT32")
    tensor.set_data_from_numpy(np.array([value], dtype=np.int32))
    return int(client.infer("recorder", [tensor]).as_numpy("OUTPUT0")[0])


def test_an_answer_computed_on_one_worker_is_a_hit_on_another(redis_url: str, tmp_path: Path) -> None:
    flushdb(redis_url)
    repo, record = tmp_path / "repo", tmp_path / "computed.txt"
    write_recording_model(repo, "recorder", record)
    config = repo / "recorder/config.pbtxt"
    config.write_text(config.read_text() + "\nresponse_cache { enable: true }\n")
    cache = ("--cache-config", f"redis,url={redis_url}")
    with Fleet(redis_url, repo, tmp_path) as fleet:
        gateway = fleet.gateway()
        first = fleet.worker("w1", *WORKER, *cache)
        fleet.wait_model_ready(gateway, "recorder")
        with httpclient.InferenceServerClient(gateway.url.removeprefix("http://"), network_timeout=60.0) as client:
            assert ask(client, 21) == 42  # computed on w1, kept in Redis
            second = fleet.worker("w2", *WORKER, *cache)
            first.stop()  # from now on only w2 can answer
            wait_for(lambda: not first.running(), 30, "w1 to stop", gateway)
            for _ in range(3):
                assert ask(client, 21) == 42
            assert ask(client, 5) == 10  # a new request: computed on w2
            assert recorded_values(record) == [21, 5], second.describe()

            def counted() -> tuple[int, int]:
                (row,) = client.get_inference_statistics("recorder")["model_stats"]
                return row["inference_stats"]["cache_hit"]["count"], row["inference_stats"]["cache_miss"]["count"]

            # w2's own numbers (w1 has stopped): three hits, one miss.
            wait_for(lambda: counted() == (3, 1), 10, "w2's heartbeat to carry its hits and miss", gateway)
