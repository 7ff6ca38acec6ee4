"""A streaming speech session over Redis, as a client in any language would run it.

    async with SpeechSession(redis_url) as session:
        await session.send(chunk)              # the first chunk opens the session
        ...
        await session.send(last, end=True)
        async for transcript in session.transcripts():
            ...

The wire protocol (docs/speech.md, "Streaming speech over Redis"):

1. Every chunk is one entry ``XADD``-ed with the fields ``d`` (a KServe V2
   JSON header followed by the chunk's PCM16 bytes) and ``h.content-type:
   application/json``, ``h.inference-header-content-length`` (the JSON's
   length), ``h.reply-to`` (the client's reply stream) and ``h.request-id``.
   The header names input ``AUDIO`` (INT16, shape ``[1, samples]``,
   ``binary_data_size``) and the parameters ``sequence_id`` (the session id),
   ``sequence_start`` (first chunk) and ``sequence_end`` (last chunk).
2. The first chunk goes to the model's request stream, ``ferry.<model>.requests``.
   Its reply names the session's stream in ``parameters.sequence_channel``; every
   later chunk goes there, so they all reach the worker holding the session,
   in order, without waiting for one another's replies.
3. Each chunk is answered by one entry on the reply stream: a V2 JSON response
   with ``TEXT``, ``IS_FINAL``, ``START_MS``, ``END_MS`` and ``AUDIO_MS``, or
   ``{"error": "..."}`` with the code in ``h.error``.
"""

from __future__ import annotations

import asyncio
import time
import uuid
import wave
from collections import deque
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import cast

import numpy as np
import orjson

from broker import channels
from broker.redis_url import async_client

SAMPLE_RATE = 16_000
CHUNK_READ = 64

# XREAD's reply as redis-py gives it over RESP2: [(stream, [(id, fields), ...])].
_StreamReply = list[tuple[bytes, list[tuple[bytes, dict[bytes, bytes]]]]]


class SpeechError(Exception):
    """The server refused a chunk (the message says why), or the audio is unusable."""


@dataclass(frozen=True, slots=True)
class Transcript:
    chunk: int  # the chunk this answers, counted from 0
    text: str
    final: bool
    start_ms: int
    end_ms: int
    audio_ms: int
    received_s: float  # monotonic clock
    error: str = ""


class SpeechSession:
    def __init__(self, redis_url: str, model: str = "speech", session_id: str | None = None,
                 prefix: str = channels.PREFIX) -> None:
        self.session_id = session_id or uuid.uuid4().hex
        self.model = model
        # No socket timeout: reads block server-side for up to their own timeout
        # (30 s), past redis-py 8's default of 5 s.
        self._redis = async_client(redis_url, socket_timeout=None)
        self._request_channel = channels.request_channel(model, prefix)
        self.reply_channel = f"{prefix}.speech.replies.{self.session_id}"
        self._channel: str | None = None
        self._sent = 0
        self._last_chunk: int | None = None  # the index of the chunk sent with end=True
        self._sent_at: dict[int, float] = {}
        self._last_id = "0"
        # The reply stream is read once, on from the last entry read: two reads
        # at a time (send() learning the channel while transcripts() reads)
        # would both start from the same id and return the same replies.
        self._reading = asyncio.Lock()
        self._received: deque[Transcript] = deque()  # read, not yet yielded by transcripts()
        self._opening: Transcript | None = None  # the first reply: chunk 0's

    async def __aenter__(self) -> SpeechSession:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        await self._redis.delete(self.reply_channel)
        await self._redis.aclose()

    @property
    def channel(self) -> str:
        """The session's stream, known once the first chunk is answered."""
        return self._channel or self._request_channel

    def sent_at(self, chunk: int) -> float:
        """When chunk ``chunk`` was sent (monotonic clock)."""
        return self._sent_at[chunk]

    async def send(self, samples: np.ndarray, end: bool = False) -> int:
        """Send one chunk; the first opens the session and waits for its reply."""
        index = self._sent
        parameters = {"sequence_id": self.session_id, "sequence_start": index == 0, "sequence_end": end}
        header = orjson.dumps({"id": f"{self.session_id}-{index}", "parameters": parameters, "inputs": [{
            "name": "AUDIO", "datatype": "INT16", "shape": [1, len(samples)],
            "parameters": {"binary_data_size": len(samples) * 2}}]})
        fields = {
            "d": header + np.asarray(samples, "<i2").tobytes(),
            "h.content-type": "application/json",
            "h.inference-header-content-length": str(len(header)),
            "h.reply-to": self.reply_channel,
            "h.request-id": f"{self.session_id}-{index}",
        }
        self._sent_at[index] = time.monotonic()
        await self._redis.xadd(self._channel or self._request_channel, fields)  # type: ignore[arg-type]
        self._sent += 1
        if end:
            self._last_chunk = index
        if index == 0:
            await self._learn_channel()
        return index

    async def transcripts(self, timeout_s: float = 30.0) -> AsyncIterator[Transcript]:
        """Every reply, in order, until the one answering the chunk sent with ``end``."""
        answered = -1
        while self._last_chunk is None or answered < self._last_chunk:
            await self._read(timeout_s, lambda: bool(self._received))
            while self._received:
                transcript = self._received.popleft()
                answered = max(answered, transcript.chunk)
                yield transcript

    async def _learn_channel(self) -> None:
        await self._read(30.0, lambda: self._opening is not None, count=1)
        if self._opening is not None and self._opening.error:
            raise SpeechError(self._opening.error)

    async def _read(self, timeout_s: float, enough: Callable[[], bool], count: int = CHUNK_READ) -> None:
        """Read more replies into ``_received``, unless ``enough`` holds once it is this call's turn to read."""
        async with self._reading:
            if enough():
                return
            reply = cast(_StreamReply, await self._redis.xread({self.reply_channel: self._last_id}, count=count,
                                                               block=max(1, round(timeout_s * 1000))))
            if not reply:
                raise SpeechError(f"no reply from model '{self.model}' within {timeout_s:g} s")
            for message_id, fields in reply[0][1]:
                self._last_id = message_id.decode()
                transcript = self._transcript(fields)
                if self._opening is None:
                    self._opening = transcript
                self._received.append(transcript)

    def _transcript(self, fields: dict[bytes, bytes]) -> Transcript:
        chunk = int(fields.get(b"h.request-id", b"-1").decode().rsplit("-", 1)[-1])
        body = orjson.loads(fields[b"d"])
        now = time.monotonic()
        if "error" in body:
            return Transcript(chunk, "", False, 0, 0, 0, now, error=str(body["error"]))
        channel = body.get("parameters", {}).get("sequence_channel")
        if chunk == 0 and channel:
            self._channel = channel
        out = {o["name"]: o["data"][0] for o in body["outputs"]}
        return Transcript(chunk, out["TEXT"], bool(out["IS_FINAL"]), int(out["START_MS"]), int(out["END_MS"]),
                          int(out["AUDIO_MS"]), now)


def read_wav(path: Path) -> np.ndarray:
    """16 kHz mono PCM16 samples of a WAV file; anything else is refused, naming the file."""
    with wave.open(str(path)) as wav:
        shape = (wav.getframerate(), wav.getnchannels(), wav.getsampwidth())
        if shape != (SAMPLE_RATE, 1, 2):
            raise SpeechError(f"{path}: {shape[0]} Hz, {shape[1]} channel(s), {8 * shape[2]}-bit; "
                              f"ferry's speech model takes 16 kHz mono 16-bit PCM")
        return np.frombuffer(wav.readframes(wav.getnframes()), "<i2")


async def stream_samples(session: SpeechSession, samples: np.ndarray, chunk_ms: int = 160,
                         realtime: bool = True) -> None:
    """Send ``samples`` in ``chunk_ms`` chunks, at the pace they were spoken when ``realtime``."""
    size = SAMPLE_RATE * chunk_ms // 1000
    pieces = [samples[i:i + size] for i in range(0, max(len(samples), 1), size)]
    began = time.monotonic()
    for index, piece in enumerate(pieces):
        if realtime:
            await asyncio.sleep(max(0.0, began + index * chunk_ms / 1000 - time.monotonic()))
        await session.send(piece, end=index == len(pieces) - 1)
