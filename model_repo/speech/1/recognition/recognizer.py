"""One step of one session: find where utterances begin and end, and decode them."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .decoders import DecoderPool, feed, hypothesis
from .detection import classify
from .settings import FRAME, IDLE_KEEP, ONSET_FRAMES, PREROLL, Settings
from .state import Pending, Session, decode_state, encode_state


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
    """With ``rescore_final``, an utterance the first pass ends is heard a second time, with
    the cepstral mean it taught the decoder, before it is final. That second pass is spread
    over the steps that follow, ``second_pass_pace`` samples of the utterance for each sample
    a step brings (all of it at the session's END), so no one step pays for a whole utterance
    and stalls the sessions that share the instance. Until it ends, steps show the first
    pass's words as a partial."""

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
        second = None if session.pending is None else self._pool.resume_second(corrid, state_in, session.pending)
        first_frame = session.framed
        session.append(chunk)
        decoder, ended = self._hear(session, decoder, first_frame)
        if end and session.in_speech:
            ended.append(self._end_first_pass(session, decoder, session.consumed))
            decoder = None
        budget = None if end else self._settings.second_pass_pace * (len(chunk) // 2)
        second, finals = self._second_pass(session, second, ended, budget)
        result = self._result(session, decoder, finals, end)
        if end:
            return result, b""
        if not session.in_speech:
            session.trim(session.framed - IDLE_KEEP)
        state_out = encode_state(session)
        if decoder is not None:
            self._pool.keep(corrid, decoder, state_out)
        if second is not None:
            self._pool.keep_second(corrid, second, state_out)
        return result, state_out

    def _hear(self, session: Session, decoder: Any, first_frame: int) -> tuple[Any, list[Pending]]:
        """Classify the chunk's whole frames, starting and ending utterances as they go."""
        ended = []
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
                feed(decoder, session.samples(fed, frame_end))
                ended.append(self._end_first_pass(session, decoder, frame_end))
                decoder, fed = None, frame_end
        if decoder is not None:
            feed(decoder, session.samples(fed, session.framed))
        return decoder, ended

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

    def _end_first_pass(self, session: Session, decoder: Any, heard_to: int) -> Pending:
        """End the utterance, whose audio the decoder has heard up to `heard_to`."""
        feed(decoder, session.samples(session.framed, heard_to))
        decoder.end_utt()
        text, cmn = hypothesis(decoder), decoder.get_cmn()
        self._pool.release(decoder)
        # The first pass heard the utterance with the mean of earlier ones, at a session's
        # start the model's generic prior; a second pass with the mean this utterance
        # updated recognises many more words of a voice far from that prior.
        audio = session.samples(session.audio_start, heard_to) if self._settings.rescore_final else b""
        ended = Pending(text, cmn, audio, start=session.speech_start, end=session.speech_end)
        session.cmn, session.in_speech, session.silence_run = cmn, False, 0
        return ended

    def _second_pass(self, session: Session, decoder: Any, ended: list[Pending],
                     budget: int | None) -> tuple[Any, list[Utterance]]:
        """Hear up to `budget` samples (None: all) of the utterances in their second pass, the
        one in progress first. Only the last may stay unfinished: an earlier one is finished
        whatever the budget, as the state holds one. Its decoder, and the finals."""
        if not self._settings.rescore_final:
            return decoder, [Utterance(utterance.text, utterance.start, utterance.end) for utterance in ended]
        queue = ([session.pending] if session.pending is not None else []) + ended
        session.pending, finals = None, []
        for index, pending in enumerate(queue):
            if decoder is None:
                decoder = self._pool.begin(pending.cmn)
            left = pending.length - pending.fed
            take = left if budget is None or index < len(queue) - 1 else min(left, budget)
            feed(decoder, pending.audio[2 * pending.fed:2 * (pending.fed + take)])
            pending.fed += take
            if budget is not None:
                budget = max(0, budget - take)
            if pending.fed < pending.length:
                session.pending = pending
                break
            decoder.end_utt()
            finals.append(Utterance(hypothesis(decoder), pending.start, pending.end))
            self._pool.release(decoder)
            decoder = None
        return decoder, finals

    def _result(self, session: Session, decoder: Any, finals: list[Utterance], end: bool) -> Result:
        received = session.consumed
        if finals:
            text = " ".join(final.text for final in finals if final.text)
            return Result(text, True, finals[0].start, finals[-1].end, received)
        # What is heard and not yet final: the utterance in its second pass, then the one in progress.
        spans = [(session.pending.text, session.pending.start, session.pending.end)] if session.pending else []
        if session.in_speech:
            spans.append((hypothesis(decoder), session.speech_start, session.speech_end))
        if not spans:
            return Result("", end, received, received, received)
        text = " ".join(words for words, _, _ in spans if words)
        return Result(text, False, spans[0][1], spans[-1][2], received)
