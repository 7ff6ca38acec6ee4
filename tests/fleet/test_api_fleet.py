"""The in-process API joined to a Redis fleet: with ``worker=False`` its calls are
answered by the fleet's workers, here a ``ferry worker`` process of its own."""

from __future__ import annotations

import asyncio
import shutil
from pathlib import Path

import numpy as np

from ferry.api import AsyncServer
from tests.fleet.processes import Fleet
from tests.redis_server import flushdb

MODEL_REPO = Path(__file__).resolve().parents[2] / "model_repo"


def test_calls_are_answered_by_the_fleets_workers(redis_url: str, tmp_path: Path) -> None:
    flushdb(redis_url)
    repo = tmp_path / "repo"
    shutil.copytree(MODEL_REPO / "add_sub", repo / "add_sub")
    with Fleet(redis_url, repo, tmp_path) as fleet:
        worker = fleet.worker("w1", "--heartbeat-s", "0.2")

        async def run() -> None:
            async with AsyncServer(repo, broker=redis_url, worker=False) as server:
                deadline = asyncio.get_running_loop().time() + 60
                while not server.is_ready("add_sub"):
                    assert asyncio.get_running_loop().time() < deadline, worker.describe()
                    await asyncio.sleep(0.1)
                a = np.arange(32, dtype=np.float32).reshape(2, 16)
                outputs = await server.infer("add_sub", {"INPUT0": a, "INPUT1": a})
                np.testing.assert_array_equal(outputs["OUTPUT0"], a * 2)

        asyncio.run(run())  # this process has no worker: w1 computed it
