"""SIGUSR2 makes a worker log what each of its tasks waits on, and it goes on serving."""

from __future__ import annotations

import signal
from pathlib import Path

from tests.fleet.processes import Fleet, wait_for
from tests.models import write_slow_model
from tests.redis_server import flushdb


def test_sigusr2_logs_each_task_down_to_what_it_waits_on_and_the_worker_serves_on(redis_url: str, tmp_path: Path):
    flushdb(redis_url)
    repo = tmp_path / "repo"
    write_slow_model(repo, "slow", 0.1)
    with Fleet(redis_url, repo, tmp_path) as fleet:
        gateway = fleet.gateway()
        worker = fleet.worker("w1")
        worker.send(signal.SIGUSR2)

        def dumped() -> list[dict]:
            return [event for event in worker.log_events() if event.get("event") == "tasks.task"]

        wait_for(lambda: any(event["task"] == "consume-slow" for event in dumped()), 10, "the task dump", worker)
        consumer = next(event for event in dumped() if event["task"] == "consume-slow")
        # Down the awaits, from the consumer's loop to the broker call it is blocked in.
        assert consumer["awaiting"][0].endswith(" _consume"), consumer
        assert any("broker/transports/redis.py" in frame or "credit.py" in frame
                   for frame in consumer["awaiting"][1:]), consumer
        assert worker.running()
        fleet.wait_model_ready(gateway, "slow")
