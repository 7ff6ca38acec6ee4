"""Dead letters in a real ``ferry serve`` (the embedded broker): ten-megabyte
requests given up on keep only a bounded slice each, so the server's memory
stays flat, and ``/metrics`` says what was dropped.

The requests are given up on because their model refuses every one: with
``--retry-failures`` and ``--max-deliveries 1`` the first failure sends the
request to the dead-letter channel (whole, before the bound, which kept 10 MB
a request). The model runs in an instance process of its own, so the
exception that refuses a request holds none of its tensors in the server.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import httpx
import orjson
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.models import generator, write_python_model
from tests.servers import ferry_serve

MIB = 1 << 20
REQUEST_BYTES = 10 * MIB
WARM_UP = 3
MEASURED = 10
REFUSING_MODEL = """
class Model:
    def infer(self, inputs):
        raise RuntimeError("this model refuses every request")
"""
# Whole letters would add REQUEST_BYTES each (100 MiB); bounded ones add nothing that lasts.
MAX_GROWTH = MEASURED * REQUEST_BYTES // 2
MAX_COUNT, MAX_BYTES = 4, MIB

GIVING_UP = ("--retry-failures", "--max-deliveries", "1")
BOUNDED = ("--dead-letter-max-count", str(MAX_COUNT), "--dead-letter-max-bytes", str(MAX_BYTES))


@pytest.fixture(scope="module")
def repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    repo = tmp_path_factory.mktemp("repo")
    gen = generator()
    config = gen.model_config("refuse", 'backend: "python"', 0, [gen.tensor_config("X", "TYPE_FP32", (-1,))],
                              [gen.tensor_config("Y", "TYPE_FP32", (1,))], gen.cpu_instances(1))
    write_python_model(repo, "refuse", REFUSING_MODEL, config)
    return repo


def serving_pid(url: str) -> int:
    """The ``ferry serve`` this test process started on ``url``."""
    port = url.rsplit(":", 1)[1].encode()
    for entry in Path("/proc").iterdir():
        try:
            words = (entry / "cmdline").read_bytes().split(b"\0")
            parent = next(line for line in (entry / "status").read_text().splitlines() if line.startswith("PPid:"))
        except (OSError, ValueError, StopIteration):
            continue
        if int(parent.split()[1]) == os.getpid() and b"serve" in words and port in words:
            return int(entry.name)
    raise LookupError(f"no ferry serve child on port {port.decode()}")


def scrape(http: httpx.Client) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    text = http.get("/metrics").text
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise LookupError(f"no VmRSS for process {pid}")


def give_up_on_large(http: httpx.Client) -> None:
    """A 10 MiB request the worker gives up on."""
    elements = REQUEST_BYTES // 4
    header = orjson.dumps({"inputs": [{"name": "X", "shape": [elements], "datatype": "FP32",
                                       "parameters": {"binary_data_size": REQUEST_BYTES}}]})
    answer = http.post("/v2/models/refuse/infer", content=header + os.urandom(REQUEST_BYTES),
                       headers={"Inference-Header-Content-Length": str(len(header)),
                                "Content-Type": "application/octet-stream"})
    error = answer.json()["error"]
    assert answer.status_code == 500 and "refuses every request" in error and "dead-letter channel" in error, error


def test_large_requests_given_up_on_leave_memory_flat_and_are_counted(repository: Path):
    with ferry_serve(repository, *GIVING_UP, *BOUNDED) as url, \
            httpx.Client(base_url=f"http://{url}", timeout=60) as http:
        pid = serving_pid(url)
        for _ in range(WARM_UP):
            give_up_on_large(http)
        before = rss_bytes(pid)
        for _ in range(MEASURED):
            give_up_on_large(http)
        growth = rss_bytes(pid) - before
        samples = scrape(http)
    assert growth < MAX_GROWTH, f"RSS grew {growth / MIB:.0f} MiB over {MEASURED} dead-lettered 10 MiB requests"
    sent = WARM_UP + MEASURED
    assert samples[("ferry_deadletter_written_total", ())] == sent
    assert samples[("ferry_deadletter_dropped_total", (("reason", "evicted"),))] == sent - MAX_COUNT
    assert samples[("ferry_deadletter_dropped_total", (("reason", "truncated"),))] == sent
    assert samples[("ferry_deadletter_dropped_bytes_total", ())] > sent * (REQUEST_BYTES - MAX_BYTES // MAX_COUNT)


@pytest.mark.parametrize(("flags", "fault"), [
    (("--dead-letter-max-count", "0"), "count bound must be at least 1"),
    (("--dead-letter-max-bytes", "4096"), "leaves 4 bytes for each of 1024 letters"),
])
def test_dead_letter_bounds_that_cannot_hold_a_letter_stop_ferry_at_start(repository: Path, flags, fault):
    done = subprocess.run([sys.executable, "-m", "ferry.cli.main", "serve", "--model-repository", str(repository), *flags],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode != 0
    assert "--dead-letter-max-count / --dead-letter-max-bytes" in done.stderr and fault in done.stderr
