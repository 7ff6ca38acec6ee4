"""PocketSphinx decoders, pooled among sessions.

A ``Decoder`` costs about 90 MB and 0.6 s to create, so decoders are pooled:
a session holds one only while an utterance is in progress, and when all
``max_live_decoders`` are held the least recently used is taken back; that
session rebuilds one from its state on its next step. An ended utterance's
second pass holds a decoder of its own, bound beside the first pass's.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

import pocketsphinx

from .state import Pending, Session


def _new_decoder(options: tuple[tuple[str, str], ...]) -> Any:
    try:
        return pocketsphinx.Decoder(loglevel="FATAL", **dict(options))
    except KeyError as exc:
        raise ValueError(f"parameter 'decoder_options': PocketSphinx has no setting {exc}") from None


def feed(decoder: Any, audio: bytes) -> None:
    if audio:  # process_raw raises IndexError on an empty buffer
        decoder.process_raw(audio)


def hypothesis(decoder: Any) -> str:
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
        decoder = self._take_bound(corrid, state_in, session.in_speech)
        if decoder is not None or not session.in_speech:
            return decoder
        decoder = self.begin(session.cmn)
        feed(decoder, session.samples(session.audio_start, session.framed))
        return decoder

    def resume_second(self, corrid: Any, state_in: bytes, pending: Pending) -> Any:
        """The decoder that has heard the first ``pending.fed`` samples of the second pass."""
        decoder = self._take_bound(_second(corrid), state_in)
        if decoder is not None:
            return decoder
        decoder = self.begin(pending.cmn)
        feed(decoder, pending.audio[:2 * pending.fed])
        return decoder

    def _take_bound(self, key: Any, state_in: bytes, usable: bool = True) -> Any | None:
        """The decoder bound under ``key``, lent to the step now, if it is ``usable`` and was
        left at ``state_in``; a binding that is not is abandoned."""
        binding = self._bound.pop(key, None)
        if binding is None:
            return None
        if usable and binding[1] == state_in:
            self._lent.append(binding[0])
            return binding[0]
        self._abandon(binding[0])
        return None

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

    def keep_second(self, corrid: Any, decoder: Any, state_out: bytes) -> None:
        self.keep(_second(corrid), decoder, state_out)

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
        for key in (corrid, _second(corrid)):
            binding = self._bound.pop(key, None)
            if binding is not None:
                self._abandon(binding[0])

    def close(self) -> None:
        self._bound.clear()
        self._idle.clear()

    def _acquire(self) -> Any:
        if self._idle:
            decoder = self._idle.pop()
        elif self._created < self._capacity or not self._bound:
            # Past capacity only when a step holds both of its passes' decoders and there is
            # nothing bound to take back: one more, kept idle afterwards.
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


def _second(corrid: Any) -> tuple[Any, str]:
    """The key a session's second-pass decoder is bound under."""
    return (corrid, "second pass")
