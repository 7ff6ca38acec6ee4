"""Whether a frame of audio is speech."""

from __future__ import annotations

import math

import numpy as np

SPEECH_MARGIN_DB = 9.0  # over the noise floor
SPEECH_MIN_DB = 30.0  # the quietest speech, an RMS of about 32 (-60 dBFS)
FLOOR_RISE = 0.05  # how far the floor moves towards a louder non-speech frame
FLOOR_RISE_IN_SPEECH = 0.002  # ... and towards speech, so that a lasting rise in noise stops counting as speech


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
