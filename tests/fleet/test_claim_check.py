"""Claim-check tensors on a Redis fleet: a 4 MB tensor travels beside the
request and reply, as a key of its own, and no key outlives its request."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import numpy as np
import pytest
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from broker import channels
from broker.transports.redis import PAYLOAD_FIELD
from tests.fleet.processes import Fleet, wait_for
from tests.models import infer_slow_model, write_slow_model
from tests.redis_server import flushdb

ELEMENTS = 1 << 20  # FP32: 4 MiB, eight times the default 512 KiB threshold


def infer(url: str, x: np.ndarray) -> np.ndarray:
    return infer_slow_model(url, "big", x)


def claim_keys(fleet: Fleet) -> list[bytes]:
    return list(fleet.redis.scan_iter("ferry.claim.*"))


def test_a_4mb_tensor_round_trips_and_its_bytes_are_gone_after_the_reply(redis_url: str, tmp_path: Path):
    flushdb(redis_url)
    write_slow_model(tmp_path / "repo", "big", 1.0, dims=(ELEMENTS,))
    x = np.random.default_rng(7).standard_normal(ELEMENTS).astype(np.float32)
    with ThreadPoolExecutor(1) as client, Fleet(redis_url, tmp_path / "repo", tmp_path) as fleet:
        gateway, worker = fleet.gateway(), fleet.worker("w1")
        fleet.wait_model_ready(gateway, "big")
        answer = client.submit(infer, gateway.url, x)
        # While the model sleeps, the input waits in a key of its own, not in the request stream.
        wait_for(lambda: fleet.pending("big", "w1") == 1, 30, "w1 to take the request", worker)
        assert len(claim_keys(fleet)) == 1
        entries = fleet.redis.xrange(channels.request_channel("big"))
        assert entries and all(len(entry[PAYLOAD_FIELD]) < 4096 for _, entry in entries)
        np.testing.assert_array_equal(answer.result(timeout=120), 2 * x)
        # The output crossed as a claim too (GETDEL by the gateway), and the worker deleted the input once acked.
        wait_for(lambda: claim_keys(fleet) == [], 10, "no claim key left", worker)
        assert fleet.dead_letters() == 0
        assert worker.errors() == [] and gateway.errors() == [], fleet.describe()


def test_a_worker_killed_mid_request_leaves_its_bytes_to_expire_and_the_client_a_clear_error(
        redis_url: str, tmp_path: Path):
    flushdb(redis_url)
    write_slow_model(tmp_path / "repo", "big", 60.0, dims=(ELEMENTS,))
    x = np.ones(ELEMENTS, np.float32)
    with ThreadPoolExecutor(1) as client, Fleet(redis_url, tmp_path / "repo", tmp_path) as fleet:
        gateway = fleet.gateway("--claim-check-ttl-s", "3")
        first = fleet.worker("w1", "--claim-idle-s", "1")
        fleet.wait_model_ready(gateway, "big")
        answer = client.submit(infer, gateway.url, x)
        wait_for(lambda: fleet.pending("big", "w1") == 1, 30, "w1 to take the request", first)
        first.kill()
        assert len(claim_keys(fleet)) == 1
        wait_for(lambda: claim_keys(fleet) == [], 10, "the claim key to expire", gateway)
        # The next worker takes the request over, finds its bytes gone, and says so.
        fleet.worker("w2", "--claim-idle-s", "1")
        with pytest.raises(InferenceServerException, match="'X': its claim-checked bytes cannot be read") as caught:
            answer.result(timeout=60)
        assert caught.value.status() == "503"
        wait_for(lambda: fleet.pending("big") == 0, 10, "the request to be acked", gateway)


def test_a_worker_with_claims_off_still_reads_a_claimed_request_it_cannot_redeem_as_an_error(
        redis_url: str, tmp_path: Path):
    """A worker started with ``--claim-check-store none`` beside a gateway that claim-checks:
    the request is answered with an error naming the flag, not left to hang."""
    flushdb(redis_url)
    write_slow_model(tmp_path / "repo", "big", 0.0, dims=(ELEMENTS,))
    with Fleet(redis_url, tmp_path / "repo", tmp_path) as fleet:
        gateway, _ = fleet.gateway(), fleet.worker("w1", "--claim-check-store", "none")
        fleet.wait_model_ready(gateway, "big")
        with pytest.raises(InferenceServerException, match="claim-checked.*--claim-check-store"):
            infer(gateway.url, np.ones(ELEMENTS, np.float32))
        wait_for(lambda: fleet.pending("big") == 0, 10, "the request to be acked", gateway)


def test_a_job_with_a_4mb_input_finishes_with_its_result_kept_whole(redis_url: str, tmp_path: Path):
    """A job's input is claim-checked; its result is not (the job store keeps it past any claim's TTL)."""
    flushdb(redis_url)
    write_slow_model(tmp_path / "repo", "big", 0.0, dims=(ELEMENTS,))
    x = np.arange(ELEMENTS, dtype=np.float32)
    tensor = httpclient.InferInput("X", [ELEMENTS], "FP32")
    tensor.set_data_from_numpy(x)
    output = httpclient.InferRequestedOutput("Y", binary_data=True)
    body, json_size = httpclient.InferenceServerClient.generate_request_body([tensor], outputs=[output])
    with Fleet(redis_url, tmp_path / "repo", tmp_path) as fleet, httpx.Client(timeout=60) as http:
        gateway, worker = fleet.gateway(), fleet.worker("w1")
        fleet.wait_model_ready(gateway, "big")
        submitted = http.post(f"http://{gateway.url}/v2/models/big/infer", content=body,
                              headers={"Prefer": "respond-async", "Inference-Header-Content-Length": str(json_size)})
        assert submitted.status_code == 202, submitted.text
        job_url = f"http://{gateway.url}/v2/jobs/{submitted.json()['job_id']}"

        def finished() -> bool:
            return "inference-header-content-length" in http.get(job_url).headers

        wait_for(finished, 60, "the job to finish", worker)
        done = http.get(job_url)
        result = httpclient.InferResult.from_response_body(
            done.content, header_length=int(done.headers["inference-header-content-length"]))
        np.testing.assert_array_equal(result.as_numpy("Y"), 2 * x)
        wait_for(lambda: claim_keys(fleet) == [], 10, "no claim key left", worker)


def shm_files(pid: int) -> list[str]:
    """Claim files, arenas and the presence file in /dev/shm that the process ``pid`` wrote or waits for."""
    prefixes = (f"ferry-claim-{pid}.", f"ferry-arena-{pid}.", f"ferry-proc-{pid}.")
    return [path.name for path in Path("/dev/shm").iterdir() if path.name.startswith(prefixes)]


def test_through_dev_shm_a_killed_worker_costs_a_redelivery_and_killed_processes_leave_no_file(
        redis_url: str, tmp_path: Path):
    """``--claim-check-store shm``: the bytes cross in the arenas of the gateway (inputs) and the
    worker (outputs); a SIGKILLed worker's or gateway's arena is swept by the processes left."""
    flushdb(redis_url)
    write_slow_model(tmp_path / "repo", "big", 3.0, dims=(ELEMENTS,))
    x = np.random.default_rng(11).standard_normal(ELEMENTS).astype(np.float32)
    shm = ("--claim-check-store", "shm")
    with ThreadPoolExecutor(1) as client, Fleet(redis_url, tmp_path / "repo", tmp_path) as fleet:
        gateway = fleet.gateway(*shm)
        first = fleet.worker("w1", "--claim-idle-s", "1", *shm)
        fleet.wait_model_ready(gateway, "big")
        np.testing.assert_array_equal(infer(gateway.url, x), 2 * x)
        assert sorted(name.split("-")[1] for name in shm_files(gateway.pid) + shm_files(first.pid)) == \
            ["arena", "arena", "proc", "proc"]

        # A worker SIGKILLed mid-request: the input waits in the gateway's arena for the next worker.
        answer = client.submit(infer, gateway.url, x + 1)
        wait_for(lambda: fleet.pending("big", "w1") == 1, 30, "w1 to take the request", first)
        first.kill()
        second = fleet.worker("w2", "--claim-idle-s", "1", *shm)
        np.testing.assert_array_equal(answer.result(timeout=120), 2 * (x + 1))
        wait_for(lambda: shm_files(first.pid) == [], 10, "the dead worker's arena and presence to be swept", second)

        # A gateway SIGKILLed mid-request: the worker answers into its arena for a reader that is gone,
        # and the next process to open a store sweeps the gateway's arena.
        answer = client.submit(infer, gateway.url, x)
        wait_for(lambda: fleet.pending("big", "w2") == 1, 30, "w2 to take the request", second)
        gateway.kill()
        wait_for(lambda: fleet.pending("big") == 0, 30, "w2 to answer and ack", second)
        fleet.gateway(*shm)
        wait_for(lambda: shm_files(gateway.pid) == [], 30, "the dead gateway's arena and presence to be swept",
                 second)
        with pytest.raises(Exception):
            answer.result(timeout=30)
