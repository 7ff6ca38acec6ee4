"""The worker's queue policy and recovery on the in-memory transport: retries
of failing models, dead letters, deadlines, priority channels, job gating."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from pathlib import Path

import msgpack
import numpy as np
import pytest

from broker import channels
from broker.envelope import Request, WireTensor, decode_request, decode_response, encode_request
from broker.transports.memory import MemoryTransport
from ferry.cli.main import build_parser
from ferry.cli.settings import worker_settings
from gateway.jobs import Job, JobStatus, MemoryJobStore
from gateway.jobs.replies import JobReplyConsumer
from tests.models import write_python_model
from tests.workers.test_worker import next_messages
from workers.recovery import RecoverySettings
from workers.repository.layout import ModelRepository
from workers.worker import Worker, WorkerSettings

REPLIES = "ferry.replies.test"

# Records every value it computes; raises on 13, and on 99 the first time; sleeps per batch when asked.
RECORDING_MODEL = '''
import time
import numpy as np

class Model:
    def load(self, context):
        self.log = context.parameters["log"]
        self.sleep_s = float(context.parameters.get("sleep_s", "0"))

    def infer(self, inputs):
        values = [int(v) for v in inputs["X"][:, 0]]
        with open(self.log, "a") as log:
            log.write("".join(f"{v}\\n" for v in values))
        time.sleep(self.sleep_s)
        if 13 in values:
            raise RuntimeError("unlucky 13")
        if 99 in values:
            with open(self.log) as log:
                if log.read().split().count("99") == 1:
                    raise RuntimeError("99 fails on its first try")
        return {"Y": inputs["X"] * 2}
'''


def recording_config(log: Path, sleep_s: float = 0.0, queue_policy: str = "", levels: int = 0) -> str:
    priority = f"priority_levels: {levels} default_priority_level: {levels}" if levels else ""
    return f'''
name: "rec"
backend: "python"
max_batch_size: 1
input [ {{ name: "X" data_type: TYPE_FP32 dims: [ 1 ] }} ]
output [ {{ name: "Y" data_type: TYPE_FP32 dims: [ 1 ] }} ]
dynamic_batching {{ {priority} {queue_policy} }}
parameters [ {{ key: "log" value: {{ string_value: "{log}" }} }},
             {{ key: "sleep_s" value: {{ string_value: "{sleep_s}" }} }} ]
'''


def request(value: int, request_id: str = "", **fields: object) -> Request:
    x = np.array([[value]], dtype=np.float32)
    return Request(id=request_id or f"r{value}", model="rec", reply_to=str(fields.pop("reply_to", REPLIES)),
                   inputs=(WireTensor("X", "FP32", (1, 1), x.tobytes()),), **fields)  # type: ignore[arg-type]


def computed(log: Path) -> list[int]:
    return [int(line) for line in log.read_text().split()] if log.exists() else []


async def started(tmp_path: Path, config: str, recovery: RecoverySettings = RecoverySettings(),
                  transport: MemoryTransport | None = None, prefetch: int = WorkerSettings().prefetch,
                  **kwargs: object) -> tuple[MemoryTransport, Worker]:
    write_python_model(tmp_path / "repo", "rec", RECORDING_MODEL, config)
    transport = transport or MemoryTransport()
    settings = WorkerSettings(worker_id="w1", poll_timeout_s=0.05, recovery=recovery, prefetch=prefetch)
    worker = Worker(transport, ModelRepository(tmp_path / "repo"), settings, **kwargs)  # type: ignore[arg-type]
    await worker.start()
    return transport, worker


@pytest.fixture
async def cleanup() -> AsyncIterator[list[Worker | MemoryTransport]]:
    opened: list[Worker | MemoryTransport] = []
    yield opened
    for thing in reversed(opened):
        await thing.aclose()


async def test_a_failing_request_is_retried_then_dead_lettered_with_its_error(tmp_path, cleanup):
    log = tmp_path / "log"
    recovery = RecoverySettings(interval_s=0.05, idle_s=30, max_deliveries=3, retry_failures=True)
    transport, worker = await started(tmp_path, recording_config(log), recovery)
    cleanup += [transport, worker]
    await transport.publish(channels.request_channel("rec"), encode_request(request(13)))
    await transport.publish(channels.request_channel("rec"), encode_request(request(2)))
    replies = {decode_response(raw).id: decode_response(raw) for raw in await next_messages(transport, REPLIES, 2)}
    assert replies["r2"].error is None
    failed = replies["r13"].error
    assert failed is not None and failed.code == "internal"
    assert "unlucky 13" in failed.message and "dead-letter" in failed.message
    # Released at once, not after the 30 s idle time: three tries, then given up.
    assert computed(log).count(13) == 3
    (raw,) = await next_messages(transport, channels.dead_letter_channel(), 1)
    letter = msgpack.unpackb(raw)
    assert letter["attempts"] == 3 and "unlucky 13" in letter["reason"]
    assert decode_request(letter["payload"]).id == "r13"


async def test_a_request_slower_than_the_idle_time_is_not_claimed_back_by_its_own_worker(tmp_path, cleanup):
    # The upkeep claims what stays pending longer than idle_s; a delivery
    # this worker is still computing is slow, not lost, and a second handler
    # would compute and answer it twice (as a Kafka reply held up by a
    # leader election once did).
    log = tmp_path / "log"
    recovery = RecoverySettings(interval_s=0.05, idle_s=0.1)
    transport, worker = await started(tmp_path, recording_config(log, sleep_s=0.8), recovery)
    cleanup += [transport, worker]
    await transport.publish(channels.request_channel("rec"), encode_request(request(7)))
    (raw,) = await next_messages(transport, REPLIES, 1)
    assert decode_response(raw).id == "r7"
    await asyncio.sleep(1.0)  # long enough for a second computation to have answered too
    assert await transport.fetch(REPLIES, "reader", "r", 10, 0.1) == []
    assert computed(log) == [7]
    assert await transport.backlog(channels.request_channel("rec"), channels.worker_group("rec")) == (0, 0)


async def test_without_retries_a_failing_request_is_answered_at_once(tmp_path, cleanup):
    log = tmp_path / "log"
    transport, worker = await started(tmp_path, recording_config(log), RecoverySettings(retry_failures=False))
    cleanup += [transport, worker]
    await transport.publish(channels.request_channel("rec"), encode_request(request(13)))
    (raw,) = await next_messages(transport, REPLIES, 1)
    error = decode_response(raw).error
    assert error is not None and "unlucky 13" in error.message and "dead-letter" not in error.message
    assert computed(log) == [13]
    assert await transport.backlog(channels.dead_letter_channel(), "reader") == (0, 0)


async def test_an_expired_request_is_answered_with_a_timeout_and_never_computed(tmp_path, cleanup):
    log = tmp_path / "log"
    transport, worker = await started(tmp_path, recording_config(log))
    cleanup += [transport, worker]
    past = time.time_ns() - 1_000_000
    await transport.publish(channels.request_channel("rec"), encode_request(request(5, deadline_ns=past)))
    await transport.publish(channels.request_channel("rec"), encode_request(request(6)))
    replies = {decode_response(raw).id: decode_response(raw) for raw in await next_messages(transport, REPLIES, 2)}
    error = replies["r5"].error
    assert error is not None and error.code == "timeout"
    assert computed(log) == [6]


async def test_the_default_timeout_counts_from_enqueueing(tmp_path, cleanup):
    log = tmp_path / "log"
    policy = "default_queue_policy { default_timeout_microseconds: 100000 }"
    transport, worker = await started(tmp_path, recording_config(log, sleep_s=0.3, queue_policy=policy))
    cleanup += [transport, worker]
    now = time.time_ns()
    # The first occupies the only instance for 0.3 s; the second's 0.1 s run out meanwhile.
    for value in (1, 2):
        await transport.publish(channels.request_channel("rec"), encode_request(request(value, created_ns=now)))
    replies = {decode_response(raw).id: decode_response(raw) for raw in await next_messages(transport, REPLIES, 2)}
    assert replies["r1"].error is None
    error = replies["r2"].error
    assert error is not None and error.code == "timeout"
    assert computed(log) == [1]


async def test_higher_priority_channels_are_drained_first(tmp_path, cleanup):
    log = tmp_path / "log"
    transport = MemoryTransport()
    cleanup.append(transport)
    # Queue everything before the worker starts, low priority first.
    for value in range(10, 16):
        await transport.publish(channels.request_channel("rec", level=2), encode_request(request(value, priority=2)))
    for value in range(20, 26):
        await transport.publish(channels.request_channel("rec", level=1), encode_request(request(value, priority=1)))
    _, worker = await started(tmp_path, recording_config(log, levels=2), transport=transport)
    cleanup.append(worker)
    await next_messages(transport, REPLIES, 12)
    assert computed(log) == [*range(20, 26), *range(10, 16)]


@pytest.mark.parametrize(("flags", "held"), [((), 2), (("--prefetch", "5"), 5)])
async def test_a_worker_holds_only_a_few_rounds_of_capacity(tmp_path, cleanup, flags: tuple[str, ...], held: int):
    log = tmp_path / "log"
    args = build_parser().parse_args(["worker", "--broker", "redis://127.0.0.1:1/0", "--model-repository",
                                      str(tmp_path / "repo"), *flags])
    transport, worker = await started(tmp_path, recording_config(log, sleep_s=0.2),
                                      prefetch=worker_settings(args).prefetch)
    cleanup += [transport, worker]
    for value in range(10):
        await transport.publish(channels.request_channel("rec"), encode_request(request(value)))
    await asyncio.sleep(0.1)
    # max_batch_size 1, one instance: prefetch rounds held, the rest left for other workers.
    assert await transport.backlog(channels.request_channel("rec"), channels.worker_group("rec")) == (10 - held, held)


def test_prefetch_must_be_at_least_one(capsys):
    with pytest.raises(SystemExit):
        build_parser().parse_args(["worker", "--broker", "memory://", "--model-repository", "repo", "--prefetch", "0"])
    assert "--prefetch: expected 1 or more, got 0" in capsys.readouterr().err


async def test_a_cancelled_job_is_never_computed_and_a_started_one_is_running(tmp_path, cleanup):
    log = tmp_path / "log"
    store = MemoryJobStore()
    transport, worker = await started(tmp_path, recording_config(log, sleep_s=0.3), job_gate=store)
    cleanup += [transport, worker]
    job_channel = channels.job_reply_channel()
    for job_id in ("a" * 32, "b" * 32):
        await store.create(Job(job_id, "rec", "", created_ns=0))
    await store.cancel("b" * 32)
    for value, job_id in ((1, "a" * 32), (2, "b" * 32)):
        await transport.publish(channels.request_channel("rec"),
                                encode_request(request(value, job_id, reply_to=job_channel)))
    async with asyncio.timeout(5):
        while (await store.get("a" * 32)).status != JobStatus.RUNNING:  # type: ignore[union-attr]
            await asyncio.sleep(0.01)
    (raw,) = await next_messages(transport, job_channel, 1)
    assert decode_response(raw).id == "a" * 32
    await asyncio.sleep(0.1)
    assert computed(log) == [1]
    assert await transport.backlog(channels.request_channel("rec"), channels.worker_group("rec")) == (0, 0)


async def final_status(store: MemoryJobStore, job_id: str, timeout_s: float = 5.0) -> JobStatus:
    async with asyncio.timeout(timeout_s):
        while True:
            job = await store.get(job_id)
            assert job is not None
            if job.status not in (JobStatus.QUEUED, JobStatus.RUNNING):
                return job.status
            await asyncio.sleep(0.01)


@pytest.mark.parametrize("value, attempts, status", [(99, 2, JobStatus.SUCCEEDED), (13, 3, JobStatus.FAILED)],
                         ids=["fails-once", "always-fails"])
async def test_a_retried_job_reaches_a_final_state(tmp_path, cleanup, value, attempts, status):
    """The redelivery after a failure meets its job running, and must compute it, not skip it."""
    log = tmp_path / "log"
    store = MemoryJobStore()
    recovery = RecoverySettings(interval_s=0.05, idle_s=30, max_deliveries=3, retry_failures=True)
    transport, worker = await started(tmp_path, recording_config(log), recovery, job_gate=store)
    replies = JobReplyConsumer(transport, store, "gw", poll_timeout_s=0.05)
    await replies.start()
    cleanup += [transport, worker, replies]  # type: ignore[list-item]
    job_id = "j" * 32
    await store.create(Job(job_id, "rec", "", created_ns=0))
    await transport.publish(channels.request_channel("rec"),
                            encode_request(request(value, job_id, reply_to=channels.job_reply_channel())))
    assert await final_status(store, job_id) == status
    assert computed(log) == [value] * attempts


@pytest.mark.parametrize("status", [JobStatus.SUCCEEDED, JobStatus.FAILED, JobStatus.CANCELLED])
async def test_a_finished_or_cancelled_job_is_not_started_again(status):
    store = MemoryJobStore()
    await store.create(Job("k" * 32, "rec", "", created_ns=0))
    assert await store.begin("k" * 32)
    assert await store.begin("k" * 32), "a redelivered running job goes on"
    if status is JobStatus.CANCELLED:
        store = MemoryJobStore()
        await store.create(Job("k" * 32, "rec", "", created_ns=0))
        await store.cancel("k" * 32)
    else:
        await store.finish("k" * 32, status, b"")
    assert not await store.begin("k" * 32)
    assert (await store.get("k" * 32)).status == status  # type: ignore[union-attr]
