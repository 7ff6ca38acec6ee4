"""A session between steps, and its bytes in STATE_IN and STATE_OUT.

The state is enough to rebuild the decoder in a fresh process: the audio of
the utterance in progress (from a little before it began), the speech
detector's counters and noise floor, the cepstral mean the utterance
started from, and an ended utterance still in its second pass (its audio, the
mean it taught the decoder, and how much of it the second pass has heard).
Once an utterance is final its audio leaves the state.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import msgpack

from .settings import FRAME, Settings

STATE_VERSION = 2
STR_MAX_CHARS = 4096  # a cepstral mean is about 200; a first pass's words are cut to fit


@dataclass(slots=True)
class Pending:
    """An utterance the first pass has ended, in its second pass. Positions as Session's."""

    text: str  # the first pass's words, shown as a partial until the final
    cmn: str  # the mean the utterance taught the first pass: the second pass starts from it
    audio: bytes  # the utterance's audio, from a little before its onset
    fed: int = 0  # samples of `audio` the second pass has heard
    start: int = 0  # the speech within it
    end: int = 0

    @property
    def length(self) -> int:
        return len(self.audio) // 2


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
    pending: Pending | None = None  # the utterance in its second pass, if any

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
        session.noise_floor, _pending_fields(session.pending),
    ])


def _pending_fields(pending: Pending | None) -> list[Any] | None:
    if pending is None:
        return None
    return [pending.text[:STR_MAX_CHARS], pending.cmn, pending.audio, pending.fed, pending.start, pending.end]


def decode_state(blob: bytes, settings: Settings) -> Session:
    try:
        fields = msgpack.unpackb(blob, raw=False, max_bin_len=settings.max_state_audio_bytes,
                                 max_str_len=STR_MAX_CHARS, max_array_len=16, max_map_len=0, max_ext_len=0)
        version, *values = fields
        if version == 1:
            values.append(None)  # written before second passes were spread over steps: none in progress
        *values, pending = values
        session = Session(*values, pending=None if pending is None else Pending(*pending))
    except (ValueError, TypeError, msgpack.UnpackException) as exc:
        raise ValueError(f"input 'STATE_IN' is not a speech session state: {exc}") from None
    problem = _state_problem(version, session)
    if problem:
        raise ValueError(f"input 'STATE_IN' is not a speech session state: {problem}")
    return session


def _state_problem(version: Any, session: Session) -> str | None:
    if version not in (1, STATE_VERSION):
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
    if session.pending is not None and (problem := _pending_problem(session.pending)):
        return f"its utterance in the second pass: {problem}"
    return _cmn_problem(session.cmn)


def _pending_problem(pending: Pending) -> str | None:
    if not all(type(count) is int and count >= 0 for count in (pending.fed, pending.start, pending.end)):
        return "a position is not a non-negative integer"
    if not isinstance(pending.text, str) or not isinstance(pending.cmn, str) or not isinstance(pending.audio, bytes):
        return "a field has the wrong type"
    if pending.fed > pending.length or pending.start > pending.end:
        return "its positions lie outside its audio"
    return _cmn_problem(pending.cmn)


def _cmn_problem(cmn: str) -> str | None:
    try:
        [float(value) for value in cmn.split(",")]
    except ValueError:
        return f"cepstral mean {cmn!r} is not a list of numbers"
    return None
