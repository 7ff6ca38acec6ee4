"""A Redis Cluster changing under load: a slot moved to another master, and a master
SIGKILLed, its replica taking over; the fleet rides both out. First, ferry's cluster client
and its pipes alone: a command that meets ASK while a slot moves runs once, on the slot's new
master, and the pipes follow the slot. For the kill, 2,000 synchronous requests and 50 async
jobs go through a gateway to two workers on a three-master cluster; once a third of the
requests are answered, the master holding the model's request stream is killed. Every request
gets exactly one answer (its own, right) or a clear error, none waits out a timeout, and every
accepted job reaches a final state."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor, wait
from pathlib import Path

import httpx
import pytest

from broker import channels
from broker.redis_pipe import ClusterPipes
from broker.redis_url import async_client
from tests.fleet.processes import Fleet, Gateway, wait_for
from tests.models import recorded_values, write_recording_model
from tests.redis_cluster import RedisCluster

MODEL = "recorder"
REQUESTS = 2_000
JOBS = 50
CLIENTS = 16
KILL_AFTER = REQUESTS // 3
# A request either answered or refused within this; a lost one would wait the gateway's
# reply timeout (300 s) instead.
CLIENT_TIMEOUT_S = 60.0
JOB_DEADLINE_S = 120.0
LOAD_DEADLINE_S = 240.0
WORKER = ("--heartbeat-s", "0.5", "--claim-interval-s", "0.5", "--claim-idle-s", "2")


@pytest.fixture(scope="module")
def cluster() -> Iterator[RedisCluster]:
    """One cluster for this module: the slot move first, then the kill (it leaves a master down)."""
    with RedisCluster() as started:
        yield started


def body(value: int) -> dict[str, object]:
    return {"inputs": [{"name": "INPUT0", "shape": [1], "datatype": "INT32", "data": [value]}]}


class Load:
    """The clients: each request's outcome by value, and the count answered so far."""

    def __init__(self, gateway: Gateway) -> None:
        self._url = f"http://{gateway.url}/v2/models/{MODEL}/infer"
        self.outcomes: dict[int, tuple[int, object]] = {}
        self.jobs: dict[int, str] = {}
        self.refused_jobs: dict[int, int] = {}
        self.answered = 0
        self._lock = threading.Lock()

    def request(self, client: httpx.Client, value: int) -> None:
        try:
            response = client.post(self._url, json=body(value))
        except httpx.TimeoutException:
            outcome: tuple[int, object] = (0, "no answer within the client timeout")
        else:
            payload = response.json()
            outcome = (response.status_code, payload["outputs"][0]["data"][0] if response.status_code == 200
                       else payload.get("error"))
        with self._lock:
            self.outcomes[value] = outcome
            self.answered += 1

    def job(self, client: httpx.Client, value: int) -> None:
        response = client.post(self._url, json=body(value), headers={"Prefer": "respond-async"})
        with self._lock:
            if response.status_code == 202:
                self.jobs[value] = str(response.json()["job_id"])
            else:
                self.refused_jobs[value] = response.status_code


def serving(fleet: Fleet) -> Gateway:
    """A gateway and two workers, once the model is ready."""
    gateway = fleet.gateway()
    fleet.worker("w1", *WORKER)
    fleet.worker("w2", *WORKER)
    fleet.wait_model_ready(gateway, MODEL)
    return gateway


def finish(pool: ThreadPoolExecutor, calls: list[Future[None]], fleet: Fleet) -> None:
    """Every request answered or refused within LOAD_DEADLINE_S, or the test fails then."""
    _, unfinished = wait(calls, timeout=LOAD_DEADLINE_S)
    if unfinished:
        pool.shutdown(cancel_futures=True)  # those not sent yet stay unsent; the rest time out
        raise AssertionError(f"{len(unfinished)} of {len(calls)} requests still unanswered after "
                             f"{LOAD_DEADLINE_S:g} s\n{fleet.describe()}")


def job_states(client: httpx.Client, gateway: Gateway, jobs: dict[int, str]) -> dict[int, str]:
    """Each job's state once all are final, or as they are at the deadline."""
    states: dict[int, str] = {}
    deadline = time.monotonic() + JOB_DEADLINE_S
    while time.monotonic() < deadline:
        states = {value: job_state(client.get(f"http://{gateway.url}/v2/jobs/{job_id}"))
                  for value, job_id in jobs.items()}
        if all(state in ("succeeded", "failed", "cancelled") for state in states.values()):
            break
        time.sleep(0.2)
    return states


def job_state(response: httpx.Response) -> str:
    if response.status_code != 200:
        return f"HTTP {response.status_code}: {response.text[:200]}"
    document = response.json()
    # A finished job answers with its inference body; one under way with its status.
    return str(document["status"]) if "job_id" in document else "succeeded"


def test_a_command_meeting_ask_while_its_slot_moves_runs_once_on_the_new_master(cluster: RedisCluster) -> None:
    # redis-py's asyncio client sends ASKING and the command on two pooled connections: with
    # several open to the new master the command meets MOVED back, and its redirections ran out
    # within a millisecond ("TTL exhausted", a 503 at the gateway) for as long as the move took.
    key = "ferry.test.moving"
    source = cluster.master_of(key)
    target = next(node for node in cluster.masters() if node is not source)
    on_target = next(name for name in (f"ferry.test.{n}" for n in range(10_000)) if cluster.master_of(name) is target)

    async def scenario() -> list[bytes]:
        client = async_client(cluster.url)
        try:
            await client.xadd(key, {"d": b"before"})
            await asyncio.gather(*(client.get(on_target) for _ in range(8)))  # 8 connections open to the target
            move = await asyncio.to_thread(cluster.migrate_keys_of, key, target)
            hand_over = asyncio.create_task(asyncio.to_thread(lambda: (time.sleep(0.5), cluster.hand_over(move))))
            await client.xadd(key, {"d": b"during"})  # the old master answers ASK now
            await hand_over
            return [fields[b"d"] for _, fields in await client.xrange(key)]
        finally:
            await client.aclose()

    assert asyncio.run(scenario()) == [b"before", b"during"]
    assert cluster.master_of(key) is target


def test_commands_go_to_each_master_together_and_follow_a_slot_that_moved(cluster: RedisCluster) -> None:
    # broker.redis_pipe.ClusterPipes: one write per master for the commands due at once;
    # a command its master no longer serves (ASK while the slot moves, MOVED after) goes through the
    # cluster client, and the next one to the new master's pipe.
    masters = cluster.masters()
    keys = [next(f"ferry.test.pipes.{n}" for n in range(10_000) if cluster.master_of(f"ferry.test.pipes.{n}") is m)
            for m in masters]
    moving = keys[0]
    target = masters[1]

    async def scenario() -> tuple[dict[str, int], dict[str, int], dict[str, int], list[bytes]]:
        client = async_client(cluster.url)
        pipes = ClusterPipes(client)  # type: ignore[arg-type]
        try:
            await client.ping()  # the client maps the slots
            await asyncio.gather(*(pipes.call_for(key, "XADD", key, "*", "n", str(n))
                                   for n in range(10) for key in keys))
            together = pipes.round_trips
            move = await asyncio.to_thread(cluster.migrate_keys_of, moving, target)
            hand_over = asyncio.create_task(asyncio.to_thread(lambda: (time.sleep(0.3), cluster.hand_over(move))))
            await pipes.call_for(moving, "XADD", moving, "*", "n", "asked")  # ASK from the old master
            await hand_over
            before = pipes.round_trips
            await pipes.call_for(moving, "XADD", moving, "*", "n", "moved")  # MOVED from the old master
            await pipes.call_for(moving, "XADD", moving, "*", "n", "there")  # to the new master's pipe
            entries = await client.xrange(moving)
            return together, before, pipes.round_trips, [fields[b"n"] for _, fields in entries]
        finally:
            await pipes.aclose()
            for key in keys:
                await client.delete(key)
            await client.aclose()

    together, before, after, values = asyncio.run(scenario())
    names = [f"127.0.0.1:{master.port}" for master in masters]
    assert together == dict.fromkeys(names, 1)  # 30 commands, one write to each master
    old, new = names[0], names[1]
    assert (after[old] - before[old], after[new] - before[new]) == (1, 1)  # MOVED once, then the new master's pipe
    assert values == [str(n).encode() for n in range(10)] + [b"asked", b"moved", b"there"]
    assert cluster.master_of(moving) is target


def test_a_slot_moved_to_another_master_under_load_is_followed_and_no_request_is_left_hanging(
    cluster: RedisCluster, tmp_path: Path
) -> None:
    # The model's request stream, with its consumer group and its pending entries, is MIGRATEd
    # while gateways publish to it and workers block reading it: clients meet ASK, then MOVED.
    record = tmp_path / "computed.txt"
    write_recording_model(tmp_path / "repo", MODEL, record)
    requests = REQUESTS // 4
    with Fleet(cluster.url, tmp_path / "repo", tmp_path) as fleet, \
            httpx.Client(timeout=CLIENT_TIMEOUT_S, limits=httpx.Limits(max_connections=CLIENTS + 4)) as client, \
            ThreadPoolExecutor(CLIENTS) as pool:
        gateway = serving(fleet)
        stream = channels.request_channel(MODEL)
        source = cluster.master_of(stream)
        target = next(node for node in cluster.masters() if node is not source)
        load = Load(gateway)
        calls = [pool.submit(load.request, client, value) for value in range(requests)]
        wait_for(lambda: load.answered >= requests // 3, 120.0, "answers before the move")
        cluster.move_slot_of(stream, target)
        finish(pool, calls, fleet)
        assert cluster.master_of(stream) is target

    wrong = {v: o for v, o in load.outcomes.items() if o[0] != 200 or o[1] != 2 * v}
    assert not wrong, f"{len(wrong)} requests not answered right: {dict(list(wrong.items())[:10])}"
    computed = recorded_values(record)
    print(f"\nslot moved: {requests} answered right, {len(computed) - len(set(computed))} computed twice")


def test_a_master_killed_under_load_is_replaced_and_no_request_or_job_is_left_hanging(
    cluster: RedisCluster, tmp_path: Path
) -> None:
    record = tmp_path / "computed.txt"
    write_recording_model(tmp_path / "repo", MODEL, record)
    with Fleet(cluster.url, tmp_path / "repo", tmp_path) as fleet, \
            httpx.Client(timeout=CLIENT_TIMEOUT_S, limits=httpx.Limits(max_connections=CLIENTS + 4)) as client, \
            ThreadPoolExecutor(CLIENTS) as pool:
        gateway = serving(fleet)
        victim = cluster.master_of(channels.request_channel(MODEL))
        load = Load(gateway)
        calls = [pool.submit(load.request, client, value) for value in range(REQUESTS)]
        jobs = [pool.submit(load.job, client, REQUESTS + value) for value in range(JOBS)]
        wait_for(lambda: load.answered >= KILL_AFTER, 120.0, f"{KILL_AFTER} answers before the kill")
        victim.crash()
        killed_at = time.monotonic()
        finish(pool, calls + jobs, fleet)
        cluster.wait_ok()
        states = job_states(client, gateway, load.jobs)
        failover_s = time.monotonic() - killed_at
        # The master may have taken writes its replica never saw: the gateway saw the failure and
        # looked for the requests it was waiting for (broker.lost_requests), whether or not any was
        # missing; or it was waiting for none (its clients' requests were all still being published,
        # the cluster client retrying them, when it looked).
        looked = [e for e in gateway.log_events() if e.get("event") in ("lost_requests.none_missing",
                                                                         "lost_requests.missing",
                                                                         "lost_requests.none_unanswered")]
        assert looked, f"the gateway never looked for its requests after the kill\n{gateway.describe()}"

    wrong = {v: o for v, o in load.outcomes.items() if o[0] == 200 and o[1] != 2 * v}
    assert not wrong, f"answers that are not their own request's: {wrong}"
    hung = {v: o for v, o in load.outcomes.items() if o[0] == 0}
    assert not hung, f"{len(hung)} requests had no answer within {CLIENT_TIMEOUT_S:g} s"
    unclear = {v: o for v, o in load.outcomes.items() if o[0] not in (200, 503, 504)}
    assert not unclear, f"answers neither right nor a clear error: {unclear}"
    assert len(load.outcomes) == REQUESTS
    not_final = {v: s for v, s in states.items() if s not in ("succeeded", "failed")}
    assert not not_final, f"jobs left without a final state: {not_final}"
    refused = sum(1 for status, _ in load.outcomes.values() if status != 200)
    computed = recorded_values(record)
    print(f"\nfailover: {REQUESTS - refused} answered, {refused} refused (503/504); jobs: {len(load.jobs)} accepted, "
          f"{len(load.refused_jobs)} refused; {len(computed) - len(set(computed))} computed twice; "
          f"{failover_s:.1f} s from the kill to the last job's final state")
