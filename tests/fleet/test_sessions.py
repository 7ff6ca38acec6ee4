"""Sequences across a Redis fleet: every step reaches the worker holding its
state; when that worker dies, the sequence resumes from its checkpoint on
another, or, without checkpoints, fails with an explicit "session lost"."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.fleet.processes import Fleet, FerryProcess, Gateway, wait_for
from tests.redis_server import flushdb
from tests.workers.sequences.accumulator import write_accumulator

MODEL = "accumulator"
WORKER_OPTIONS = ("--heartbeat-s", "0.2", "--claim-interval-s", "0.2", "--claim-idle-s", "1.0")


@pytest.fixture
def clean_redis(redis_url: str) -> Iterator[str]:
    flushdb(redis_url)
    yield redis_url
    flushdb(redis_url)


def start_fleet(fleet: Fleet, workers: int) -> tuple[Gateway, list[FerryProcess]]:
    started = [fleet.worker(f"w{i}", *WORKER_OPTIONS) for i in range(workers)]
    gateway = fleet.gateway()
    fleet.wait_model_ready(gateway, MODEL)
    return gateway, started


def step(client: httpclient.InferenceServerClient, sequence_id: int, x: int,
         start: bool = False, end: bool = False) -> tuple[int, int, str]:
    """(the running sum, the pid of the worker that computed it, the sequence's session channel)."""
    tensor = httpclient.InferInput("X", [1, 1], "INT32")
    tensor.set_data_from_numpy(np.array([[x]], dtype=np.int32))
    result = client.infer(MODEL, [tensor], sequence_id=sequence_id, sequence_start=start, sequence_end=end)
    channel = result.get_response().get("parameters", {}).get("sequence_channel", "")
    return int(result.as_numpy("SUM")[0, 0]), worker_pid(int(result.as_numpy("PID")[0, 0])), channel


def worker_pid(pid: int) -> int:
    """The worker whose instance process ``pid`` is: the model computes in a process of its own."""
    return int(Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[1])


def by_pid(workers: list[FerryProcess], pid: int) -> FerryProcess:
    return next(w for w in workers if w.pid == pid)


def test_every_step_of_a_sequence_reaches_the_worker_holding_it(fleet_redis_url: str, tmp_path: Path) -> None:
    # Each sequence waits while the seven others take a step; under load that can pass the 5 s
    # default idle timeout, which this test is not about.
    write_accumulator(tmp_path / "repo", strategy="oldest { }", idle_us=60_000_000)
    with Fleet(fleet_redis_url, tmp_path / "repo", tmp_path) as fleet:
        gateway, _ = start_fleet(fleet, 2)
        client = httpclient.InferenceServerClient(gateway.url)
        seen: dict[int, list[tuple[int, int, str]]] = {s: [] for s in range(1, 9)}
        for x in range(1, 6):
            for sequence_id in seen:
                seen[sequence_id].append(step(client, sequence_id, x, start=x == 1, end=x == 5))
        client.close()
    for sequence_id, steps in seen.items():
        assert [s[0] for s in steps] == [1, 3, 6, 10, 15], f"sequence {sequence_id}"
        assert len({s[1] for s in steps}) == 1, f"sequence {sequence_id} moved between workers: {steps}"
        assert len({s[2] for s in steps}) == 1


def kill_mid_sequence(fleet: Fleet) -> tuple[httpclient.InferenceServerClient, list[int], FerryProcess]:
    """Three steps on one worker, then SIGKILL that worker."""
    gateway, workers = start_fleet(fleet, 2)
    client = httpclient.InferenceServerClient(gateway.url, network_timeout=60.0)
    before = [step(client, 77, x, start=x == 1) for x in (1, 2, 3)]
    holder = by_pid(workers, before[-1][1])
    holder.kill()
    return client, [s[0] for s in before], next(w for w in workers if w is not holder)


def test_a_checkpointed_sequence_resumes_on_another_worker(fleet_redis_url: str, tmp_path: Path) -> None:
    write_accumulator(tmp_path / "repo")
    with Fleet(fleet_redis_url, tmp_path / "repo", tmp_path) as fleet:
        client, before, survivor = kill_mid_sequence(fleet)
        after = [step(client, 77, x, end=x == 6) for x in (4, 5, 6)]
        client.close()
        assert [s[0] for s in after] == [10, 15, 21], fleet.describe()
        assert before == [1, 3, 6]
        assert {s[1] for s in after} == {survivor.pid}
        assert any(e.get("event") == "sequence.resumed" for e in survivor.log_events())


def test_without_checkpoints_a_dead_workers_sequence_is_lost_not_reset(clean_redis: str, tmp_path: Path) -> None:
    write_accumulator(tmp_path / "repo", parameters={"checkpoint_state": "false"})
    with Fleet(clean_redis, tmp_path / "repo", tmp_path) as fleet:
        client, _, _ = kill_mid_sequence(fleet)
        with pytest.raises(InferenceServerException) as lost:
            step(client, 77, 4)
        restarted = step(client, 77, 4, start=True)
        client.close()
    assert lost.value.status() == "410" and "lost" in str(lost.value), str(lost.value)
    assert restarted[0] == 4


def test_steps_outside_a_live_sequence_get_clear_errors(clean_redis: str, tmp_path: Path) -> None:
    write_accumulator(tmp_path / "repo")
    with Fleet(clean_redis, tmp_path / "repo", tmp_path) as fleet:
        gateway, _ = start_fleet(fleet, 2)
        client = httpclient.InferenceServerClient(gateway.url)
        errors = []
        for sequence_id, start in ((5, False), (6, True)):
            if start:
                step(client, sequence_id, 1, start=True, end=True)
            with pytest.raises(InferenceServerException) as refused:
                step(client, sequence_id, 1)
            errors.append(refused.value)
        good = step(client, 8, 2, start=True, end=True)
        client.close()
    assert [e.status() for e in errors] == ["400", "400"]
    assert all("sequence_start" in str(e) for e in errors), [str(e) for e in errors]
    assert good[0] == 2


def test_a_live_sequence_started_again_restarts_at_its_home(clean_redis: str, tmp_path: Path) -> None:
    write_accumulator(tmp_path / "repo")
    with Fleet(clean_redis, tmp_path / "repo", tmp_path) as fleet:
        gateway, _ = start_fleet(fleet, 2)
        client = httpclient.InferenceServerClient(gateway.url)
        home_pid = [step(client, 31, x, start=x == 1) for x in (1, 2)][-1][1]
        client.close()
        restarts = []
        for attempt in range(6):  # straight onto the shared stream, as a producer would
            body = json.dumps({"parameters": {"sequence_id": 31, "sequence_start": True},
                               "inputs": [{"name": "X", "datatype": "INT32", "shape": [1, 1], "data": [100]}]})
            fleet.redis.xadd("ferry.accumulator.requests", {"d": body, "h.content-type": "application/json",
                                                             "h.reply-to": "restarts", "h.request-id": f"r{attempt}"})
            wait_for(lambda: fleet.redis.xlen("restarts") > attempt, 30, "a reply to the restart")
        for _, fields in fleet.redis.xrange("restarts"):
            outputs = {o["name"]: o["data"][0] for o in json.loads(fields[b"d"])["outputs"]}
            restarts.append((outputs["SUM"], worker_pid(outputs["PID"])))
    assert restarts == [(100, home_pid)] * 6
