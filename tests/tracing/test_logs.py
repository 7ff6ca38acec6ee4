"""Log lines: JSON from every logger, and a request's ids on each line about it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.fleet.processes import Fleet, FerryProcess, Gateway, wait_for
from tests.models import poison_error, write_add_sub, write_recording_model
from tests.redis_server import flushdb

REPO_ROOT = Path(__file__).resolve().parents[2]
POISONED = "poisoned"
POISON = 13


def failed_lines(worker: FerryProcess, model: str) -> list[dict[str, Any]]:
    return [event for event in worker.log_events()
            if event.get("event") == "worker.request_failed" and event.get("model") == model]


def infer_error(gateway: Gateway, model: str, tensors: list[httpclient.InferInput]) -> str:
    client = httpclient.InferenceServerClient(gateway.url, network_timeout=30.0)
    try:
        with pytest.raises(InferenceServerException) as raised:
            client.infer(model, tensors)
        return str(raised.value)
    finally:
        client.close()


def test_a_failed_requests_lines_carry_its_ids_and_its_batch(redis_url: str, tmp_path: Path) -> None:
    flushdb(redis_url)
    repo = tmp_path / "repo"
    write_add_sub(repo)
    write_recording_model(repo, POISONED, tmp_path / "record.txt", poison=POISON)
    with Fleet(redis_url, repo, tmp_path) as fleet:
        worker = fleet.worker("w-logs", "--metrics-port", "0", "--no-retry-failures")
        gateway = fleet.gateway()
        fleet.wait_model_ready(gateway, POISONED)

        bad_shape = [httpclient.InferInput("INPUT0", [1, 8], "FP32"), httpclient.InferInput("INPUT1", [1, 8], "FP32")]
        for tensor in bad_shape:
            tensor.set_data_from_numpy(np.zeros((1, 8), dtype=np.float32))
        assert "INPUT0" in infer_error(gateway, "add_sub", bad_shape)
        poisoned = httpclient.InferInput("INPUT0", [1], "INT32")
        poisoned.set_data_from_numpy(np.array([POISON], dtype=np.int32))
        assert poison_error(POISON) in infer_error(gateway, POISONED, [poisoned])

        wait_for(lambda: bool(failed_lines(worker, POISONED)), 10.0, "the poisoned request's log line", worker)
        [refused] = failed_lines(worker, "add_sub")
        # Refused before batching: no batch to name.
        assert refused["worker_id"] == "w-logs" and len(refused["request_id"]) == 32, refused
        assert refused["code"] == "invalid_argument" and "batch_id" not in refused, refused
        [raised] = failed_lines(worker, POISONED)
        assert raised["worker_id"] == "w-logs" and len(raised["request_id"]) == 32, raised
        assert raised["batch_id"], raised
        assert raised["request_id"] != refused["request_id"]
        for process in fleet.processes:
            assert all("raw" not in event for event in process.log_events()), process.describe()


def test_standard_library_loggers_write_json_lines_with_the_bound_ids() -> None:
    script = (
        "import logging, warnings, structlog\n"
        "from gateway.logs import configure_logging\n"
        "configure_logging('info', 'json')\n"
        "structlog.contextvars.bind_contextvars(request_id='r-1')\n"
        "logging.getLogger('kafka.conn').warning('broker %s unreachable', 'b1')\n"
        "logging.getLogger('kafka.conn').info('connecting')  # below the floor: not written\n"
        "try:\n"
        "    1 / 0\n"
        "except ZeroDivisionError:\n"
        "    logging.getLogger('asyncio').exception('task failed')\n"
        "warnings.warn('careful')\n"
        "structlog.get_logger('ferry.test').info('ours', model='m')\n"
    )
    lines = [json.loads(line) for line in stderr_lines(script)]  # each line must be JSON
    assert [(line["event"].strip(), line["level"]) for line in lines] == [
        ("broker b1 unreachable", "warning"), ("task failed", "error"),
        (lines[2]["event"].strip(), "warning"), ("ours", "info")], lines
    assert lines[0]["logger"] == "kafka.conn" and lines[0]["request_id"] == "r-1" and "timestamp" in lines[0]
    assert "ZeroDivisionError" in lines[1]["exception"] and lines[2]["logger"] == "py.warnings"
    assert "careful" in lines[2]["event"] and lines[3]["model"] == "m" and lines[3]["request_id"] == "r-1"


def test_log_settings_change_the_lines_a_process_writes() -> None:
    script = (
        "import structlog\n"
        "from gateway.logs import PROCESS_LOGS, configure_logging\n"
        "configure_logging('info', 'json')\n"
        "log = structlog.get_logger('ferry.test')\n"
        "log.info('one'); log.debug('hidden')\n"
        "PROCESS_LOGS.update({'log_info': False, 'log_verbose_level': 1})\n"
        "log.info('hidden'); log.debug('two'); log.warning('three')\n"
        "PROCESS_LOGS.update({'log_warning': False, 'log_format': 'console'})\n"
        "log.warning('hidden'); log.error('four')\n"
    )
    lines = stderr_lines(script)
    assert [json.loads(line)["event"] for line in lines[:3]] == ["one", "two", "three"]
    assert len(lines) == 4 and "four" in lines[3] and not lines[3].startswith("{"), lines


def stderr_lines(script: str) -> list[str]:
    """What a Python process running ``script`` writes to stderr, line by line."""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60, cwd=REPO_ROOT)
    assert done.returncode == 0, done.stderr
    return done.stderr.splitlines()
