"""Triton's rate limiter in ``ferry serve``: two models whose instances each need 3 of a
resource with 4 available never compute at once, as their own execution timeline shows,
and the one of priority 1 runs about twice as often as the one of priority 2."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import tritonclient.http as httpclient

from tests.models import write_python_model
from tests.servers import ferry_serve

TIMED = """
import os
import time

import numpy as np

RECORD = {record!r}


class Model:
    def infer(self, inputs):
        start = time.time()
        time.sleep(0.03)
        line = "{name} %.6f %.6f\\n" % (start, time.time())
        fd = os.open(RECORD, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, line.encode())
        finally:
            os.close(fd)
        return {{"Y": inputs["X"]}}
"""
CONFIG = """
name: "{name}"
backend: "python"
max_batch_size: 0
input [ {{ name: "X" data_type: TYPE_FP32 dims: [ 1 ] }} ]
output [ {{ name: "Y" data_type: TYPE_FP32 dims: [ 1 ] }} ]
instance_group [ {{ count: 2 kind: KIND_CPU
  rate_limiter {{ resources [ {{ name: "R" count: 3 }} ] priority: {priority} }} }} ]
parameters [ {{ key: "FERRY_INSTANCE_PROCESS" value: {{ string_value: "no" }} }} ]
"""
REQUESTS = 24  # per model


def ask(url: str, model: str) -> None:
    with httpclient.InferenceServerClient(url, network_timeout=120.0) as client:
        tensor = httpclient.InferInput("X", [1], "FP32")
        tensor.set_data_from_numpy(np.ones(1, dtype=np.float32))
        client.infer(model, [tensor])


def test_instances_sharing_a_resource_take_turns_by_priority(tmp_path: Path) -> None:
    repo, record = tmp_path / "repo", tmp_path / "timeline.txt"
    for name, priority in (("first", 1), ("second", 2)):
        write_python_model(repo, name, TIMED.format(record=str(record), name=name),
                           CONFIG.format(name=name, priority=priority))
    with ferry_serve(repo, "--rate-limit", "execution_count", "--rate-limit-resource", "R:4") as url:
        with ThreadPoolExecutor(16) as pool:
            list(pool.map(lambda model: ask(url, model), ["first", "second"] * REQUESTS))
    runs = sorted((float(start), float(end), name) for name, start, end in
                  (line.split() for line in record.read_text().splitlines()))
    assert len(runs) == 2 * REQUESTS
    for (_, end, name), (start, _, other) in zip(runs, runs[1:]):
        assert start >= end, f"{name} and {other} computed at once"  # 3 + 3 > 4: one at a time, whichever model
    # While both models have requests waiting, priority 1 gets two turns for each of priority 2's.
    contended = [name for _, _, name in runs[:18]]
    assert 10 <= contended.count("first") <= 14, contended


def test_without_the_rate_limiter_the_instances_overlap(tmp_path: Path) -> None:
    repo, record = tmp_path / "repo", tmp_path / "timeline.txt"
    for name in ("first", "second"):
        write_python_model(repo, name, TIMED.format(record=str(record), name=name),
                           CONFIG.format(name=name, priority=1))
    with ferry_serve(repo) as url:
        with ThreadPoolExecutor(16) as pool:
            list(pool.map(lambda model: ask(url, model), ["first", "second"] * 8))
    runs = sorted((float(start), float(end)) for _, start, end in
                  (line.split() for line in record.read_text().splitlines()))
    assert any(start < end for (_, end), (start, _) in zip(runs, runs[1:]))  # the check above can fail
