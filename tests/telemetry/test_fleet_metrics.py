"""A fleet over Redis: the queue lag a gateway's ``/metrics`` and ``ferry lag``
report while no worker consumes, a worker's own ``/metrics`` and probes, and
the gateway's view of which workers are live."""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import tritonclient.http as httpclient

from broker import channels
from broker.envelope import Request, WireTensor, encode_request
from broker.transports.redis import PAYLOAD_FIELD
from tests.fleet.processes import REPO_ROOT, Fleet, wait_for
from tests.models import write_slow_model
from tests.redis_server import flushdb
from tests.servers import free_port

MODEL_REPO = Path(__file__).resolve().parents[2] / "model_repo"
QUEUED = 7
SLOW_S = 1.5

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=3) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()
    except OSError:
        return 0, ""


def scrape(base: str) -> Samples:
    from prometheus_client.parser import text_string_to_metric_families

    status, text = get(f"http://{base}/metrics")
    assert status == 200, status
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def queue_key(name: str, model: str) -> tuple[str, tuple[tuple[str, str], ...]]:
    return name, (("channel", channels.request_channel(model)), ("group", channels.worker_group(model)),
                  ("model", model))


def ferry_lag(broker: str, repo: Path, *extra: str) -> str:
    done = subprocess.run([sys.executable, "-m", "ferry.cli.main", "lag", "--broker", broker,
                           "--model-repository", str(repo), *extra],
                          cwd=REPO_ROOT, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    return done.stdout


def lag_rows(broker: str, repo: Path) -> dict[str, tuple[int, int]]:
    return {row["model"]: (row["lag"], row["pending"]) for row in json.loads(ferry_lag(broker, repo, "--format", "json"))}


def publish_add_sub(fleet: Fleet, count: int) -> None:
    """Straight onto the request stream, as an outside producer would."""
    data = np.ones(16, "<f4").tobytes()
    for index in range(count):
        request = Request(id=f"queued-{index}", model="add_sub", reply_to="ferry.replies.nobody",
                          inputs=tuple(WireTensor(name, "FP32", (1, 16), data) for name in ("INPUT0", "INPUT1")))
        fleet.redis.xadd(channels.request_channel("add_sub"), {PAYLOAD_FIELD: encode_request(request)})


def infer_slow(url: str) -> np.ndarray:
    client = httpclient.InferenceServerClient(url, network_timeout=60.0)
    try:
        tensor = httpclient.InferInput("X", [4], "FP32")
        tensor.set_data_from_numpy(np.ones(4, np.float32))
        return client.infer("slow", [tensor]).as_numpy("Y")
    finally:
        client.close()


def test_lag_liveness_and_a_workers_own_endpoints(redis_url: str, tmp_path: Path):
    flushdb(redis_url)
    repo = tmp_path / "repo"
    shutil.copytree(MODEL_REPO / "add_sub", repo / "add_sub")
    write_slow_model(repo, "slow", SLOW_S)
    with ThreadPoolExecutor(1) as clients, Fleet(redis_url, repo, tmp_path) as fleet:
        gateway = fleet.gateway("--backlog-interval-s", "0.2")
        publish_add_sub(fleet, QUEUED)

        # Nobody consumes add_sub yet: all of it is lag, on the gateway and in ferry lag alike.
        wait_for(lambda: scrape(gateway.url).get(queue_key("ferry_queue_lag", "add_sub")) == QUEUED, 20,
                 "the gateway to report the queued requests as lag", gateway)
        before = scrape(gateway.url)
        assert before[queue_key("ferry_queue_pending", "add_sub")] == 0
        assert before[queue_key("ferry_queue_depth", "add_sub")] == QUEUED
        assert before[queue_key("ferry_queue_lag", "slow")] == 0
        assert before[("ferry_workers_live", ())] == 0
        assert lag_rows(fleet.broker_url, repo) == {"add_sub": (QUEUED, 0), "slow": (0, 0)}
        table = ferry_lag(fleet.broker_url, repo, "--model", "add_sub").splitlines()
        assert table[0].split() == ["model", "channel", "group", "lag", "pending"]
        assert table[1].split() == ["add_sub", channels.request_channel("add_sub"),
                                    channels.worker_group("add_sub"), str(QUEUED), "0"]

        port = free_port()
        worker = fleet.worker("w1", "--metrics-port", str(port), "--metrics-host", "127.0.0.1")
        base = f"127.0.0.1:{port}"
        wait_for(lambda: get(f"http://{base}/v2/health/ready")[0] == 200, 30, "the worker to be ready", worker)
        assert get(f"http://{base}/v2/health/live")[0] == 200
        success = ("ferry_inference_request_success_total", (("model", "add_sub"), ("version", "1")))
        wait_for(lambda: scrape(base).get(success) == QUEUED, 30, "the worker to answer the queue", worker)
        mine = scrape(base)
        assert mine[("ferry_worker_info", (("worker", "w1"),))] == 1
        assert mine[("ferry_inference_count_total", (("model", "add_sub"), ("version", "1")))] == QUEUED
        wait_for(lambda: scrape(gateway.url).get(queue_key("ferry_queue_depth", "add_sub")) == 0, 20,
                 "the gateway to see the queue drained", gateway)
        # The gateway reads heartbeats every 0.5 s.
        wait_for(lambda: scrape(gateway.url).get(("ferry_worker_up", (("worker", "w1"),))) == 1, 5,
                 "the gateway to count the worker live", gateway)
        assert scrape(gateway.url)[("ferry_workers_live", ())] == 1
        assert lag_rows(fleet.broker_url, repo) == {"add_sub": (0, 0), "slow": (0, 0)}

        # Draining: not ready (the pod leaves its Service) but live, until the batch in flight is answered.
        fleet.wait_model_ready(gateway, "slow")
        answer = clients.submit(infer_slow, gateway.url)
        pending = ("ferry_inference_pending_request_count", (("model", "slow"),))
        wait_for(lambda: scrape(base).get(pending) == 1, 20, "the slow request to reach the worker", worker)
        worker.send(signal.SIGTERM)
        wait_for(lambda: get(f"http://{base}/v2/health/ready")[0] == 503, 5, "the worker to report draining", worker)
        assert get(f"http://{base}/v2/health/live")[0] == 200
        assert answer.result(timeout=30).tolist() == [2.0] * 4
        assert worker.wait(15) == 0, worker.describe()
        wait_for(lambda: ("ferry_worker_up", (("worker", "w1"),)) not in scrape(gateway.url), 10,
                 "the gateway to drop the stopped worker", gateway)
        assert scrape(gateway.url)[("ferry_workers_live", ())] == 0
        assert not worker.errors(), worker.errors()
