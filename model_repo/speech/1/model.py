"""speech: streaming speech recognition with PocketSphinx, one session per sequence.

AUDIO (INT16 [-1], 16 kHz mono PCM) -> TEXT (BYTES [1], UTF-8), IS_FINAL (BOOL
[1]), START_MS, END_MS, AUDIO_MS (INT64 [1]).

The sequence batcher runs it: every row of a batch is one step of a different
session, with the controls START, END, READY and CORRID and the implicit state
STATE_IN -> STATE_OUT. A row's TEXT is the utterance in progress (a partial)
or, with IS_FINAL, an utterance that ended: after ``end_silence_ms`` of
non-speech, after ``max_utterance_ms``, or at the session's END, whose row is
always final. START_MS..END_MS is the speech TEXT covers, AUDIO_MS all the
audio the session has sent.

The state is enough to rebuild the decoder in a fresh process: the audio of
the utterance in progress (from a little before it began), the speech
detector's counters and noise floor, and the cepstral mean the utterance
started from. Once an utterance is final its audio leaves the state.

A ``Decoder`` costs about 90 MB and 0.6 s to create, so decoders are pooled:
a session holds one only while an utterance is in progress, and when all
``max_live_decoders`` are held the least recently used is taken back; that
session rebuilds one from its state on its next step.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

import msgpack
import numpy as np
import pocketsphinx

SAMPLE_RATE = 16_000
FRAME = 480  # samples the speech detector classifies at once: 30 ms
SPEECH_MARGIN_DB = 9.0  # over the noise floor
SPEECH_MIN_DB = 30.0  # the quietest speech, an RMS of about 32 (-60 dBFS)
FLOOR_RISE = 0.05  # how far the floor moves towards a louder non-speech frame
FLOOR_RISE_IN_SPEECH = 0.002  # ... and towards speech, so that a lasting rise in noise stops counting as speech
ONSET_FRAMES = 3  # speech frames in a row that begin an utterance
PREROLL = 10 * FRAME  # audio the decoder hears before an onset, so the first phone is whole
IDLE_KEEP = PREROLL + ONSET_FRAMES * FRAME
STATE_VERSION = 1
CMN_MAX_CHARS = 1024


@dataclass(frozen=True, slots=True)
class Settings:
    max_chunk_samples: int = 2 * SAMPLE_RATE
    max_live_decoders: int = 8
    end_silence_ms: int = 600
    max_utterance_ms: int = 15_000
    rescore_final: bool = True
    # PocketSphinx settings: phone lookahead and a cap on active HMMs per frame make decoding
    # about twice as cheap, with the same words on the speech tests' sentences (topn=2 would
    # save more, but loses words: "open" became "opened").
    decoder_options: tuple[tuple[str, str], ...] = (("pl_window", "5"), ("maxhmmpf", "10000"))

    @classmethod
    def from_parameters(cls, parameters: dict[str, str]) -> Settings:
        defaults = cls()
        numbers = {name: _positive_int(parameters, name, getattr(defaults, name))
                   for name in ("max_chunk_samples", "max_live_decoders", "end_silence_ms", "max_utterance_ms")}
        rescore = parameters.get("rescore_final", "true").strip().lower()
        if rescore not in ("true", "false"):
            raise ValueError(f"parameter 'rescore_final' is {rescore!r}; use true or false")
        return cls(**numbers, rescore_final=rescore == "true",
                   decoder_options=_decoder_options(parameters["decoder_options"])
                   if "decoder_options" in parameters else defaults.decoder_options)

    @property
    def end_silence_frames(self) -> int:
        return max(1, self.end_silence_ms * SAMPLE_RATE // 1000 // FRAME)

    @property
    def max_utterance_samples(self) -> int:
        return self.max_utterance_ms * SAMPLE_RATE // 1000

    @property
    def max_state_audio_bytes(self) -> int:
        return 2 * (self.max_utterance_samples + IDLE_KEEP + self.max_chunk_samples)


def _positive_int(parameters: dict[str, str], name: str, default: int) -> int:
    text = parameters.get(name, str(default))
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise ValueError(f"parameter {name!r} is {text!r}; expected a positive integer")
    return value


def _decoder_options(text: str) -> tuple[tuple[str, str], ...]:
    """``"topn=2 pl_window=5"`` -> (("topn", "2"), ("pl_window", "5"))."""
    options = []
    for item in text.split():
        name, sep, value = item.partition("=")
        if not sep or not name or not value:
            raise ValueError(f"parameter 'decoder_options': {item!r} is not name=value")
        options.append((name, value))
    return tuple(options)


# ---- session state -------------------------------------------------------------------------------

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


# ---- speech detection ----------------------------------------------------------------------------

def classify(frame: bytes, noise_floor: float | None) -> tuple[bool, float]:
    """Whether a frame is speech, and the noise floor after it.

    A level detector whose whole state is one number, so that the session
    state carries it. WebRTC's detector (pocketsphinx.Vad) hears better in
    noise, but it adapts inside C where no state can reach it, and rebuilt
    from nothing it hears a resumed session differently.
    """
    samples = np.frombuffer(frame, "<i2").astype(np.int64)
    # Integer energy: a float dot product's rounding may differ on the machine that resumes.
    level = 10 * math.log10(int(np.dot(samples, samples)) / len(samples) + 1.0)
    floor = level if noise_floor is None else noise_floor
    speech = level > max(floor + SPEECH_MARGIN_DB, SPEECH_MIN_DB)
    if level < floor:
        return speech, level
    return speech, floor + (FLOOR_RISE_IN_SPEECH if speech else FLOOR_RISE) * (level - floor)


# ---- decoders ------------------------------------------------------------------------------------

def _new_decoder(options: tuple[tuple[str, str], ...]) -> Any:
    try:
        return pocketsphinx.Decoder(loglevel="FATAL", **dict(options))
    except KeyError as exc:
        raise ValueError(f"parameter 'decoder_options': PocketSphinx has no setting {exc}") from None


def _feed(decoder: Any, audio: bytes) -> None:
    if audio:  # process_raw raises IndexError on an empty buffer
        decoder.process_raw(audio)


def _hypothesis(decoder: Any) -> str:
    hyp = decoder.hyp()
    return hyp.hypstr if hyp is not None else ""


class DecoderPool:
    """Decoders lent to sessions with an utterance in progress, keyed by CORRID.

    A bound decoder is always inside an utterance; an idle one never is; a
    lent one belongs to the step in progress, which keeps or releases it. Each
    binding remembers the state it was left at, so a step that arrives with
    any other state (a retried step, a session that moved processes and came
    back) rebuilds instead of continuing from the wrong place.
    """

    def __init__(self, capacity: int, options: tuple[tuple[str, str], ...] = ()) -> None:
        # Made up front so a broken install fails load(); the rest come on demand, up to
        # capacity, because most deployments never need all of them at 90 MB each.
        self._options = options
        first = _new_decoder(options)
        self.initial_cmn: str = first.get_cmn()
        self._capacity = capacity
        self._created = 1
        self._idle: list[Any] = [first]
        self._lent: list[Any] = []
        self._bound: OrderedDict[Any, tuple[Any, bytes]] = OrderedDict()

    def resume(self, corrid: Any, state_in: bytes, session: Session) -> Any | None:
        """The decoder that has heard the session's utterance in progress, or None when there is none."""
        binding = self._bound.pop(corrid, None)
        if binding is not None and session.in_speech and binding[1] == state_in:
            self._lent.append(binding[0])
            return binding[0]
        if binding is not None:
            self._abandon(binding[0])
        if not session.in_speech:
            return None
        decoder = self.begin(session.cmn)
        _feed(decoder, session.samples(session.audio_start, session.framed))
        return decoder

    def begin(self, cmn: str) -> Any:
        decoder = self._acquire()
        # Always starting from the mean's text form, rounded as it is, makes a decoder rebuilt
        # from the state hear exactly what the original heard.
        decoder.set_cmn(cmn)
        decoder.start_utt()
        return decoder

    def keep(self, corrid: Any, decoder: Any, state_out: bytes) -> None:
        self._lent.remove(decoder)
        self._bound[corrid] = (decoder, state_out)

    def release(self, decoder: Any) -> None:
        """Take back a decoder whose utterance has ended."""
        self._lent.remove(decoder)
        self._idle.append(decoder)

    def reclaim(self) -> None:
        """Take back what a failed step left lent, so that a failure cannot shrink the pool."""
        while self._lent:
            decoder = self._lent.pop()
            try:
                decoder.end_utt()
            except RuntimeError:  # it was between utterances
                pass
            self._idle.append(decoder)

    def forget(self, corrid: Any) -> None:
        binding = self._bound.pop(corrid, None)
        if binding is not None:
            self._abandon(binding[0])

    def close(self) -> None:
        self._bound.clear()
        self._idle.clear()

    def _acquire(self) -> Any:
        if self._idle:
            decoder = self._idle.pop()
        elif self._created < self._capacity:
            decoder = _new_decoder(self._options)
            self._created += 1
        else:
            _, (decoder, _) = self._bound.popitem(last=False)
            decoder.end_utt()
        self._lent.append(decoder)
        return decoder

    def _abandon(self, decoder: Any) -> None:
        decoder.end_utt()
        self._idle.append(decoder)


# ---- recognition ---------------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class Utterance:
    text: str
    start: int  # samples
    end: int


@dataclass(frozen=True, slots=True)
class Result:
    text: str
    is_final: bool
    start: int  # samples, as are the rest
    end: int
    received: int


class Recognizer:
    def __init__(self, settings: Settings) -> None:
        self._settings = settings
        self._pool = DecoderPool(settings.max_live_decoders, settings.decoder_options)

    def close(self) -> None:
        self._pool.close()

    def step(self, corrid: Any, state_in: bytes, chunk: bytes, start: bool, end: bool) -> tuple[Result, bytes]:
        try:
            return self._step(corrid, state_in, chunk, start, end)
        finally:
            self._pool.reclaim()

    def _step(self, corrid: Any, state_in: bytes, chunk: bytes, start: bool, end: bool) -> tuple[Result, bytes]:
        if start:
            self._pool.forget(corrid)
            state_in = b""
        session = decode_state(state_in, self._settings) if state_in else Session(cmn=self._pool.initial_cmn)
        decoder = self._pool.resume(corrid, state_in, session)
        first_frame = session.framed
        session.append(chunk)
        decoder, finals = self._hear(session, decoder, first_frame)
        if end and session.in_speech:
            finals.append(self._finish(session, decoder, session.consumed))
            decoder = None
        result = self._result(session, decoder, finals, end)
        if end:
            return result, b""
        if not session.in_speech:
            session.trim(session.framed - IDLE_KEEP)
        state_out = encode_state(session)
        if decoder is not None:
            self._pool.keep(corrid, decoder, state_out)
        return result, state_out

    def _hear(self, session: Session, decoder: Any, first_frame: int) -> tuple[Any, list[Utterance]]:
        """Classify the chunk's whole frames, starting and finishing utterances as they go."""
        finals = []
        fed = first_frame  # the decoder, when there is one, has heard everything before this
        for frame_end in range(first_frame + FRAME, session.framed + 1, FRAME):
            speech, session.noise_floor = classify(session.samples(frame_end - FRAME, frame_end), session.noise_floor)
            if not session.in_speech:
                if self._onset(session, speech, frame_end):
                    decoder, fed = self._pool.begin(session.cmn), session.audio_start
                continue
            session.silence_run = 0 if speech else session.silence_run + 1
            session.speech_end = frame_end if speech else session.speech_end
            if self._endpoint(session, frame_end):
                _feed(decoder, session.samples(fed, frame_end))
                finals.append(self._finish(session, decoder, frame_end))
                decoder, fed = None, frame_end
        if decoder is not None:
            _feed(decoder, session.samples(fed, session.framed))
        return decoder, finals

    def _onset(self, session: Session, speech: bool, frame_end: int) -> bool:
        session.speech_run = session.speech_run + 1 if speech else 0
        if session.speech_run < ONSET_FRAMES:
            return False
        session.in_speech, session.speech_run, session.silence_run = True, 0, 0
        session.speech_start, session.speech_end = frame_end - ONSET_FRAMES * FRAME, frame_end
        session.trim(session.speech_start - PREROLL)
        return True

    def _endpoint(self, session: Session, frame_end: int) -> bool:
        return (session.silence_run >= self._settings.end_silence_frames
                or frame_end - session.audio_start >= self._settings.max_utterance_samples)

    def _finish(self, session: Session, decoder: Any, heard_to: int) -> Utterance:
        """End the utterance, whose audio the decoder has heard up to `heard_to`."""
        _feed(decoder, session.samples(session.framed, heard_to))
        decoder.end_utt()
        text, cmn = _hypothesis(decoder), decoder.get_cmn()
        if self._settings.rescore_final:
            # The first pass heard the utterance with the mean of earlier ones, at a session's
            # start the model's generic prior; a second pass with the mean this utterance
            # updated recognises many more words of a voice far from that prior.
            decoder.set_cmn(cmn)
            decoder.start_utt()
            _feed(decoder, session.samples(session.audio_start, heard_to))
            decoder.end_utt()
            text = _hypothesis(decoder)
        self._pool.release(decoder)
        session.cmn, session.in_speech, session.silence_run = cmn, False, 0
        return Utterance(text, session.speech_start, session.speech_end)

    def _result(self, session: Session, decoder: Any, finals: list[Utterance], end: bool) -> Result:
        received = session.consumed
        if finals:
            text = " ".join(final.text for final in finals if final.text)
            return Result(text, True, finals[0].start, finals[-1].end, received)
        if session.in_speech:
            return Result(_hypothesis(decoder), False, session.speech_start, session.speech_end, received)
        return Result("", end, received, received, received)


# ---- the backend seam ----------------------------------------------------------------------------

class Model:
    def load(self, context: Any) -> None:
        self._settings = Settings.from_parameters(dict(context.parameters))
        self._recognizer = Recognizer(self._settings)

    def infer(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        audio = _audio(inputs, self._settings.max_chunk_samples)
        rows = audio.shape[0]
        start, end, ready = (_flags(inputs, name, rows) for name in ("START", "END", "READY"))
        corrids, states = _column(inputs, "CORRID", rows), _column(inputs, "STATE_IN", rows)
        results, states_out = [], []
        for row in range(rows):
            if not ready[row]:
                results.append(Result("", False, 0, 0, 0))
                states_out.append(states[row])
                continue
            result, state_out = self._recognizer.step(
                _key(corrids[row]), _blob(states[row]), audio[row].astype("<i2").tobytes(), start[row], end[row])
            results.append(result)
            states_out.append(state_out)
        return _outputs(results, states_out)

    def unload(self) -> None:
        self._recognizer.close()


def _input(inputs: dict[str, np.ndarray], name: str) -> np.ndarray:
    if name not in inputs:
        raise ValueError(f"missing input {name!r}")
    return np.asarray(inputs[name])


def _audio(inputs: dict[str, np.ndarray], max_samples: int) -> np.ndarray:
    audio = _input(inputs, "AUDIO")
    if audio.dtype != np.int16 or audio.ndim != 2:
        raise ValueError(f"input 'AUDIO' must be INT16 [batch, samples], got {audio.dtype} {list(audio.shape)}")
    if audio.shape[1] > max_samples:
        raise ValueError(f"input 'AUDIO' has {audio.shape[1]} samples per row; "
                         f"max_chunk_samples allows {max_samples}")
    return audio


def _column(inputs: dict[str, np.ndarray], name: str, rows: int) -> np.ndarray:
    values = _input(inputs, name)
    if values.shape not in ((rows,), (rows, 1)):
        raise ValueError(f"input {name!r} has shape {list(values.shape)}; expected [{rows}, 1]")
    return values.reshape(rows)


def _flags(inputs: dict[str, np.ndarray], name: str, rows: int) -> list[bool]:
    return [bool(value) for value in _column(inputs, name, rows)]


def _key(corrid: Any) -> bytes:
    if isinstance(corrid, bytes):
        return bytes(corrid)
    return str(corrid).encode()


def _blob(state: Any) -> bytes:
    if not isinstance(state, bytes):
        raise ValueError(f"input 'STATE_IN' holds {type(state).__name__}, not bytes")
    return bytes(state)


def _outputs(results: list[Result], states_out: list[bytes]) -> dict[str, np.ndarray]:
    def column(values: list[Any], dtype: Any) -> np.ndarray:
        array = np.empty((len(values), 1), dtype=dtype)
        array[:, 0] = values
        return array

    def ms(samples: int) -> int:
        return samples * 1000 // SAMPLE_RATE

    return {
        "TEXT": column([result.text.encode() for result in results], object),
        "IS_FINAL": column([result.is_final for result in results], np.bool_),
        "START_MS": column([ms(result.start) for result in results], np.int64),
        "END_MS": column([ms(result.end) for result in results], np.int64),
        "AUDIO_MS": column([ms(result.received) for result in results], np.int64),
        "STATE_OUT": column(states_out, object),
    }
