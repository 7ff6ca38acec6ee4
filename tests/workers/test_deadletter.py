"""The dead-letter channel stays within its bounds: letters cut to their share
of the byte bound, the oldest dropped past the count bound, on every broker,
through a real worker, and both losses counted."""

from __future__ import annotations

import asyncio
import hashlib
import os
import shutil
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import msgpack
import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from broker import channels
from broker.transport import Delivery, Transport
from broker.transports import open_transport
from tests.brokers import BROKERS, broker_url
from workers.deadletter import MAX_REASON_BYTES, MIN_LETTER_BYTES, DeadLetterSettings, encode_dead_letter
from workers.repository.layout import ModelRepository
from workers.telemetry.prometheus import StatsCollector
from workers.telemetry.stats import StatsBook
from workers.worker import Worker, WorkerSettings

MODEL_REPO = Path(__file__).resolve().parents[2] / "model_repo"
REQUESTS = channels.request_channel("add_sub")
DEAD_LETTERS = channels.dead_letter_channel()
KIB, MIB = 1 << 10, 1 << 20
BOUNDS = DeadLetterSettings(max_count=8, max_bytes=8 * 64 * KIB)
SENT = 40
UNDECODABLE = b"\xc1"  # a byte msgpack never uses: no reply channel can be read, so it is dead-lettered


def delivery(payload: bytes, message_id: str = "7-1") -> Delivery:
    return Delivery(REQUESTS, "g", message_id, payload, attempts=3)


def unpack(letter: bytes) -> dict:
    return msgpack.unpackb(letter, raw=False)


# --- one letter ----------------------------------------------------------------


@pytest.mark.parametrize("size", [0, 1, 1000, 60 * KIB])
def test_a_payload_within_its_share_is_kept_whole(size: int):
    payload = os.urandom(size)
    raw, kept = encode_dead_letter(delivery(payload), "bad bytes", 64 * KIB)
    letter = unpack(raw)
    assert kept == size and letter["payload"] == payload
    assert (letter["payload_bytes"], letter["truncated"]) == (size, False)
    assert "payload_sha256" not in letter
    assert (letter["channel"], letter["message_id"], letter["attempts"], letter["reason"]) == (
        REQUESTS, "7-1", 3, "bad bytes")


@pytest.mark.parametrize("size", [64 * KIB, MIB, 10 * MIB])
def test_a_longer_payload_keeps_its_first_bytes_its_length_and_digest(size: int):
    payload = os.urandom(size)
    raw, kept = encode_dead_letter(delivery(payload), "bad bytes", 64 * KIB)
    letter = unpack(raw)
    assert len(raw) <= 64 * KIB
    assert kept == len(letter["payload"]) > 63 * KIB
    assert payload.startswith(letter["payload"])
    assert (letter["payload_bytes"], letter["truncated"]) == (size, True)
    assert letter["payload_sha256"] == hashlib.sha256(payload).hexdigest()


def test_no_letter_is_longer_than_its_share_around_the_edge():
    share = 8 * KIB
    whole_up_to = len(encode_dead_letter(delivery(b""), "r", share)[0])
    for size in range(share - whole_up_to - 8, share - whole_up_to + 200):
        raw, kept = encode_dead_letter(delivery(os.urandom(size)), "r", share)
        assert len(raw) <= share, size
        assert kept == size or unpack(raw)["truncated"]


def test_a_long_reason_is_cut_on_a_character_boundary():
    raw, _ = encode_dead_letter(delivery(b"x"), "é" * 5000, MIN_LETTER_BYTES)
    reason = unpack(raw)["reason"]
    assert len(raw) <= MIN_LETTER_BYTES
    assert reason == "é" * (MAX_REASON_BYTES // 2)


@pytest.mark.parametrize(("count", "total", "fault"), [
    (0, 64 * MIB, "count bound must be at least 1, got 0"),
    (1024, 1024 * MIN_LETTER_BYTES - 1, f"leaves {MIN_LETTER_BYTES - 1} bytes for each of 1024 letters"),
])
def test_bounds_that_leave_no_room_for_a_letter_are_refused(count: int, total: int, fault: str):
    with pytest.raises(ValueError, match=fault):
        DeadLetterSettings(count, total)


def test_the_default_bounds_give_each_letter_64_kib():
    assert (DeadLetterSettings().max_count, DeadLetterSettings().letter_bytes) == (1024, 64 * KIB)


# --- a worker on each broker ---------------------------------------------------------


@pytest.fixture(params=BROKERS)
async def transport(request: pytest.FixtureRequest) -> AsyncIterator[Transport]:
    url = broker_url(request, "deadletter")
    opened = open_transport(url)
    yield opened
    await opened.aclose()


@pytest.fixture
async def stats(transport: Transport, tmp_path: Path) -> AsyncIterator[StatsBook]:
    """What a worker with small dead-letter bounds counted, serving ``add_sub`` on ``transport``."""
    shutil.copytree(MODEL_REPO / "add_sub", tmp_path / "add_sub")
    book = StatsBook()
    settings = WorkerSettings(worker_id="w1", poll_timeout_s=0.05, dead_letters=BOUNDS)
    worker = Worker(transport, ModelRepository(tmp_path), settings, observer=book)
    await worker.start()
    yield book
    await worker.aclose()


async def eventually(condition: Callable[[], bool], what: str, timeout_s: float = 60.0) -> None:
    try:
        async with asyncio.timeout(timeout_s):
            while not condition():
                await asyncio.sleep(0.05)
    except TimeoutError:
        raise AssertionError(f"timed out after {timeout_s} s waiting for {what}") from None


async def everything_on(transport: Transport, channel: str) -> list[bytes]:
    """Every message left on ``channel``, read by a group of its own."""
    found: list[bytes] = []
    while batch := await transport.fetch(channel, "inspector", "i", 100, 1.0 if found else 10.0):
        found += [d.payload for d in batch]
    return found


async def test_many_large_undecodable_requests_leave_the_dead_letters_within_their_bounds(
        transport: Transport, stats: StatsBook):
    sent: dict[str, bytes] = {}
    for _ in range(SENT):
        payload = UNDECODABLE + os.urandom(MIB - 1)
        sent[await transport.publish(REQUESTS, payload)] = payload
    await eventually(lambda: stats.dead_letters.written == SENT, f"{SENT} dead letters")

    letters = await everything_on(transport, DEAD_LETTERS)
    assert len(letters) == BOUNDS.max_count
    assert sum(len(raw) for raw in letters) <= BOUNDS.max_bytes
    for raw in letters:
        letter = unpack(raw)
        original = sent[letter["message_id"]]
        assert (letter["truncated"], letter["payload_bytes"]) == (True, MIB)
        assert original.startswith(letter["payload"]) and len(letter["payload"]) > BOUNDS.letter_bytes - 2 * KIB
        assert letter["payload_sha256"] == hashlib.sha256(original).hexdigest()
    assert (stats.dead_letters.evicted, stats.dead_letters.truncated) == (SENT - BOUNDS.max_count, SENT)
    assert SENT * (MIB - BOUNDS.letter_bytes) < stats.dead_letters.truncated_bytes < SENT * (
        MIB - BOUNDS.letter_bytes + 2 * KIB)


@pytest.mark.parametrize("transport", ["memory"], indirect=True)
async def test_the_metrics_count_the_letters_dropped_and_the_bytes_cut(transport: Transport, stats: StatsBook):
    for n in range(10):
        await transport.publish(REQUESTS, UNDECODABLE + (b"x" * MIB if n % 2 else b"short"))
    await eventually(lambda: stats.dead_letters.written == 10, "10 dead letters")
    registry = CollectorRegistry()
    registry.register(StatsCollector(stats, "w1"))
    samples = {(s.name, tuple(s.labels.items())): s.value
               for family in text_string_to_metric_families(generate_latest(registry).decode())
               for s in family.samples}
    assert samples[("ferry_deadletter_written_total", ())] == 10
    assert samples[("ferry_deadletter_dropped_total", (("reason", "evicted"),))] == 10 - BOUNDS.max_count
    assert samples[("ferry_deadletter_dropped_total", (("reason", "truncated"),))] == 5
    assert 5 * (MIB + 1 - BOUNDS.letter_bytes) < samples[("ferry_deadletter_dropped_bytes_total", ())] < 5 * (
        MIB + 1 - BOUNDS.letter_bytes + 2 * KIB)
