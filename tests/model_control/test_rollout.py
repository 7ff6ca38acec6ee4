"""A new version rolls out under load without dropping a request.

``adder`` version 1 adds 1, version 2 adds 2, and the config keeps the latest
version only. With version 1 serving, version 2's directory appears and a
load is requested while at least 1,000 requests are sent (up to 200 at once):
every request succeeds, each answer is ``input + version`` for the version it
names, and both versions answer.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np
import tritonclient.http as httpclient
import tritonclient.http.aio as aioclient

from tests.model_control.models import write_add_version
from tests.servers import ferry_serve

TOTAL = 1000
IN_FLIGHT = 200
AFTER_LOAD = 100  # requests sent after the load returned, so version 2 surely answers


async def _infer(client: aioclient.InferenceServerClient, value: int) -> tuple[int, str, np.ndarray]:
    tensor = aioclient.InferInput("INPUT0", [1, 4], "FP32")
    tensor.set_data_from_numpy(np.full((1, 4), value, dtype=np.float32))
    result = await client.infer("adder", [tensor])
    return value, result.get_response()["model_version"], result.as_numpy("OUTPUT0")


async def _roll_out(url: str) -> tuple[list[tuple[int, str, np.ndarray]], list[dict]]:
    client = aioclient.InferenceServerClient(url, conn_limit=IN_FLIGHT)
    try:
        slots = asyncio.Semaphore(IN_FLIGHT)
        tasks: list[asyncio.Task[tuple[int, str, np.ndarray]]] = []

        async def one(value: int) -> tuple[int, str, np.ndarray]:
            try:
                return await _infer(client, value)
            finally:
                slots.release()

        load = None
        sent_after_load = 0
        while len(tasks) < TOTAL or load is None or not load.done() or sent_after_load < AFTER_LOAD:
            await slots.acquire()
            tasks.append(asyncio.create_task(one(len(tasks))))
            if load is None and len(tasks) == IN_FLIGHT:
                load = asyncio.create_task(client.load_model("adder"))
            elif load is not None and load.done():
                load.result()  # a failed load fails the test here
                sent_after_load += 1
        answers = await asyncio.gather(*tasks)
        index = await client.get_model_repository_index()
        return answers, index
    finally:
        await client.close()


def test_version_two_rolls_out_while_requests_are_in_flight(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    write_add_version(repo, "adder", 1, 1.0)
    with ferry_serve(repo, "--model-control-mode", "explicit", "--load-model", "adder") as url:
        with httpclient.InferenceServerClient(url) as client:
            assert client.is_model_ready("adder", "1")
        write_add_version(repo, "adder", 2, 2.0)
        answers, index = asyncio.run(_roll_out(url))
    assert len(answers) >= TOTAL
    by_version: dict[str, int] = {}
    for value, version, output in answers:
        assert version in ("1", "2"), version
        np.testing.assert_array_equal(output, np.full((1, 4), value + int(version), dtype=np.float32))
        by_version[version] = by_version.get(version, 0) + 1
    assert by_version.get("1", 0) > 0 and by_version.get("2", 0) > 0, by_version
    rows = {(row["name"], row.get("version")): row["state"] for row in index}
    assert rows == {("adder", "2"): "READY"}, index
