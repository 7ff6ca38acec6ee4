"""Streaming speech sessions over Redis, end to end: espeak-ng speaks known
sentences, ``SpeechSession`` streams them in real-time chunks to real worker
processes running ``model_repo/speech``, and reads transcripts back."""

from __future__ import annotations

import asyncio
import json
import shutil
import struct
import subprocess
import sys
import wave
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import orjson
import pytest
import redis.asyncio as aioredis
import websockets

from ferry.speech_client import SpeechSession, Transcript, stream_samples
from tests.fleet.processes import Fleet, FerryProcess
from tests.redis_server import flushdb
from tests.speech.audio import ESPEAK, silence, speak, write_wav

if ESPEAK is None:
    pytest.skip("the speech tests need espeak-ng (apt-get install espeak-ng)", allow_module_level=True)

MODEL_DIR = Path(__file__).resolve().parents[2] / "model_repo" / "speech"
CHUNK_MS = 160
SENTENCES = {
    "please open the door": {"open", "door"},
    "i would like a cup of coffee": {"like", "cup", "coffee"},
    "two three four five": {"three", "four", "five"},
}
WORKER_OPTIONS = ("--heartbeat-s", "0.2", "--claim-interval-s", "0.2")


@pytest.fixture(scope="module")
def speech(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], np.ndarray]:
    cache = tmp_path_factory.mktemp("espeak")
    return lambda text: np.concatenate([silence(300), speak(text, cache), silence(300)])


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    shutil.copytree(MODEL_DIR, tmp_path / "repo" / "speech")
    return tmp_path / "repo"


@pytest.fixture
def clean_redis(redis_url: str) -> Iterator[str]:
    flushdb(redis_url)
    yield redis_url
    flushdb(redis_url)


async def transcribe(url: str, samples: np.ndarray, realtime: bool = True,
                     on_reply: Callable[[Transcript], None] | None = None) -> list[Transcript]:
    async with SpeechSession(url) as session:
        sender = asyncio.create_task(stream_samples(session, samples, CHUNK_MS, realtime))
        got = []
        async for transcript in session.transcripts():
            got.append(transcript)
            if on_reply is not None:
                on_reply(transcript)
        await sender
    return got


def final_text(transcripts: list[Transcript]) -> str:
    assert not [t.error for t in transcripts if t.error]
    return " ".join(t.text for t in transcripts if t.final and t.text)


def test_a_real_time_stream_gives_partials_before_the_audio_ends_and_the_key_words_at_the_end(
        clean_redis: str, repo: Path, tmp_path: Path, speech: Callable[[str], np.ndarray]) -> None:
    samples = speech("i would like a cup of coffee")
    with Fleet(clean_redis, repo, tmp_path) as fleet:
        fleet.worker("w1", *WORKER_OPTIONS)
        got = asyncio.run(transcribe(clean_redis, samples))
    last_chunk = max(t.chunk for t in got)
    early = [t for t in got if t.text and not t.final and t.chunk < last_chunk]
    assert early, f"no partial transcript before the last chunk: {got}"
    assert early[0].end_ms <= early[0].audio_ms
    assert SENTENCES["i would like a cup of coffee"] <= set(final_text(got).split()), final_text(got)


def test_eight_concurrent_sessions_match_each_session_alone(
        clean_redis: str, repo: Path, tmp_path: Path, speech: Callable[[str], np.ndarray]) -> None:
    texts = [list(SENTENCES)[i % len(SENTENCES)] for i in range(8)]
    audio = [speech(text) for text in texts]

    async def together() -> list[list[Transcript]]:
        return await asyncio.gather(*(transcribe(clean_redis, samples) for samples in audio))

    with Fleet(clean_redis, repo, tmp_path) as fleet:
        fleet.worker("w1", *WORKER_OPTIONS)
        concurrent = asyncio.run(together())
        alone = [asyncio.run(transcribe(clean_redis, samples, realtime=False)) for samples in audio]
    assert [final_text(t) for t in concurrent] == [final_text(t) for t in alone]
    for text, transcripts in zip(texts, concurrent):
        assert SENTENCES[text] <= set(final_text(transcripts).split()), (text, final_text(transcripts))


def test_a_session_resumes_on_another_worker_when_its_worker_dies(
        clean_redis: str, repo: Path, tmp_path: Path, speech: Callable[[str], np.ndarray]) -> None:
    samples = speech("two three four five")
    with Fleet(clean_redis, repo, tmp_path) as fleet:
        workers = {name: fleet.worker(name, *WORKER_OPTIONS) for name in ("w1", "w2")}
        uninterrupted = asyncio.run(transcribe(clean_redis, samples, realtime=False))
        killed: list[FerryProcess] = []

        async def kill_holder_after_five() -> list[Transcript]:
            async with SpeechSession(clean_redis) as session:
                sender = asyncio.create_task(stream_samples(session, samples, CHUNK_MS))
                got = []
                async for transcript in session.transcripts():
                    got.append(transcript)
                    if transcript.chunk == 5:
                        holder = session.channel.rsplit(".", 1)[-1]  # ferry.speech.sessions.<worker>
                        killed.append(workers[holder])
                        workers[holder].kill()
                await sender
            return got

        resumed = asyncio.run(kill_holder_after_five())
        survivor = next(w for w in workers.values() if w not in killed)
        assert any(e.get("event") == "sequence.resumed" for e in survivor.log_events()), fleet.describe()
    assert killed, "the session never reached chunk 5"
    assert final_text(resumed) == final_text(uninterrupted)
    assert SENTENCES["two three four five"] <= set(final_text(resumed).split())


async def send_raw(url: str, channel: str, reply_to: str, request_id: str, parameters: dict[str, object],
                   datatype: str = "INT16", samples: np.ndarray | None = None) -> dict[str, object]:
    """One hand-made chunk; its reply's JSON body."""
    data = np.zeros(2560, np.int16) if samples is None else samples
    header = orjson.dumps({"parameters": parameters, "inputs": [{
        "name": "AUDIO", "datatype": datatype, "shape": [1, data.size], "parameters": {"binary_data_size": data.nbytes}}]})
    client = aioredis.Redis.from_url(url)
    try:
        await client.xadd(channel, {"d": header + data.tobytes(), "h.content-type": "application/json",
                                    "h.inference-header-content-length": str(len(header)),
                                    "h.reply-to": reply_to, "h.request-id": request_id})
        reply = await client.xread({reply_to: "0"}, block=30_000)
        assert reply, f"no reply to {request_id}"
        await client.delete(reply_to)
        return json.loads(reply[0][1][-1][1][b"d"])  # type: ignore[no-any-return]
    finally:
        await client.aclose()


def test_bad_session_traffic_gets_clear_errors_and_leaves_other_sessions_alone(
        clean_redis: str, repo: Path, tmp_path: Path, speech: Callable[[str], np.ndarray]) -> None:
    good = speech("please open the door")
    requests = "ferry.speech.requests"

    async def scenario() -> tuple[list[Transcript], dict[str, dict[str, object]]]:
        errors: dict[str, dict[str, object]] = {}
        good_run = asyncio.create_task(transcribe(clean_redis, good))
        errors["no start"] = await send_raw(clean_redis, requests, "r.1", "x-1", {"sequence_id": "never-started"})
        ended = await transcribe(clean_redis, silence(320), realtime=False)
        assert not [t for t in ended if t.error]
        async with SpeechSession(clean_redis) as session:
            await session.send(silence(160))
            channel = session.channel
            errors["wrong format"] = await send_raw(clean_redis, channel, "r.2", "x-2",
                                                    {"sequence_id": session.session_id}, datatype="FP32",
                                                    samples=np.zeros(2560, np.float32))
            errors["oversized"] = await send_raw(clean_redis, channel, "r.3", "x-3",
                                                 {"sequence_id": session.session_id},
                                                 samples=np.zeros(48_000, np.int16))
            await session.send(silence(160), end=True)
            after = [t async for t in session.transcripts()]
        errors["unknown session"] = await send_raw(clean_redis, requests, "r.4", "x-4", {"sequence_id": "nobody"})
        errors["ended session"] = await send_raw(clean_redis, requests, "r.5", "x-5",
                                                 {"sequence_id": session.session_id})
        assert not [t.error for t in after if t.error], "the session did not survive its bad chunks"
        return await good_run, errors

    with Fleet(clean_redis, repo, tmp_path) as fleet:
        fleet.worker("w1", *WORKER_OPTIONS)
        good_transcripts, errors = asyncio.run(scenario())
        alone = asyncio.run(transcribe(clean_redis, good, realtime=False))
        assert not fleet.processes[0].errors()
    messages = {kind: str(body.get("error", "")) for kind, body in errors.items()}
    assert "sequence_start" in messages["no start"]
    assert "sequence_start" in messages["unknown session"]
    assert "sequence_start" in messages["ended session"]
    assert "FP32" in messages["wrong format"] and "INT16" in messages["wrong format"]
    assert "AUDIO" in messages["oversized"] and "48000" in messages["oversized"]
    assert final_text(good_transcripts) == final_text(alone)


async def websocket_transcript(gateway: str, samples: np.ndarray) -> list[dict[str, object]]:
    size = 16 * CHUNK_MS
    pieces = [samples[i:i + size] for i in range(0, len(samples), size)]
    async with websockets.connect(f"ws://{gateway}/v2/models/speech/stream") as socket:
        for index, piece in enumerate(pieces):
            header = orjson.dumps({"id": str(index), "parameters": {
                "sequence_id": "browser-1", "sequence_start": index == 0, "sequence_end": index == len(pieces) - 1},
                "inputs": [{"name": "AUDIO", "datatype": "INT16", "shape": [1, len(piece)],
                            "parameters": {"binary_data_size": piece.nbytes}}]})
            await socket.send(struct.pack("<I", len(header)) + header + piece.astype("<i2").tobytes())
        replies = [json.loads(await asyncio.wait_for(socket.recv(), 60)) for _ in pieces]
    return sorted(replies, key=lambda r: int(r["id"]))  # type: ignore[arg-type]


def test_the_gateway_websocket_bridges_speech_sessions(
        clean_redis: str, repo: Path, tmp_path: Path, speech: Callable[[str], np.ndarray]) -> None:
    samples = speech("please open the door")
    with Fleet(clean_redis, repo, tmp_path) as fleet:
        fleet.worker("w1", *WORKER_OPTIONS)
        fleet.worker("w2", *WORKER_OPTIONS)
        gateway = fleet.gateway()
        fleet.wait_model_ready(gateway, "speech")
        replies = asyncio.run(websocket_transcript(gateway.url, samples))
    assert not [r for r in replies if "error" in r], replies
    outputs = [{o["name"]: o["data"][0] for o in r["outputs"]} for r in replies]  # type: ignore[attr-defined]
    final = " ".join(o["TEXT"] for o in outputs if o["IS_FINAL"] and o["TEXT"])
    assert SENTENCES["please open the door"] <= set(final.split()), final
    assert len({r["parameters"]["sequence_channel"] for r in replies}) == 1  # type: ignore[index]


def test_ferry_speech_streams_a_wav_file_and_prints_the_transcript(
        clean_redis: str, repo: Path, tmp_path: Path, speech: Callable[[str], np.ndarray]) -> None:
    wav = tmp_path / "coffee.wav"
    write_wav(wav, speech("i would like a cup of coffee"))
    narrow = tmp_path / "narrow.wav"
    with wave.open(str(narrow), "wb") as out:
        out.setnchannels(1), out.setsampwidth(2), out.setframerate(8000)
        out.writeframes(np.zeros(800, "<i2").tobytes())
    command = [sys.executable, "-m", "ferry.cli.main", "speech", "--broker", clean_redis]
    with Fleet(clean_redis, repo, tmp_path) as fleet:
        fleet.worker("w1", *WORKER_OPTIONS)
        shown = subprocess.run([*command, str(wav)], capture_output=True, text=True, timeout=120)
        refused = subprocess.run([*command, str(narrow)], capture_output=True, text=True, timeout=60)
    assert shown.returncode == 0, shown.stderr
    finals = [line for line in shown.stdout.split("\r") if "ms)" in line]
    assert finals and SENTENCES["i would like a cup of coffee"] <= set(finals[-1].split()), shown.stdout
    assert refused.returncode == 1 and "8000 Hz" in refused.stderr and "narrow.wav" in refused.stderr
