"""A session between steps, and its bytes in STATE_IN and STATE_OUT.

The state is enough to rebuild the decoder in a fresh process: the audio of
the utterance in progress (from a little before it began), the speech
detector's counters and noise floor, and the cepstral mean the utterance
started from. Once an utterance is final its audio leaves the state.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import msgpack

from .settings import FRAME, Settings

STATE_VERSION = 1
CMN_MAX_CHARS = 1024


@dataclass(slots=True)
class Session:
    """One session between steps. Positions count samples from the session's first."""

    cmn: str  # cepstral mean the next utterance starts from, as Decoder.get_cmn() writes it
    consumed: int = 0  # samples received
    audio_start: int = 0  # position of audio[0]; audio runs to `consumed`
    audio: bytes = b""  # int16 little-endian
    in_speech: bool = False
    speech_run: int = 0  # speech frames in a row, while waiting for an onset
    silence_run: int = 0  # non-speech frames in a row, within an utterance
    speech_start: int = 0
    speech_end: int = 0
    noise_floor: float | None = None  # dB; None until the first frame

    @property
    def framed(self) -> int:
        """Frames are aligned to the session's start; a tail shorter than one waits for the next chunk."""
        return self.consumed // FRAME * FRAME

    def samples(self, begin: int, end: int) -> bytes:
        return self.audio[2 * (begin - self.audio_start):2 * (end - self.audio_start)]

    def append(self, chunk: bytes) -> None:
        self.audio += chunk
        self.consumed += len(chunk) // 2

    def trim(self, position: int) -> None:
        if position > self.audio_start:
            self.audio = self.samples(position, self.consumed)
            self.audio_start = position


def encode_state(session: Session) -> bytes:
    return msgpack.packb([
        STATE_VERSION, session.cmn, session.consumed, session.audio_start, session.audio,
        session.in_speech, session.speech_run, session.silence_run, session.speech_start, session.speech_end,
        session.noise_floor,
    ])


def decode_state(blob: bytes, settings: Settings) -> Session:
    try:
        fields = msgpack.unpackb(blob, raw=False, max_bin_len=settings.max_state_audio_bytes,
                                 max_str_len=CMN_MAX_CHARS, max_array_len=16, max_map_len=0, max_ext_len=0)
        version, *values = fields
        session = Session(*values)
    except (ValueError, TypeError, msgpack.UnpackException) as exc:
        raise ValueError(f"input 'STATE_IN' is not a speech session state: {exc}") from None
    problem = _state_problem(version, session)
    if problem:
        raise ValueError(f"input 'STATE_IN' is not a speech session state: {problem}")
    return session


def _state_problem(version: Any, session: Session) -> str | None:
    if version != STATE_VERSION:
        return f"version {version!r}, expected {STATE_VERSION}"
    counts = (session.consumed, session.audio_start, session.speech_run, session.silence_run,
              session.speech_start, session.speech_end)
    if not all(type(count) is int and count >= 0 for count in counts):
        return "a position or count is not a non-negative integer"
    if not isinstance(session.cmn, str) or not isinstance(session.audio, bytes) or type(session.in_speech) is not bool:
        return "a field has the wrong type"
    floor = session.noise_floor
    if floor is not None and not (type(floor) is float and math.isfinite(floor)):
        return f"noise floor {floor!r} is not a finite number"
    if session.audio_start + len(session.audio) / 2 != session.consumed:
        return "its audio does not end where the session does"
    if session.in_speech and not session.audio_start <= session.speech_start <= session.speech_end <= session.framed:
        return "its utterance lies outside its audio"
    try:
        [float(value) for value in session.cmn.split(",")]
    except ValueError:
        return f"cepstral mean {session.cmn!r} is not a list of numbers"
    return None
