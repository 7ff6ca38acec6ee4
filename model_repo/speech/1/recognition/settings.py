"""The recognizer's fixed framing, and the settings a model config's parameters choose."""

from __future__ import annotations

from dataclasses import dataclass

SAMPLE_RATE = 16_000
FRAME = 480  # samples the speech detector classifies at once: 30 ms
ONSET_FRAMES = 3  # speech frames in a row that begin an utterance
PREROLL = 10 * FRAME  # audio the decoder hears before an onset, so the first phone is whole
IDLE_KEEP = PREROLL + ONSET_FRAMES * FRAME


@dataclass(frozen=True, slots=True)
class Settings:
    max_chunk_samples: int = 2 * SAMPLE_RATE
    max_live_decoders: int = 8
    end_silence_ms: int = 600
    max_utterance_ms: int = 15_000
    rescore_final: bool = True
    # Samples of an ended utterance its second pass hears per sample a step brings: 3 finishes
    # a 2.5 s utterance about 0.8 s of audio after its endpoint, for about 3x a first pass's
    # cost per step meanwhile, rather than all of it in the endpoint's step.
    second_pass_pace: int = 3
    # PocketSphinx settings: phone lookahead and a cap on active HMMs per frame make decoding
    # about twice as cheap, with the same words on the speech tests' sentences (topn=2 would
    # save more, but loses words: "open" became "opened").
    decoder_options: tuple[tuple[str, str], ...] = (("pl_window", "5"), ("maxhmmpf", "10000"))

    @classmethod
    def from_parameters(cls, parameters: dict[str, str]) -> Settings:
        defaults = cls()
        numbers = {name: _positive_int(parameters, name, getattr(defaults, name))
                   for name in ("max_chunk_samples", "max_live_decoders", "end_silence_ms", "max_utterance_ms",
                                "second_pass_pace")}
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
