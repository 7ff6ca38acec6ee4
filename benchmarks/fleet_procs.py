"""A fleet on one machine: a broker (``redis-server`` or a single-node Kafka), one
``ferry gateway`` and N ``ferry worker`` processes.

Each configuration starts clean on a broker shared by the whole run: Redis is emptied, and
on Kafka every configuration gets a namespace of its own (fresh topics and groups).

Everything started here is stopped when its block ends, on an error or Ctrl-C too:
processes with SIGTERM and, after a grace period, SIGKILL (``server.stop_process``), Redis
with ``SHUTDOWN NOSAVE`` (``tests.redis_server.RedisServer``), Kafka with SIGTERM
(``tests.kafka_server.KafkaServer``).
"""

from __future__ import annotations

import contextlib
import subprocess
import time
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import redis

from benchmarks.server import HOST, ServerError, free_port, log_tail, spawn_ferry, stop_process, wait_ready
from broker import channels
from broker.redis_url import sync_client
from broker.transports.kafka_api import KafkaAdminClient
from broker.transports.kafka_settings import KafkaSettings
from tests.kafka_server import KafkaServer
from tests.kafka_cluster import KafkaCluster
from tests.redis_cluster import RedisCluster, flush_cluster
from tests.redis_server import RedisServer, flushdb
from workers.heartbeat import decode_heartbeat

READY_TIMEOUT_S = 90.0


@dataclass(frozen=True, slots=True)
class Broker:
    kind: str  # "redis", "redis-cluster", "kafka" or "kafka-cluster"
    url: str
    pid: int
    others: tuple[int, ...] = ()  # a cluster's other nodes, where they are counted too

    @property
    def pids(self) -> tuple[int, ...]:
        return (self.pid, *self.others)


@dataclass(frozen=True, slots=True)
class Fleet:
    host: str
    port: int
    gateway_pid: int
    worker_pids: tuple[int, ...]
    worker_logs: tuple[Path, ...]


@contextlib.contextmanager
def redis_server() -> Iterator[Broker]:
    with RedisServer() as server:
        with redis.Redis.from_url(server.url) as client:
            pid = int(client.info("server")["process_id"])
        yield Broker("redis", server.url, pid)


@contextlib.contextmanager
def redis_cluster() -> Iterator[Broker]:
    """Three masters with a replica each; the pid is the first node's, ``others`` the rest's."""
    with RedisCluster() as cluster:
        pids = []
        for node in cluster.nodes:
            with redis.Redis(port=node.port) as client:
                pids.append(int(client.info("server")["process_id"]))
        yield Broker("redis-cluster", cluster.url, pids[0], tuple(pids[1:]))


@contextlib.contextmanager
def kafka_server() -> Iterator[Broker]:
    """A single-node Kafka; request topics get ferry's default of 4 partitions."""
    with KafkaServer() as server:
        yield Broker("kafka", f"kafka://{server.bootstrap}", server.pid)


@contextlib.contextmanager
def kafka_cluster() -> Iterator[Broker]:
    """Three brokers (KRaft); topics get three replicas and min.insync.replicas 2. The pid is
    the first broker's (the broker CPU column shows that one only)."""
    with KafkaCluster() as cluster:
        yield Broker("kafka-cluster", f"kafka://{cluster.bootstrap}", cluster.pid(1))


def fresh_url(broker: Broker) -> str:
    """The broker URL for one configuration, which starts where the last did not: Redis
    emptied of every stream, group and heartbeat; on Kafka, topics and groups of its own."""
    if broker.kind.startswith("kafka"):
        return f"{broker.url}?namespace=bench-{uuid.uuid4().hex[:8]}."
    if broker.kind == "redis-cluster":
        flush_cluster(broker.url)
    else:
        flushdb(broker.url)
    return broker.url


@contextlib.contextmanager
def fleet(repository: Path, broker_url: str, workers: int, model: str, logs: Path,
          gateway_args: Sequence[str] = (), common_args: Sequence[str] = ()) -> Iterator[Fleet]:
    """A gateway (with ``gateway_args``, e.g. ``--http-workers``) and ``workers`` workers (both
    with ``common_args``, e.g. ``--claim-check-store none``), ready
    once the gateway is and every worker serves ``model``: its heartbeat names it (Redis), or it
    holds partitions of its group (Kafka)."""
    with contextlib.ExitStack() as stack:
        common = ["--broker", broker_url, "--model-repository", str(repository), *common_args]
        # Several workers on one host: none takes the default metrics port 8002.
        procs = [stack.enter_context(_running(["worker", *common, "--metrics-port", "0"],
                                              logs / f"worker-{index}.log"))
                 for index in range(workers)]
        port = free_port()
        gateway_log = logs / "gateway.log"
        gateway = stack.enter_context(_running(
            ["gateway", *common, "--http-port", str(port), "--host", HOST, "--grpc-port", "0", *gateway_args], gateway_log))
        wait_ready(gateway, port, gateway_log, READY_TIMEOUT_S, name="ferry gateway")
        _wait_serving(broker_url, model, procs, logs)
        yield Fleet(HOST, port, gateway.pid, tuple(p.pid for p in procs),
                    tuple(logs / f"worker-{index}.log" for index in range(workers)))


@contextlib.contextmanager
def _running(args: list[str], log_path: Path) -> Iterator[subprocess.Popen[bytes]]:
    process = spawn_ferry(args, log_path)
    try:
        yield process
    finally:
        stop_process(process)


def serving_workers(broker_url: str, model: str) -> int:
    """How many workers serve ``model``: on Redis, live workers whose heartbeat names it;
    on Kafka, members of its group that hold a partition (fewer than the workers when
    there are more workers than partitions)."""
    if broker_url.startswith("kafka://"):
        return sum(1 for held in partitions_by_member(broker_url, model) if held)
    count = 0
    with sync_client(broker_url) as client:
        for key in client.scan_iter(match=channels.heartbeat_pattern()):
            raw = client.get(key)
            beat = decode_heartbeat(raw) if raw is not None else None
            if beat is not None and model in beat[1]:
                count += 1
    return count


def _wait_serving(broker_url: str, model: str, procs: list[subprocess.Popen[bytes]], logs: Path) -> None:
    deadline = time.monotonic() + READY_TIMEOUT_S
    while (seen := serving_workers(broker_url, model)) < len(procs):
        for index, process in enumerate(procs):
            if process.poll() is not None:
                raise ServerError(f"ferry worker {index} exited with {process.returncode}:\n"
                                  f"{log_tail(logs / f'worker-{index}.log')}")
        if time.monotonic() > deadline:
            raise ServerError(f"{seen} of {len(procs)} workers serve '{model}' after {READY_TIMEOUT_S:.0f} s")
        time.sleep(0.2)


def held_by_worker(broker_url: str, model: str) -> list[int]:
    """What each worker holds of ``model``'s requests, most first: on Redis, deliveries
    unacked on its request stream (one holding far more than the others while they sit idle
    is starving them); on Kafka, partitions of its request topic."""
    if broker_url.startswith("kafka://"):
        return partitions_by_member(broker_url, model)
    channel, group = channels.request_channel(model), channels.worker_group(model)
    with sync_client(broker_url) as client:
        consumers = client.xinfo_consumers(channel, group)
    return sorted((int(consumer["pending"]) for consumer in consumers), reverse=True)


def partitions_by_member(broker_url: str, model: str) -> list[int]:
    """Partitions each member of ``model``'s worker group holds, most first; [] while the
    group is not stable (joining or rebalancing)."""
    settings = KafkaSettings.from_url(broker_url)
    group = settings.namespace + channels.worker_group(model)
    admin = KafkaAdminClient(bootstrap_servers=list(settings.bootstrap))
    try:
        described = admin.describe_groups([group])[group]
    finally:
        admin.close()
    if described.get("group_state") != "Stable":
        return []
    held = []
    for member in described.get("members", []):
        assignment = member.get("member_assignment") or {}
        held.append(sum(len(topic["partitions"]) for topic in assignment.get("assigned_partitions", [])))
    return sorted(held, reverse=True)
