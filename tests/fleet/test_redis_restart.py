"""redis-server SIGKILLed and restarted (same port, same directory, AOF) under
load: a gateway and two workers as real processes, 1,500 synchronous requests
from 32 clients and 50 async jobs around the crash.

Every request must be answered, correctly or with a clear error, within
30 s of the restart (none waits out the gateway's 300 s reply timeout);
every job accepted must be final within 60 s; and the gateway's reply
stream must be trimmed again afterwards.
"""

from __future__ import annotations

import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.fleet.processes import Fleet, Gateway, wait_for
from tests.models import write_add_sub
from tests.redis_server import RedisServer

MODEL = "add_sub"
REQUESTS = 1_500
JOBS = 50
CLIENTS = 32
ANSWERED_WITHIN_S = 30.0
JOBS_FINAL_WITHIN_S = 60.0
# Long enough that a request left waiting for its reply shows up as a hang.
CLIENT_TIMEOUT_S = 90.0
FINAL = {"succeeded", "failed", "cancelled", "expired"}


@dataclass
class Outcome:
    status: int
    ok: bool  # 200 with the right sums, or an error with a message
    detail: str
    at: float


def body(value: int) -> dict[str, Any]:
    data = [float(value)] * 16
    return {"inputs": [{"name": "INPUT0", "shape": [1, 16], "datatype": "FP32", "data": data},
                       {"name": "INPUT1", "shape": [1, 16], "datatype": "FP32", "data": data}]}


def judge(value: int, response: httpx.Response) -> Outcome:
    now = time.monotonic()
    try:
        document = response.json()
    except ValueError:
        return Outcome(response.status_code, False, response.text[:200], now)
    if response.status_code == 200:
        sums = next(o["data"] for o in document["outputs"] if o["name"] == "OUTPUT0")
        return Outcome(200, sums == [2.0 * value] * 16, str(sums[:2]), now)
    # A clear error: the broker was down (503), with a message saying so.
    message = str(document.get("error", ""))
    return Outcome(response.status_code, response.status_code == 503 and bool(message), message, now)


def send_all(gateway: Gateway, values: range, outcomes: dict[int, Outcome]) -> None:
    with httpx.Client(timeout=CLIENT_TIMEOUT_S) as http:
        for value in values:
            try:
                response = http.post(f"http://{gateway.url}/v2/models/{MODEL}/infer", json=body(value))
                outcomes[value] = judge(value, response)
            except httpx.HTTPError as exc:
                outcomes[value] = Outcome(0, False, repr(exc), time.monotonic())


def submit_jobs(http: httpx.Client, gateway: Gateway, first: int, count: int) -> dict[str, int]:
    """Job ids of the jobs accepted; a 503 while the broker is down is a clear refusal."""
    accepted = {}
    for value in range(first, first + count):
        response = http.post(f"http://{gateway.url}/v2/models/{MODEL}/infer", json=body(value),
                             headers={"Prefer": "respond-async"})
        assert response.status_code in (202, 503), f"{response.status_code} {response.text}"
        if response.status_code == 202:
            accepted[response.json()["job_id"]] = value
    return accepted


def job_status(http: httpx.Client, gateway: Gateway, job_id: str) -> str:
    response = http.get(f"http://{gateway.url}/v2/jobs/{job_id}")
    if response.status_code == 200 and response.headers.get("content-type") == "application/json":
        document = response.json()
        return str(document["status"]) if "job_id" in document else "succeeded"
    return f"http {response.status_code}"


@pytest.mark.parametrize("fsync", ["always", "everysec"])
def test_a_redis_restart_under_load_leaves_no_request_or_job_hanging(tmp_path: Path, fsync: str) -> None:
    repo = tmp_path / "repo"
    write_add_sub(repo, MODEL, max_batch_size=8)
    with RedisServer(extra=("--appendfsync", fsync)) as server, Fleet(server.url, repo, tmp_path) as fleet, \
            httpx.Client(timeout=CLIENT_TIMEOUT_S) as http:
        gateway = fleet.gateway()
        for worker_id in ("w1", "w2"):
            fleet.worker(worker_id, "--claim-idle-s", "3", "--claim-interval-s", "0.5")
        fleet.wait_model_ready(gateway, MODEL)

        outcomes: dict[int, Outcome] = {}
        share = REQUESTS // CLIENTS + 1
        with ThreadPoolExecutor(CLIENTS) as pool:
            for start in range(0, REQUESTS, share):
                pool.submit(send_all, gateway, range(start, min(start + share, REQUESTS)), outcomes)
            wait_for(lambda: len(outcomes) >= REQUESTS // 4, 120, "a quarter of the load answered", gateway)
            jobs = submit_jobs(http, gateway, 10_000, JOBS // 2)
            server.crash()
            time.sleep(1.0)
            server.restart()
            restarted = time.monotonic()
            jobs |= submit_jobs(http, gateway, 20_000, JOBS - JOBS // 2)
        assert len(outcomes) == REQUESTS
        bad = {v: o for v, o in outcomes.items() if not o.ok}
        kinds = Counter((o.status, o.detail[:60]) for o in bad.values())
        assert not bad, f"{len(bad)} wrong or unclear answers: {kinds.most_common(5)}\n{fleet.describe()}"
        late = max(o.at for o in outcomes.values()) - restarted
        assert late <= ANSWERED_WITHIN_S, f"the last answer came {late:.1f} s after the restart"
        answered = sum(o.status == 200 for o in outcomes.values())
        assert answered >= REQUESTS // 2, f"only {answered} answered; most requests should survive"

        statuses: dict[str, str] = {}

        def all_final() -> bool:
            statuses.update({job_id: job_status(http, gateway, job_id) for job_id in jobs
                             if statuses.get(job_id) not in FINAL})
            return all(status in FINAL for status in statuses.values())

        wait_for(all_final, JOBS_FINAL_WITHIN_S - (time.monotonic() - restarted), "every accepted job final",
                 gateway, interval_s=0.5)
        assert len(jobs) >= JOBS // 2

        replies = fleet.reply_streams()
        assert replies
        wait_for(lambda: all(int(fleet.redis.xlen(stream)) <= 1 for stream in replies), 15,
                 f"reply streams {replies} trimmed", gateway)
