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

This module is the backend seam: tensors in, tensors out. The recognizer
itself, and how a session's state lets another process resume it, is the
``recognition`` package beside it.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np


def _import_beside(package: str) -> ModuleType:
    """A package in this folder, as a subpackage of this module.

    Ferry's Python backend imports model.py by path, under a name unique to each instance,
    and puts no folder on sys.path, so the package is imported the same way, under a name
    of this module's. Modules of an earlier load of that name go first, so that a model
    reloaded after an edit reads its files again."""
    name = f"{__name__}.{package}"
    for stale in [module for module in sys.modules if module == name or module.startswith(f"{name}.")]:
        del sys.modules[stale]
    spec = importlib.util.spec_from_file_location(name, Path(__file__).with_name(package) / "__init__.py")
    if spec is None or spec.loader is None:
        raise ImportError(f"no package {package!r} beside {__file__}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


_recognition = _import_beside("recognition")
SAMPLE_RATE = _recognition.SAMPLE_RATE
Recognizer, Result, Settings = _recognition.Recognizer, _recognition.Result, _recognition.Settings


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
