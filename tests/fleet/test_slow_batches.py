"""A batch slower than ``--claim-idle-s`` over Redis is computed once, by the worker that has it:
the worker renews what it computes (its delivery count kept), so neither it nor a second worker
claims it while it lives; once it is killed, the second worker takes the request over as a second
delivery, not as one past ``--max-deliveries``."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

from tests.fleet.processes import Fleet, FerryProcess, wait_for
from tests.models import infer_slow_model, write_slow_model
from tests.redis_server import flushdb

SLOW_S = 7.0  # seven times the claim threshold below, more than --max-deliveries of them
WORKER = ("--claim-idle-s", "1", "--claim-interval-s", "0.2", "--max-deliveries", "5")
CLAIMS = ("worker.claimed", "worker.claimed_in_hand")


def claims(process: FerryProcess) -> list[dict[str, object]]:
    return [event for event in process.log_events() if event.get("event") in CLAIMS]


def test_a_batch_slower_than_the_claim_threshold_is_computed_once_while_its_worker_lives(
        redis_url: str, tmp_path: Path):
    flushdb(redis_url)
    write_slow_model(tmp_path / "repo", "slow", SLOW_S)
    x = np.arange(4, dtype=np.float32)
    with ThreadPoolExecutor(2) as clients, Fleet(redis_url, tmp_path / "repo", tmp_path) as fleet:
        gateway = fleet.gateway()
        first = fleet.worker("w1", *WORKER)
        fleet.wait_model_ready(gateway, "slow")
        answer = clients.submit(infer_slow_model, gateway.url, "slow", x)
        wait_for(lambda: fleet.pending("slow", "w1") == 1, 30, "w1 to take the request", first)
        second = fleet.worker("w2", *WORKER)
        np.testing.assert_array_equal(answer.result(timeout=60), 2 * x)
        assert claims(first) == [] and claims(second) == [], fleet.describe()

        # Killed five thresholds into its batch, the holder renews nothing more: the other worker
        # takes the request over as its second delivery and answers it (it is not dead-lettered).
        answer = clients.submit(infer_slow_model, gateway.url, "slow", x + 1)
        wait_for(lambda: fleet.pending("slow") == 1, 30, "a worker to take the request", gateway)
        time.sleep(5.0)
        holder, other = (first, second) if fleet.pending("slow", "w1") else (second, first)
        holder.kill()
        np.testing.assert_array_equal(answer.result(timeout=60), 2 * (x + 1))
        assert [event["event"] for event in claims(other)] == ["worker.claimed"], fleet.describe()
        assert fleet.dead_letters() == 0
        assert gateway.errors() == [] and other.errors() == [], fleet.describe()
