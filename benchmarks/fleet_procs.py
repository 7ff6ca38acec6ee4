"""A fleet on one machine: a ``redis-server``, one ``ferry gateway`` and N ``ferry worker`` processes.

Everything started here is stopped when its block ends, on an error or Ctrl-C too:
processes with SIGTERM and, after a grace period, SIGKILL (``server.stop_process``), Redis
with ``SHUTDOWN NOSAVE`` (``tests.redis_server.RedisServer``).
"""

from __future__ import annotations

import contextlib
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import redis

from benchmarks.server import HOST, ServerError, free_port, log_tail, spawn_ferry, stop_process, wait_ready
from broker import channels
from tests.redis_server import RedisServer, flushdb
from workers.heartbeat import decode_heartbeat

READY_TIMEOUT_S = 90.0


@dataclass(frozen=True, slots=True)
class Redis:
    url: str
    pid: int


@dataclass(frozen=True, slots=True)
class Fleet:
    host: str
    port: int
    gateway_pid: int
    worker_pids: tuple[int, ...]
    worker_logs: tuple[Path, ...]


@contextlib.contextmanager
def redis_server() -> Iterator[Redis]:
    with RedisServer() as server:
        with redis.Redis.from_url(server.url) as client:
            pid = int(client.info("server")["process_id"])
        yield Redis(server.url, pid)


def empty(broker: Redis) -> None:
    """Forget every stream, group and heartbeat, so one configuration starts where the last did not."""
    flushdb(broker.url)


@contextlib.contextmanager
def fleet(repository: Path, broker: Redis, workers: int, model: str, logs: Path) -> Iterator[Fleet]:
    """A gateway and ``workers`` workers, ready once the gateway is and every worker's heartbeat names ``model``."""
    with contextlib.ExitStack() as stack:
        common = ["--broker", broker.url, "--model-repository", str(repository)]
        procs = [stack.enter_context(_running(["worker", *common], logs / f"worker-{index}.log"))
                 for index in range(workers)]
        port = free_port()
        gateway_log = logs / "gateway.log"
        gateway = stack.enter_context(_running(
            ["gateway", *common, "--http-port", str(port), "--host", HOST], gateway_log))
        wait_ready(gateway, port, gateway_log, READY_TIMEOUT_S, name="ferry gateway")
        _wait_heartbeats(broker, model, procs, logs)
        yield Fleet(HOST, port, gateway.pid, tuple(p.pid for p in procs),
                    tuple(logs / f"worker-{index}.log" for index in range(workers)))


@contextlib.contextmanager
def _running(args: list[str], log_path: Path) -> Iterator[subprocess.Popen[bytes]]:
    process = spawn_ferry(args, log_path)
    try:
        yield process
    finally:
        stop_process(process)


def serving_workers(broker: Redis, model: str) -> int:
    """How many live workers say in their heartbeat that they serve ``model``."""
    count = 0
    with redis.Redis.from_url(broker.url) as client:
        for key in client.scan_iter(match=channels.heartbeat_pattern()):
            raw = client.get(key)
            beat = decode_heartbeat(raw) if raw is not None else None
            if beat is not None and model in beat[1]:
                count += 1
    return count


def _wait_heartbeats(broker: Redis, model: str, procs: list[subprocess.Popen[bytes]], logs: Path) -> None:
    deadline = time.monotonic() + READY_TIMEOUT_S
    while (seen := serving_workers(broker, model)) < len(procs):
        for index, process in enumerate(procs):
            if process.poll() is not None:
                raise ServerError(f"ferry worker {index} exited with {process.returncode}:\n"
                                  f"{log_tail(logs / f'worker-{index}.log')}")
        if time.monotonic() > deadline:
            raise ServerError(f"{seen} of {len(procs)} workers serve '{model}' after {READY_TIMEOUT_S:.0f} s")
        time.sleep(0.2)


def pending_by_consumer(broker: Redis, model: str) -> list[int]:
    """Deliveries each worker holds unacked on ``model``'s request channel, most first.

    A worker fetches up to ``fetch_count`` requests at a time; one holding far more than
    the others while they sit idle is starving them.
    """
    channel, group = channels.request_channel(model), channels.worker_group(model)
    with redis.Redis.from_url(broker.url) as client:
        consumers = client.xinfo_consumers(channel, group)
    return sorted((int(consumer["pending"]) for consumer in consumers), reverse=True)
