"""Poison over real processes on Redis and Kafka: a request that fails or
kills every worker it reaches is tried ``--max-deliveries`` times, then
dead-lettered and answered with an error; bytes that are not a request are
answered or dead-lettered; and the fleet keeps serving everything else
throughout.

Over Kafka a request the model fails on is re-published with
``ferry-attempts`` one higher, so any worker of the group may retry it; one
that kills its worker is counted through the marks committed with the
offsets (``broker/transports/kafka_marks``)."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import msgpack
import numpy as np
import pytest
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from broker import channels
from broker.envelope import Request, Response, WireTensor, decode_request, decode_response, encode_request
from broker.transports.redis import PAYLOAD_FIELD
from tests.brokers import FLEET_BROKERS, open_fleet
from tests.fleet.processes import Fleet, FerryProcess, Gateway, ProcessFleet, wait_for
from tests.kafka_fleet.processes import KafkaFleet
from tests.models import poison_error, recorded_values, write_recording_model
from tests.redis_server import flushdb

MODEL = "poisoned"
POISON = 13
GOOD_VALUES = tuple(range(100, 108))
MAX_DELIVERIES = 3
REQUEST_STREAM = channels.request_channel(MODEL)
RETRYING = ("--max-deliveries", str(MAX_DELIVERIES), "--claim-interval-s", "0.2")
CLIENT_TIMEOUT_S = 30.0
SETTLE_S = 10.0


@pytest.fixture
def record(tmp_path: Path) -> Path:
    return tmp_path / "computed.txt"


def repository(tmp_path: Path, record: Path, on_poison: str = "raise") -> Path:
    repo = tmp_path / "repo"
    write_recording_model(repo, MODEL, record, poison=POISON, on_poison=on_poison)
    return repo


def infer(gateway: Gateway, value: int) -> np.ndarray:
    client = httpclient.InferenceServerClient(gateway.url, connection_timeout=CLIENT_TIMEOUT_S,
                                              network_timeout=CLIENT_TIMEOUT_S)
    try:
        tensor = httpclient.InferInput("INPUT0", [1], "INT32")
        tensor.set_data_from_numpy(np.array([value], dtype=np.int32))
        return client.infer(MODEL, [tensor], request_id=f"req-{value}").as_numpy("OUTPUT0")
    finally:
        client.close()


def infer_error(gateway: Gateway, value: int) -> InferenceServerException:
    with pytest.raises(InferenceServerException) as raised:
        infer(gateway, value)
    return raised.value


def assert_all_acked(fleet: Fleet) -> None:
    # The ack follows the reply (or the dead letter) by a moment.
    wait_for(lambda: fleet.pending(MODEL) == 0, SETTLE_S, f"every {MODEL} delivery to be acked")


# --- a model that raises ------------------------------------------------------


def infer_poison_among_good(gateway: Gateway) -> tuple[InferenceServerException, dict[int, np.ndarray]]:
    """The poison and the good values at once; (the poison's error, each good value's answer)."""
    with ThreadPoolExecutor(1 + len(GOOD_VALUES)) as pool:
        poisoned = pool.submit(infer_error, gateway, POISON)
        good = {value: pool.submit(infer, gateway, value) for value in GOOD_VALUES}
        error = poisoned.result(timeout=CLIENT_TIMEOUT_S)
        answers = {value: future.result(timeout=CLIENT_TIMEOUT_S) for value, future in good.items()}
    return error, answers


def assert_poison_failed_max_deliveries_times(error: InferenceServerException, answers: dict[int, np.ndarray],
                                              record: Path, fleet: ProcessFleet) -> None:
    assert error.status() == "500", f"{error}\n{fleet.describe()}"
    assert poison_error(POISON) in error.message() and "dead-letter" in error.message(), error.message()
    assert {value: output.tolist() for value, output in answers.items()} == {v: [2 * v] for v in GOOD_VALUES}
    computed = recorded_values(record)
    assert computed.count(POISON) == MAX_DELIVERIES, f"{computed}\n{fleet.describe()}"
    assert sorted(v for v in computed if v != POISON) == list(GOOD_VALUES), computed


def assert_poison_letter(letter: object) -> Request:
    """A dead letter for the poison, tried MAX_DELIVERIES times; the request it carries."""
    assert isinstance(letter, dict) and letter["kind"] == "dead_letter", letter
    assert letter["attempts"] == MAX_DELIVERIES and letter["channel"] == REQUEST_STREAM, letter
    assert poison_error(POISON) in letter["reason"], letter["reason"]
    request = decode_request(letter["payload"])
    [tensor] = request.inputs
    assert np.frombuffer(tensor.data, dtype="<i4").tolist() == [POISON]
    return request


@pytest.mark.parametrize("workers", [1, 2], ids=["one-worker", "two-workers"])
@pytest.mark.parametrize("broker", FLEET_BROKERS)
def test_a_request_the_model_fails_on_is_dead_lettered_after_max_deliveries(
    request: pytest.FixtureRequest, broker: str, tmp_path: Path, record: Path, workers: int,
):
    with open_fleet(request, broker, repository(tmp_path, record), tmp_path) as fleet:
        gateway = fleet.gateway()
        started = [fleet.worker(f"w{index}", *RETRYING) for index in range(workers)]
        fleet.wait_model_ready(gateway, MODEL)
        if isinstance(fleet, KafkaFleet):
            # Each computation is counted below: none may be sent while partitions still move.
            fleet.wait_assigned(started, REQUEST_STREAM)

        error, answers = infer_poison_among_good(gateway)

        assert_poison_failed_max_deliveries_times(error, answers, record, fleet)
        [letter] = fleet.read_dead_letters()
        poisoned = assert_poison_letter(letter)
        assert poisoned.model == MODEL and poisoned.id
        [tensor] = poisoned.inputs
        assert (tensor.name, tensor.datatype, tensor.shape) == ("INPUT0", "INT32", (1,))
        if isinstance(fleet, Fleet):
            assert_all_acked(fleet)
        else:
            assert isinstance(fleet, KafkaFleet)
            # The first delivery and each re-publication are on the request topic: MAX_DELIVERIES copies in all.
            on_topic = fleet.kcat.read_msgpack(fleet.topic(REQUEST_STREAM))
            ids = [envelope["id"] for envelope in on_topic if isinstance(envelope, dict)]
            assert ids.count(poisoned.id) == MAX_DELIVERIES and len(ids) == MAX_DELIVERIES + len(GOOD_VALUES), ids


def test_without_retries_a_failing_request_is_answered_after_one_computation(
    redis_url: str, tmp_path: Path, record: Path,
):
    flushdb(redis_url)
    with Fleet(redis_url, repository(tmp_path, record), tmp_path) as fleet:
        gateway = fleet.gateway()
        fleet.worker("w0", *RETRYING, "--no-retry-failures")
        fleet.wait_model_ready(gateway, MODEL)

        error = infer_error(gateway, POISON)
        good = infer(gateway, GOOD_VALUES[0])

        assert error.status() == "500" and poison_error(POISON) in error.message(), error
        assert "dead-letter" not in error.message(), error.message()
        assert good.tolist() == [2 * GOOD_VALUES[0]]
        assert recorded_values(record) == [POISON, GOOD_VALUES[0]]
        assert_all_acked(fleet)
        assert fleet.dead_letters() == 0


# --- a model that kills its worker --------------------------------------------

CRASH_DELIVERIES = 2
CRASH_OPTIONS = ("--max-deliveries", str(CRASH_DELIVERIES), "--claim-idle-s", "0.5",
                 "--claim-interval-s", "0.2", "--heartbeat-s", "0.5")
# Kafka's floor (group.min.session.timeout.ms): a dead worker's partitions move after this.
CRASH_SESSION = "session_timeout_ms=6000&heartbeat_interval_ms=500"
CRASH_BUDGET_S = {"redis": 30.0, "redis-cluster": 30.0, "kafka": 90.0}
CRASH_REPLIES = "poison.replies"


class GatewayCaller:
    """Over Redis the poison comes through a gateway, whose client is answered 503."""

    def __init__(self, fleet: ProcessFleet, pool: ThreadPoolExecutor) -> None:
        self.fleet, self.pool = fleet, pool
        self.gateway = fleet.gateway()

    def send_poison(self) -> None:
        self.poisoned = self.pool.submit(infer_error, self.gateway, POISON)

    def answered(self) -> bool:
        return self.poisoned.done()

    def assert_dead_lettered_without_completing(self) -> None:
        error = self.poisoned.result(timeout=0)
        assert error.status() == "503", f"{error}\n{self.fleet.describe()}"
        assert "dead-letter" in error.message() and "without completing" in error.message(), error.message()

    def assert_serves(self) -> None:
        # As a client would: ready first. The survivor was started without waiting for its
        # heartbeat, and a worker consumes before its first heartbeat reaches the gateway
        # (learnt every 0.5 s); under two CPU hogs that gap outlasted the dead-lettering.
        self.fleet.wait_model_ready(self.gateway, MODEL)
        assert infer(self.gateway, GOOD_VALUES[0]).tolist() == [2 * GOOD_VALUES[0]]


class KcatCaller:
    """Over Kafka the poison is a message kcat produces; its reply carries the error."""

    def __init__(self, fleet: ProcessFleet, pool: ThreadPoolExecutor) -> None:
        self.fleet = fleet

    def send_poison(self) -> None:
        produce(self.fleet, POISON, "poison-1")

    def answered(self) -> bool:
        assert isinstance(self.fleet, KafkaFleet)
        return bool(self.fleet.kcat.read_keys(self.fleet.topic(CRASH_REPLIES)))

    def assert_dead_lettered_without_completing(self) -> None:
        assert isinstance(self.fleet, KafkaFleet)
        [reply] = self.fleet.kcat.read(self.fleet.topic(CRASH_REPLIES))
        assert reply.key == "poison-1" and reply.headers.get("error") == "unavailable", reply
        message = str(reply.json()["error"])  # type: ignore[index]
        assert "dead-letter" in message and "without completing" in message, message

    def assert_serves(self) -> None:
        produce(self.fleet, GOOD_VALUES[0], "good-1")
        [_, good] = self.fleet.read_replies(CRASH_REPLIES, 2)
        assert good.key == "good-1" and "error" not in good.headers, good


def produce(fleet: ProcessFleet, value: int, request_id: str) -> None:
    body = json.dumps({"inputs": [{"name": "INPUT0", "shape": [1], "datatype": "INT32", "data": [value]}]})
    fleet.produce_json(REQUEST_STREAM, body.encode(), request_id, CRASH_REPLIES)


CALLERS: dict[str, type[GatewayCaller] | type[KcatCaller]] = {"redis": GatewayCaller, "redis-cluster": GatewayCaller, "kafka": KcatCaller}


@pytest.mark.parametrize("broker", FLEET_BROKERS)
def test_a_request_that_kills_every_worker_is_dead_lettered_and_answered(
    request: pytest.FixtureRequest, broker: str, tmp_path: Path, record: Path,
):
    """Each worker that takes the poison dies (exit code 1); the test starts a
    fresh one each time, as a supervisor would. Deliveries 1..N kill a worker
    each; delivery N+1 is past the limit and is dead-lettered unseen by the
    model, and the waiting client gets an error instead of hanging. Kafka
    counts no deliveries; the marks ferry commits with its offsets do."""
    repo = repository(tmp_path, record, on_poison="exit")
    with ThreadPoolExecutor(1) as pool, open_fleet(request, broker, repo, tmp_path, CRASH_SESSION) as fleet:
        caller = CALLERS[broker](fleet, pool)
        workers = [fleet.worker("w0", *CRASH_OPTIONS)]
        if isinstance(caller, GatewayCaller):
            fleet.wait_model_ready(caller.gateway, MODEL)

        started = time.monotonic()
        caller.send_poison()
        restart_until_done(fleet, workers, caller.answered, started, CRASH_BUDGET_S[broker])
        elapsed = time.monotonic() - started

        dead = workers[:-1]
        assert [worker.process.returncode for worker in dead] == [1] * CRASH_DELIVERIES, fleet.describe()
        assert workers[-1].running(), workers[-1].describe()
        assert recorded_values(record) == [POISON] * CRASH_DELIVERIES, fleet.describe()
        caller.assert_dead_lettered_without_completing()
        [letter] = fleet.read_dead_letters()
        assert isinstance(letter, dict) and letter["attempts"] == CRASH_DELIVERIES + 1, letter
        if isinstance(fleet, Fleet):
            assert np.frombuffer(decode_request(letter["payload"]).inputs[0].data, "<i4").tolist() == [POISON]
            assert_all_acked(fleet)
        # The survivor still serves, and counts the next request once.
        caller.assert_serves()
        assert workers[-1].running(), workers[-1].describe()
        assert recorded_values(record) == [POISON] * CRASH_DELIVERIES + [GOOD_VALUES[0]]
        assert elapsed < CRASH_BUDGET_S[broker], f"took {elapsed:.1f} s"


def restart_until_done(fleet: ProcessFleet, workers: list[FerryProcess], answered: Callable[[], bool],
                       started: float, budget_s: float) -> None:
    """Whenever the newest worker has died, start another; at most N + 1 in all."""
    while not answered():
        assert time.monotonic() - started < budget_s, f"no answer yet\n{fleet.describe()}"
        if not workers[-1].running():
            assert len(workers) <= CRASH_DELIVERIES, f"{len(workers)} workers died\n{fleet.describe()}"
            # Not waiting for its heartbeat: it may take the poison and die first.
            workers.append(fleet.worker(f"w{len(workers)}", *CRASH_OPTIONS, wait=False))
        time.sleep(0.05)


# --- bytes that are not a good request ----------------------------------------


def envelope(request_id: str, reply_to: str, model: str = MODEL, shape: tuple[int, ...] = (1,)) -> Request:
    data = np.full(shape, 5, dtype="<i4").tobytes()
    return Request(id=request_id, model=model, reply_to=reply_to,
                   inputs=(WireTensor("INPUT0", "INT32", shape, data),))


def garbled(request: Request, **fields: Any) -> bytes:
    """The request's envelope with some fields replaced (None: removed)."""
    body = msgpack.unpackb(encode_request(request), raw=False)
    for name, value in fields.items():
        if value is None:
            del body[name]
        else:
            body[name] = value
    return msgpack.packb(body, use_bin_type=True)


# name -> (payload, expected error code or None when it cannot be answered)
REPLY_PREFIX = "test.replies."
BAD_MESSAGES: dict[str, tuple[bytes, str | None]] = {
    "not-msgpack": (b"\xc1\xc1 this is not msgpack", None),
    "map-without-reply-to": (msgpack.packb({"hello": "world", "id": "b-1", "model": MODEL}), None),
    "garbled-inputs": (garbled(envelope("c-1", REPLY_PREFIX + "c1"), inputs="garbled"), "invalid_argument"),
    "missing-model": (garbled(envelope("c-2", REPLY_PREFIX + "c2"), model=None), "invalid_argument"),
    "unknown-model": (encode_request(envelope("d-1", REPLY_PREFIX + "d", model="not_" + MODEL)), "not_found"),
    "rejected-shape": (encode_request(envelope("e-1", REPLY_PREFIX + "e", shape=(3,))), "invalid_argument"),
}


def test_bad_messages_are_answered_or_dead_lettered_and_the_worker_serves_on(
    redis_url: str, tmp_path: Path, record: Path,
):
    flushdb(redis_url)
    with Fleet(redis_url, repository(tmp_path, record), tmp_path) as fleet:
        gateway = fleet.gateway()
        worker = fleet.worker("w0", *RETRYING)
        fleet.wait_model_ready(gateway, MODEL)

        ids = {name: fleet.redis.xadd(REQUEST_STREAM, {PAYLOAD_FIELD: payload}).decode()
               for name, (payload, _) in BAD_MESSAGES.items()}

        for name, (payload, code) in BAD_MESSAGES.items():
            if code is None:
                continue
            reply = read_reply(fleet, payload)
            assert reply.error is not None and reply.error.code == code, (name, reply)
            assert reply.id == msgpack.unpackb(payload, raw=False)["id"], (name, reply)
            assert reply.outputs == (), (name, reply)
        wait_for(lambda: fleet.dead_letters() >= 2, SETTLE_S, "two dead letters", worker)
        letters = {letter["message_id"]: letter for letter in fleet.read_dead_letters()}
        unanswerable = {ids[name]: payload for name, (payload, code) in BAD_MESSAGES.items() if code is None}
        assert set(letters) == set(unanswerable), letters
        for message_id, letter in letters.items():
            assert letter["kind"] == "dead_letter" and letter["channel"] == REQUEST_STREAM, letter
            assert letter["payload"] == unanswerable[message_id] and letter["reason"], letter

        assert infer(gateway, GOOD_VALUES[0]).tolist() == [2 * GOOD_VALUES[0]]
        assert worker.running(), worker.describe()
        assert_all_acked(fleet)
        assert recorded_values(record) == [GOOD_VALUES[0]], "a bad message reached the model"
        assert worker.errors() == [], worker.describe()


def read_reply(fleet: Fleet, payload: bytes) -> Response:
    reply_to = msgpack.unpackb(payload, raw=False)["reply_to"]
    wait_for(lambda: fleet.redis.xlen(reply_to) > 0, SETTLE_S, f"a reply on {reply_to}")
    [(_, fields)] = fleet.redis.xrange(reply_to)
    return decode_response(fields[PAYLOAD_FIELD])


def test_a_well_formed_request_with_no_reply_channel_is_dead_lettered_not_answered_into_the_void(
    redis_url: str, tmp_path: Path, record: Path,
):
    """``decode_request`` accepts an empty ``reply_to``; nobody can receive an
    answer to such a request, so it belongs on the dead-letter channel, and
    nothing may be written to a stream named ""."""
    flushdb(redis_url)
    with Fleet(redis_url, repository(tmp_path, record), tmp_path) as fleet:
        gateway = fleet.gateway()
        worker = fleet.worker("w0", *RETRYING)
        fleet.wait_model_ready(gateway, MODEL)

        payload = encode_request(envelope("f-1", reply_to=""))
        message_id = fleet.redis.xadd(REQUEST_STREAM, {PAYLOAD_FIELD: payload}).decode()
        assert infer(gateway, GOOD_VALUES[0]).tolist() == [2 * GOOD_VALUES[0]]
        assert_all_acked(fleet)

        assert not fleet.redis.exists(""), (
            f"a reply was published to the stream named '': {fleet.redis.xrange('')}\n{worker.describe()}")
        letters = {letter["message_id"]: letter for letter in fleet.read_dead_letters()}
        assert message_id in letters and letters[message_id]["payload"] == payload, letters
        assert worker.running(), worker.describe()
