"""The rollout of ``test_rollout`` over a Redis fleet: a gateway and two worker
processes. The load reaches both workers through the control channel, each
swaps to version 2 and drains version 1, and no request is dropped."""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np
import tritonclient.http as httpclient

from tests.fleet.processes import Fleet, wait_for
from tests.model_control.models import write_add_version
from tests.model_control.test_rollout import TOTAL, _roll_out
from tests.redis_server import flushdb

CONTROL = ("--model-control-mode", "explicit", "--load-model", "adder")


def test_version_two_rolls_out_across_two_workers(redis_url: str, tmp_path: Path) -> None:
    flushdb(redis_url)
    repo = tmp_path / "repo"
    write_add_version(repo, "adder", 1, 1.0)
    with Fleet(redis_url, repo, tmp_path) as fleet:
        gateway = fleet.gateway(*CONTROL)
        workers = [fleet.worker(name, *CONTROL, "--heartbeat-s", "0.2") for name in ("w1", "w2")]
        fleet.wait_model_ready(gateway, "adder")
        write_add_version(repo, "adder", 2, 2.0)
        answers, _ = asyncio.run(_roll_out(gateway.url))
        with httpclient.InferenceServerClient(gateway.url) as client:
            wait_for(lambda: [(r["version"], r["state"]) for r in client.get_model_repository_index()] == [("2", "READY")],
                     10, "version 1 to leave the index", gateway)
            for worker in workers:
                loaded = [e for e in worker.log_events() if e.get("event") == "model.loaded" and e.get("version") == 2]
                unloaded = [e for e in worker.log_events() if e.get("event") == "model.unloaded" and e.get("version") == 1]
                assert loaded and unloaded, worker.describe()
    assert len(answers) >= TOTAL
    versions = {version for _, version, _ in answers}
    assert versions == {"1", "2"}, versions
    for value, version, output in answers:
        np.testing.assert_array_equal(output, np.full((1, 4), value + int(version), dtype=np.float32))
