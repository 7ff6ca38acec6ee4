"""``--http-workers N``: several HTTP processes on one port, each its own gateway,
with a real ``ferry serve`` (its broker then a bundled Valkey server) and the
official tritonclient."""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import numpy as np
import pytest
import redis
import tritonclient.http as triton
from tritonclient.utils import InferenceServerException

from broker import channels
from ferry.processes.http_workers import default_http_workers
from tests.procfs import child_pids, listens_on
from tests.servers import free_port, wait_ready

MODEL_REPO = Path(__file__).resolve().parents[3] / "model_repo"
HTTP_WORKERS = 4


def children(pid: int) -> dict[int, str]:
    """The child processes of ``pid``, each with its name (``ferry-http-0``, ``ferry-worker``, ``valkey-server``)."""
    found: dict[int, str] = {}
    for child in child_pids(pid):
        try:
            found[child] = Path(f"/proc/{child}/comm").read_text().strip()
        except FileNotFoundError:
            pass  # gone since
    return found


def workers_beating(valkey: redis.Redis) -> list[bytes]:
    return list(valkey.scan_iter(match=channels.heartbeat_key("*")))


def http_pids(pid: int) -> set[int]:
    return {child for child, name in children(pid).items() if name.startswith("ferry-http-")}


@contextlib.contextmanager
def serving(tmp_path: Path, new_session: bool = False,
            extra: tuple[str, ...] = ()) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    """``ferry serve --http-workers 4`` (and ``extra``) on add_sub; with ``new_session``, in a process
    group of its own, as a terminal runs a command."""
    shutil.copytree(MODEL_REPO / "add_sub", tmp_path / "repo" / "add_sub")
    port = free_port()
    log = open(tmp_path / "serve.log", "wb")
    process = subprocess.Popen(
        [sys.executable, "-m", "ferry.cli.main", "serve", "--model-repository", str(tmp_path / "repo"),
         "--host", "127.0.0.1", "--http-port", str(port), "--http-workers", str(HTTP_WORKERS), "--log-format", "json",
         "--grpc-port", "0", *extra],
        stdout=log, stderr=log, env={**os.environ, "PYTHONUNBUFFERED": "1"}, start_new_session=new_session,
    )
    try:
        wait_ready(f"http://127.0.0.1:{port}", process)
        # Started is not listening: until each process listens, new connections go to those
        # that do, and a test that kills the one listening would find the port refusing.
        _wait(lambda: len(pids := http_pids(process.pid)) == HTTP_WORKERS
              and all(listens_on(pid, port) for pid in pids), "every HTTP process listening")
        # Each gateway learns the worker's models from its heartbeats, every 0.5 s: the model is
        # ready everywhere once new connections, spread over the processes, all say so. The kernel
        # picks each connection's process by a hash: 16 probes missed a lagging one of 4 about once in
        # a hundred runs ((3/4)^16), 64 miss it about once in a hundred million.
        _wait(lambda: all(_model_ready(port) for _ in range(16 * HTTP_WORKERS)), "add_sub ready on every process")
        yield f"127.0.0.1:{port}", process
    finally:
        process.terminate()
        process.wait(timeout=60)
        log.close()


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    with serving(tmp_path) as started:
        yield started


def _model_ready(port: int) -> bool:
    """One readiness probe on a new connection (so on any of the processes)."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/v2/models/add_sub/ready", timeout=5) as answer:
            return answer.status == 200
    except OSError:
        return False


def _wait(condition, what: str, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


def _add(url: str, count: int, seed: int) -> int:
    """``count`` add_sub requests on one keep-alive client; how many came back right."""
    client = triton.InferenceServerClient(url, connection_timeout=30, network_timeout=60)
    rng = np.random.default_rng(seed)
    right = 0
    for _ in range(count):
        a, b = rng.random((1, 16), dtype=np.float32), rng.random((1, 16), dtype=np.float32)
        inputs = [triton.InferInput("INPUT0", [1, 16], "FP32"), triton.InferInput("INPUT1", [1, 16], "FP32")]
        inputs[0].set_data_from_numpy(a)
        inputs[1].set_data_from_numpy(b)
        result = client.infer("add_sub", inputs)
        right += bool(np.array_equal(result.as_numpy("OUTPUT0"), a + b)
                      and np.array_equal(result.as_numpy("OUTPUT1"), a - b))
    client.close()
    return right


def test_every_request_over_four_http_processes_is_answered_once_and_right(served) -> None:
    url, process = served
    with ThreadPoolExecutor(16) as pool:
        right = sum(pool.map(lambda seed: _add(url, 125, seed), range(16)))
    assert right == 2_000
    names = sorted(children(process.pid).values())
    assert names.count("ferry-worker") == 1 and names.count("valkey-server") == 1


def _job_result(url: str) -> list[float]:
    """add_sub's OUTPUT0 for ones plus twos, submitted with ``Prefer: respond-async`` and polled on
    new connections (so on any of the processes) until it succeeds."""
    tensor = {"shape": [1, 16], "datatype": "FP32"}
    body = {"inputs": [{"name": "INPUT0", **tensor, "data": [1.0] * 16},
                       {"name": "INPUT1", **tensor, "data": [2.0] * 16}]}
    submitted = httpx.post(f"http://{url}/v2/models/add_sub/infer", json=body, headers={"Prefer": "respond-async"})
    assert submitted.status_code == 202, submitted.text
    location = submitted.headers["location"]
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        polled = httpx.get(f"http://{url}{location}")
        if polled.status_code == 200 and "outputs" in polled.json():
            [output] = [o for o in polled.json()["outputs"] if o["name"] == "OUTPUT0"]
            return [float(value) for value in output["data"]]
        time.sleep(0.1)
    raise AssertionError(f"job {location} not done within 30 s")


def test_with_a_worker_per_http_process_each_answers_its_own_requests_past_the_broker(tmp_path: Path) -> None:
    with serving(tmp_path, extra=("--worker-per-http",)) as (url, process):
        with ThreadPoolExecutor(16) as pool:
            right = sum(pool.map(lambda seed: _add(url, 125, seed), range(16)))
        assert right == 2_000
        family = children(process.pid)
        assert sorted(family.values()) == sorted([f"ferry-http-{n}" for n in range(HTTP_WORKERS)] + ["valkey-server"])
        # Not one of them crossed the broker: the model's request stream on the Valkey server holds none.
        [server] = [pid for pid, name in family.items() if name == "valkey-server"]
        title = Path(f"/proc/{server}/cmdline").read_bytes()  # the server sets it: "valkey-server 127.0.0.1:PORT"
        port = int(re.search(rb"127\.0\.0\.1:(\d+)", title).group(1))  # type: ignore[union-attr]
        with redis.Redis(port=port) as valkey:
            assert valkey.xlen(channels.request_channel("add_sub")) == 0
            # Each process's own worker beats: four workers, not one.
            _wait(lambda: len(workers_beating(valkey)) == HTTP_WORKERS, "a heartbeat from each process's worker")
            # An async job crosses the broker, and any process answers its poll.
            assert _job_result(url) == [3.0] * 16
            assert valkey.xlen(channels.request_channel("add_sub")) == 1
        # Then a killed process is replaced, its worker with it, and every request is still answered.
        victim = min(http_pids(process.pid))
        os.kill(victim, signal.SIGKILL)
        _wait(lambda: not Path(f"/proc/{victim}").exists(), "the HTTP process dead and reaped", 15)
        assert _add(url, 50, seed=1) == 50
        _wait(lambda: len(http_pids(process.pid)) == HTTP_WORKERS and victim not in http_pids(process.pid),
              "the killed HTTP process replaced")
        _wait(lambda: all(_model_ready(int(url.rsplit(":", 1)[1])) for _ in range(16 * HTTP_WORKERS)),
              "add_sub ready on every process again")
        with ThreadPoolExecutor(8) as pool:
            assert sum(pool.map(lambda seed: _add(url, 25, seed), range(8))) == 200


def test_a_killed_http_process_is_replaced_and_the_port_keeps_answering(served) -> None:
    url, process = served
    before = http_pids(process.pid)
    victim = min(before)
    os.kill(victim, signal.SIGKILL)
    # Once it is dead (its listener closed), the others take its share of the port at once. A
    # zombie is not yet dead: its other threads may still be exiting, holding the listener, which
    # then resets what it queued. The supervisor reaps it only once the last thread is gone.
    _wait(lambda: not Path(f"/proc/{victim}").exists(), "the HTTP process dead and reaped", 15)
    assert _add(url, 50, seed=1) == 50
    _wait(lambda: len(http_pids(process.pid)) == HTTP_WORKERS and victim not in http_pids(process.pid),
          "the killed HTTP process replaced")
    with ThreadPoolExecutor(8) as pool:
        assert sum(pool.map(lambda seed: _add(url, 25, seed), range(8))) == 200


def test_a_killed_valkey_server_is_restarted_and_no_request_hangs_on_it(served) -> None:
    """The bundled server SIGKILLed under load: it starts again on its port, every request is
    answered (right, or with an error while it was down; those waiting on it are sent again or
    refused, none left to time out), and all is served right again afterwards."""
    url, process = served
    [server] = [pid for pid, name in children(process.pid).items() if name == "valkey-server"]
    stop, outcomes = threading.Event(), Counter()

    def load(seed: int) -> None:
        client = triton.InferenceServerClient(url, connection_timeout=30, network_timeout=60)
        rng = np.random.default_rng(seed)
        while not stop.is_set():
            a, b = rng.random((1, 16), dtype=np.float32), rng.random((1, 16), dtype=np.float32)
            inputs = [triton.InferInput("INPUT0", [1, 16], "FP32"), triton.InferInput("INPUT1", [1, 16], "FP32")]
            inputs[0].set_data_from_numpy(a)
            inputs[1].set_data_from_numpy(b)
            started = time.monotonic()
            try:
                result = client.infer("add_sub", inputs)
                outcomes["right" if np.array_equal(result.as_numpy("OUTPUT0"), a + b) else "wrong"] += 1
            except InferenceServerException as exc:
                outcomes[f"error {exc.status()}"] += 1
            outcomes["slow"] += time.monotonic() - started > 20
        client.close()

    with ThreadPoolExecutor(8) as pool:
        running = [pool.submit(load, seed) for seed in range(8)]
        try:
            _wait(lambda: outcomes["right"] >= 200, "requests answered before the kill")
            os.kill(server, signal.SIGKILL)
            _wait(lambda: any(name == "valkey-server" and pid != server
                              for pid, name in children(process.pid).items()), "the Valkey server started again", 30)
            _wait(lambda: all(_model_ready(int(url.rsplit(":", 1)[1])) for _ in range(16 * HTTP_WORKERS)),
                  "add_sub ready on every process again")
            answered = outcomes["right"]
            _wait(lambda: outcomes["right"] >= answered + 200, "requests answered after the restart")
        finally:
            stop.set()
        for future in running:
            future.result(timeout=90)
    assert outcomes["wrong"] == 0 and outcomes["slow"] == 0, outcomes
    assert set(outcomes) <= {"right", "slow", "wrong", "error 503", "error 500"}, outcomes
    assert process.poll() is None
    with ThreadPoolExecutor(8) as pool:
        assert sum(pool.map(lambda seed: _add(url, 25, seed), range(8))) == 200


def test_stopping_the_command_stops_every_process(served) -> None:
    url, process = served
    family = set(children(process.pid))
    assert len(family) == HTTP_WORKERS + 2
    process.terminate()
    assert process.wait(timeout=60) == 0
    _wait(lambda: not any(Path(f"/proc/{pid}").exists() for pid in family), "every child gone", 15)


def test_ctrl_c_to_the_whole_process_group_stops_every_process_cleanly(tmp_path: Path) -> None:
    """The terminal signals every process of the group at once: the bundled Valkey server, in a
    session of its own, must outlive the HTTP processes and the worker while they stop."""
    with serving(tmp_path, new_session=True) as (url, process):
        assert _add(url, 20, seed=3) == 20
        family = set(children(process.pid))
        os.killpg(process.pid, signal.SIGINT)
        assert process.wait(timeout=60) == 0
        _wait(lambda: not any(Path(f"/proc/{pid}").exists() for pid in family), "every child gone", 15)
    events = (tmp_path / "serve.log").read_text()
    assert "reader.failed" not in events and "worker.fetch_failed" not in events


def test_a_port_already_taken_fails_the_command_at_once(tmp_path: Path) -> None:
    with socketserver_on_a_port() as port:
        done = subprocess.run(
            [sys.executable, "-m", "ferry.cli.main", "gateway", "--model-repository", str(MODEL_REPO),
             "--broker", "redis://127.0.0.1:1/0", "--host", "127.0.0.1", "--http-port", str(port),
             "--http-workers", "2"], capture_output=True, text=True, timeout=60)
    assert done.returncode != 0
    assert "Address already in use" in done.stderr


@pytest.mark.parametrize(("cores", "expected"), [(1, 1), (2, 1), (4, 1), (8, 2), (16, 4), (64, 8)])
def test_the_default_is_a_quarter_of_the_cores(cores: int, expected: int) -> None:
    assert default_http_workers(cores) == expected


class socketserver_on_a_port:
    """A plain listener (no SO_REUSEPORT) holding a free port."""

    def __enter__(self) -> int:
        import socket
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._sock.bind(("127.0.0.1", 0))
        self._sock.listen()
        return int(self._sock.getsockname()[1])

    def __exit__(self, *exc: object) -> None:
        self._sock.close()
