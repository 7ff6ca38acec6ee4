"""Triton's queue policy across a real fleet: ``max_queue_size`` refuses with
503 and ``Retry-After``, a request whose timeout runs out while queued is
never computed, and a higher priority level overtakes a lower one.

Every model here is one python ``recorder``: ``Y = 2 * X``, one row per
batch, one instance, and it appends what it computes to a log file (named in
its config parameters) so a test can see what the model saw and in which
order. A negative input value marks a "blocker" that sleeps ``block_s``,
long enough to hold the only instance while a test queues requests behind it.
"""

from __future__ import annotations

import json
import threading
import time
import urllib.error
import urllib.request
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from broker import channels
from tests.fleet.processes import Fleet, Gateway, wait_for
from tests.models import write_python_model
from tests.redis_server import flushdb

RECORDER = """
import json
import time


class Model:
    def load(self, context):
        self.log_path = context.parameters["log_path"]
        self.sleep_s = float(context.parameters["sleep_s"])
        self.block_s = float(context.parameters["block_s"])

    def infer(self, inputs):
        values = [float(v) for v in inputs["X"][:, 0]]
        self._log("start", values)
        time.sleep(self.block_s if any(v < 0 for v in values) else self.sleep_s)
        self._log("end", values)
        return {"Y": inputs["X"] * 2}

    def _log(self, what, values):
        # One line per row, flushed at once, so the test reads it while we run.
        with open(self.log_path, "a", encoding="utf-8") as log:
            for value in values:
                log.write(json.dumps({"what": what, "value": value, "t": time.monotonic()}) + "\\n")
"""


def recorder_config(name: str, log_path: Path, sleep_s: float, block_s: float, dynamic_batching: str) -> str:
    return f"""
name: "{name}"
backend: "python"
max_batch_size: 1
input [{{ name: "X" data_type: TYPE_FP32 dims: [ 1 ] }}]
output [{{ name: "Y" data_type: TYPE_FP32 dims: [ 1 ] }}]
dynamic_batching {{ {dynamic_batching} }}
instance_group [ {{ count: 1 kind: KIND_CPU }} ]
parameters [
  {{ key: "log_path" value: {{ string_value: "{log_path}" }} }},
  {{ key: "sleep_s" value: {{ string_value: "{sleep_s}" }} }},
  {{ key: "block_s" value: {{ string_value: "{block_s}" }} }}
]
"""


def write_recorder(repo: Path, name: str, log_path: Path, dynamic_batching: str,
                   sleep_s: float = 0.0, block_s: float = 1.0) -> None:
    write_python_model(repo, name, RECORDER, recorder_config(name, log_path, sleep_s, block_s, dynamic_batching))


@dataclass(frozen=True, slots=True)
class Seen:
    what: str  # "start" or "end"
    value: float
    t: float  # time.monotonic() in the model's process; the same clock as ours on Linux


def seen(log_path: Path) -> list[Seen]:
    if not log_path.exists():
        return []
    lines = log_path.read_text(encoding="utf-8").splitlines()
    return [Seen(**json.loads(line)) for line in lines if line.endswith("}")]


def started(log_path: Path) -> list[float]:
    """The values the model began computing, in order."""
    return [entry.value for entry in seen(log_path) if entry.what == "start"]


# --- clients ----------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Answer:
    status: int
    headers: dict[str, str]
    body: dict[str, Any]
    sent: float
    received: float


def post_infer(gateway: Gateway, model: str, value: float, parameters: dict[str, Any] | None = None,
               timeout_s: float = 60.0) -> Answer:
    """A JSON V2 infer through urllib, keeping the status and headers tritonclient hides."""
    header: dict[str, Any] = {"inputs": [{"name": "X", "shape": [1, 1], "datatype": "FP32", "data": [value]}]}
    if parameters:
        header["parameters"] = parameters
    request = urllib.request.Request(
        f"http://{gateway.url}/v2/models/{model}/infer", data=json.dumps(header).encode(),
        headers={"Content-Type": "application/json"}, method="POST",
    )
    sent = time.monotonic()
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as response:
            status, headers, raw = int(response.status), dict(response.headers), response.read()
    except urllib.error.HTTPError as exc:
        status, headers, raw = int(exc.code), dict(exc.headers), exc.read()
    return Answer(status, {k.lower(): v for k, v in headers.items()}, json.loads(raw or b"{}"), sent,
                  time.monotonic())


def output_value(answer: Answer) -> float:
    (output,) = answer.body["outputs"]
    assert output["name"] == "Y" and output["shape"] == [1, 1], answer.body
    return float(output["data"][0])


def triton_infer(gateway: Gateway, model: str, value: float, **options: Any) -> float:
    """One request through the official client; ``options`` go to ``infer`` (priority, timeout)."""
    tensor = httpclient.InferInput("X", [1, 1], "FP32")
    tensor.set_data_from_numpy(np.full((1, 1), value, dtype=np.float32))
    client = httpclient.InferenceServerClient(gateway.url, network_timeout=60.0)
    try:
        result = client.infer(model, [tensor], **options)
        return float(result.as_numpy("Y")[0, 0])
    finally:
        client.close()


def triton_error(gateway: Gateway, model: str, value: float, **options: Any) -> InferenceServerException:
    with pytest.raises(InferenceServerException) as caught:
        triton_infer(gateway, model, value, **options)
    return caught.value


def start_fleet(fleet: Fleet, model: str) -> Gateway:
    gateway = fleet.gateway()
    fleet.worker("w1")
    fleet.wait_model_ready(gateway, model)
    return gateway


def wait_started(log_path: Path, value: float) -> None:
    wait_for(lambda: value in started(log_path), 30.0, f"the model to start computing {value}")


def queue_depth(fleet: Fleet, model: str) -> int:
    """A model's queue on Redis: undelivered plus delivered and not acked."""
    stream, group = channels.request_channel(model), channels.worker_group(model)
    if not fleet.redis.exists(stream):
        return 0
    for info in fleet.redis.xinfo_groups(stream):
        if info["name"].decode() == group:
            return int(info["lag"] or 0) + int(info["pending"])
    return int(fleet.redis.xlen(stream))


# --- max_queue_size ---------------------------------------------------------

QUEUE_SIZE = 4
BURST = 20
SERVICE_S = 0.4
# The gateway samples the broker every 50 ms and counts what it admits in
# between; a sample can miss publishes still on their way to Redis.
ADMISSION_SLACK = 2


class DepthProbe:
    """Samples a model's queue on Redis (undelivered + delivered unacked) as
    fast as it can, from a thread of its own, and keeps the highest value."""

    def __init__(self, fleet: Fleet, model: str) -> None:
        self._fleet = fleet
        self._model = model
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self.highest = 0
        self.samples = 0

    def __enter__(self) -> DepthProbe:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.highest = max(self.highest, queue_depth(self._fleet, self._model))
            self.samples += 1
            time.sleep(0.002)


def test_a_full_queue_answers_503_with_retry_after_and_admits_no_more_than_its_size(
    fleet_redis_url: str, tmp_path: Path
):
    repo, log_path = tmp_path / "repo", tmp_path / "bounded.jsonl"
    write_recorder(repo, "bounded", log_path, f"default_queue_policy {{ max_queue_size: {QUEUE_SIZE} }}",
                   sleep_s=SERVICE_S)
    with ThreadPoolExecutor(BURST) as clients, Fleet(fleet_redis_url, repo, tmp_path) as fleet:
        gateway = start_fleet(fleet, "bounded")
        go = threading.Barrier(BURST)

        def burst_one(value: int) -> Answer:
            go.wait()
            return post_infer(gateway, "bounded", float(value))

        start = time.monotonic()
        with DepthProbe(fleet, "bounded") as probe:
            calls = [clients.submit(burst_one, i) for i in range(BURST)]
            answers = [call.result(timeout=60) for call in calls]

        admitted = {i: a for i, a in enumerate(answers) if a.status == 200}
        refused = {i: a for i, a in enumerate(answers) if a.status != 200}
        assert refused, f"no request of {BURST} was refused\n{fleet.describe()}"
        for answer in refused.values():
            assert answer.status == 503, answer
            assert answer.headers.get("retry-after", "").isdigit(), answer.headers
            assert int(answer.headers["retry-after"]) >= 1, answer.headers
            message = answer.body["error"]
            assert "'bounded'" in message and "queue" in message and "full" in message, message
        for value, answer in admitted.items():
            assert output_value(answer) == 2.0 * value, answer.body

        # The queue drains one request per SERVICE_S, so each decision taken
        # after a completion may admit one more; count those against the size.
        last_refusal = max(answer.received for answer in refused.values())
        completed = sum(1 for entry in seen(log_path) if entry.what == "end" and entry.t < last_refusal)
        assert len(admitted) <= QUEUE_SIZE + ADMISSION_SLACK + completed, (
            f"{len(admitted)} admitted, {completed} completed while refusing, "
            f"{last_refusal - start:.2f} s\n{fleet.describe()}")
        assert len(admitted) >= min(QUEUE_SIZE, BURST), f"only {len(admitted)} admitted"
        assert probe.samples > 0 and probe.highest <= QUEUE_SIZE + ADMISSION_SLACK, (
            f"Redis held {probe.highest} requests of 'bounded' at once")
        assert sorted(started(log_path)) == sorted(float(v) for v in admitted), "the model saw a refused request"

        # The load has passed and the queue has drained: room again.
        wait_for(lambda: queue_depth(fleet, "bounded") == 0, 10.0, "the queue to drain")
        assert triton_infer(gateway, "bounded", 7.0) == 14.0
        assert fleet.dead_letters() == 0


# --- timeouts ---------------------------------------------------------------

BLOCK_S = 1.0
TIMEOUT_US = 300_000


def test_a_request_whose_timeout_runs_out_in_the_queue_gets_504_and_is_never_computed(
    redis_url: str, tmp_path: Path
):
    flushdb(redis_url)
    repo, log_path = tmp_path / "repo", tmp_path / "timed.jsonl"
    write_recorder(repo, "timed", log_path, "", block_s=BLOCK_S)
    with ThreadPoolExecutor(4) as clients, Fleet(redis_url, repo, tmp_path) as fleet:
        gateway = start_fleet(fleet, "timed")
        blocker = clients.submit(triton_infer, gateway, "timed", -1.0)
        wait_started(log_path, -1.0)
        # The worker takes 2 requests (prefetch x capacity 1): the first late
        # one waits in its batch queue, the second on Redis.
        late: list[Future[InferenceServerException]] = [
            clients.submit(triton_error, gateway, "timed", value, timeout=TIMEOUT_US) for value in (11.0, 12.0)
        ]
        for call in late:
            error = call.result(timeout=30)
            assert error.status() == "504", f"{error}\n{fleet.describe()}"
            assert "timed out" in error.message(), error
        assert blocker.result(timeout=30) == -2.0
        # A timeout that does not run out is no obstacle.
        assert triton_infer(gateway, "timed", 13.0, timeout=30_000_000) == 26.0
        assert started(log_path) == [-1.0, 13.0], "the model computed an expired request"


def test_the_models_default_timeout_applies_when_the_request_has_none(redis_url: str, tmp_path: Path):
    flushdb(redis_url)
    repo, log_path = tmp_path / "repo", tmp_path / "defaulted.jsonl"
    write_recorder(repo, "defaulted", log_path,
                   f"default_queue_policy {{ default_timeout_microseconds: {TIMEOUT_US} }}", block_s=BLOCK_S)
    with ThreadPoolExecutor(4) as clients, Fleet(redis_url, repo, tmp_path) as fleet:
        gateway = start_fleet(fleet, "defaulted")
        blocker = clients.submit(triton_infer, gateway, "defaulted", -1.0)
        wait_started(log_path, -1.0)
        late = [clients.submit(post_infer, gateway, "defaulted", value) for value in (21.0, 22.0)]
        for call in late:
            answer = call.result(timeout=30)
            assert answer.status == 504, f"{answer}\n{fleet.describe()}"
            assert "timed out" in answer.body["error"], answer.body
        # The blocker's own default deadline passed while it ran: only queue time counts.
        assert blocker.result(timeout=30) == -2.0
        assert triton_infer(gateway, "defaulted", 23.0) == 46.0
        assert started(log_path) == [-1.0, 23.0], "the model computed an expired request"


# --- priority levels --------------------------------------------------------

LEVELS = 2
EACH = 4
PRIORITY_SERVICE_S = 0.15
# Long enough to queue 2 x EACH requests behind it on a busy 2-core machine.
PRIORITY_BLOCK_S = 2.0
# What a worker holds of one model: prefetch (2) rounds of capacity (1 row x 1 instance).
WORKER_HOLDS = 2


def test_a_higher_priority_level_is_computed_before_a_lower_one_queued_earlier(
    fleet_redis_url: str, tmp_path: Path
):
    repo, log_path = tmp_path / "repo", tmp_path / "ranked.jsonl"
    write_recorder(repo, "ranked", log_path, f"priority_levels: {LEVELS} default_priority_level: 2",
                   sleep_s=PRIORITY_SERVICE_S, block_s=PRIORITY_BLOCK_S)
    high_stream, low_stream = (channels.request_channel("ranked", level=level) for level in (1, 2))
    with ThreadPoolExecutor(2 * EACH + 1) as clients, Fleet(fleet_redis_url, repo, tmp_path) as fleet:
        gateway = start_fleet(fleet, "ranked")
        # No priority: the default level, 2.
        blocker = clients.submit(triton_infer, gateway, "ranked", -1.0)
        wait_started(log_path, -1.0)
        lows = [100.0 + i for i in range(EACH)]
        highs = [200.0 + i for i in range(EACH)]
        low_calls = [clients.submit(triton_infer, gateway, "ranked", v, priority=2) for v in lows]
        wait_for(lambda: fleet.entries_added(low_stream) == 1 + EACH, 10.0, "the low requests on Redis")
        high_calls = [clients.submit(triton_infer, gateway, "ranked", v, priority=1) for v in highs]
        wait_for(lambda: fleet.entries_added(high_stream) == EACH, 10.0, "the high requests on Redis")
        assert started(log_path) == [-1.0] and "end" not in {e.what for e in seen(log_path)}, (
            "the blocker finished before the test queued everything behind it")

        assert blocker.result(timeout=30) == -2.0
        for value, call in zip(lows + highs, low_calls + high_calls):
            assert call.result(timeout=30) == 2.0 * value

        order = started(log_path)[1:]
        assert sorted(order) == sorted(lows + highs), order
        position = {value: index for index, value in enumerate(order)}
        last_high = max(position[v] for v in highs)
        lows_first = [v for v in lows if position[v] < last_high]
        # Only what the worker had already taken when the highs came can go first.
        assert len(lows_first) <= WORKER_HOLDS - 1, f"order {order}"
        assert np.mean([position[v] for v in highs]) < np.mean([position[v] for v in lows]), f"order {order}"
        assert fleet.entries_added(high_stream) == EACH and fleet.entries_added(low_stream) == 1 + EACH
        assert not fleet.redis.exists(channels.request_channel("ranked")), "a request went to the unleveled stream"


def test_a_priority_outside_the_models_levels_is_refused_with_400(redis_url: str, tmp_path: Path):
    flushdb(redis_url)
    repo, log_path = tmp_path / "repo", tmp_path / "ranked.jsonl"
    write_recorder(repo, "ranked", log_path, f"priority_levels: {LEVELS} default_priority_level: 2")
    with Fleet(redis_url, repo, tmp_path) as fleet:
        gateway = start_fleet(fleet, "ranked")
        for priority in (LEVELS + 1, -1, "high"):
            # A level no worker reads would leave the request waiting: fail fast instead.
            answer = post_infer(gateway, "ranked", 1.0, {"priority": priority}, timeout_s=5.0)
            assert answer.status == 400, answer
            assert "priority" in answer.body["error"], answer.body
        error = triton_error(gateway, "ranked", 1.0, priority=LEVELS + 1)
        assert error.status() == "400", error
        assert triton_infer(gateway, "ranked", 2.0, priority=LEVELS) == 4.0
        assert started(log_path) == [2.0], "the model computed a refused request"
        assert fleet.entries_added(channels.request_channel("ranked", level=2)) == 1
        assert fleet.entries_added(channels.request_channel("ranked", level=1)) == 0
