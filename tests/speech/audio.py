"""Speech to feed the speech model: espeak-ng's voice, as 16 kHz mono PCM16."""

from __future__ import annotations

import hashlib
import io
import shutil
import subprocess
import wave
from pathlib import Path

import numpy as np

SAMPLE_RATE = 16_000
ESPEAK = shutil.which("espeak-ng")


def speak(text: str, cache_dir: Path, words_per_minute: int = 150) -> np.ndarray:
    """`text` as espeak-ng's en-us voice says it, cached in `cache_dir` as a 16 kHz WAV."""
    key = hashlib.sha256(f"{words_per_minute}:{text}".encode()).hexdigest()[:16]
    path = cache_dir / f"{key}.wav"
    if not path.exists():
        if ESPEAK is None:
            raise FileNotFoundError("espeak-ng is not on the PATH")
        wav = subprocess.run([ESPEAK, "-v", "en-us", "-s", str(words_per_minute), "--stdout", text],
                             capture_output=True, check=True).stdout
        write_wav(path, resample(*read_wav(wav)))
    return read_wav(path.read_bytes())[0]


def silence(ms: int) -> np.ndarray:
    return np.zeros(SAMPLE_RATE * ms // 1000, np.int16)


def chunks(samples: np.ndarray, ms: int) -> list[np.ndarray]:
    """`samples` cut into pieces of `ms` milliseconds, the last one shorter; at least one piece."""
    size = SAMPLE_RATE * ms // 1000
    return [samples[begin:begin + size] for begin in range(0, max(len(samples), 1), size)]


def resample(samples: np.ndarray, rate: int) -> np.ndarray:
    """Linear interpolation: crude, but espeak's voice has little above 8 kHz to alias."""
    count = len(samples) * SAMPLE_RATE // rate
    positions = np.arange(count) * (rate / SAMPLE_RATE)
    resampled = np.interp(positions, np.arange(len(samples)), samples.astype(np.float64))
    return np.clip(np.round(resampled), -32768, 32767).astype(np.int16)


def read_wav(data: bytes) -> tuple[np.ndarray, int]:
    with wave.open(io.BytesIO(data)) as wav:
        if wav.getnchannels() != 1 or wav.getsampwidth() != 2:
            raise ValueError("expected mono 16-bit PCM")
        return np.frombuffer(wav.readframes(wav.getnframes()), "<i2").astype(np.int16), wav.getframerate()


def write_wav(path: Path, samples: np.ndarray) -> None:
    partial = path.with_suffix(".partial")
    with wave.open(str(partial), "wb") as wav:
        wav.setnchannels(1)
        wav.setsampwidth(2)
        wav.setframerate(SAMPLE_RATE)
        wav.writeframes(samples.astype("<i2").tobytes())
    partial.replace(path)
