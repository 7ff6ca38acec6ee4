"""The TensorFlow backend: a SavedModel (``platform: "tensorflow_savedmodel"``) on the CPU.

The version directory holds ``model.savedmodel/`` (or ``default_model_filename``), a
SavedModel directory. Its ``serve`` graph is loaded with ``tf.saved_model.load`` and
called through one signature, ``serving_default`` unless ``parameters { key:
"TF_SIGNATURE_DEF" ... }`` names another; the config's input and output names are the
signature's keys, as in Triton. A batch goes in as the signature's keyword arguments
and its outputs come back as numpy arrays (BYTES as object arrays of ``bytes``).

TensorFlow (``pip install 'ferry[tensorflow]'``, which brings ``tensorflow-cpu``) is
imported only when such a model loads. Its thread pools are sized once per process:
intra-op to the cores this process may use, inter-op to 1 per instance group count,
since the worker already runs one batch per instance at a time.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np
import tensorflow as tf

from workers.backends.base import ModelContext
from workers.errors import ExecutionError, InvalidInput, ModelLoadError
from workers.repository.savedmodel import DEFAULT_SIGNATURE, SERVE_TAG

SIGNATURE_PARAMETER = "TF_SIGNATURE_DEF"


class TensorFlowBackend:
    def __init__(self, context: ModelContext) -> None:
        self._context = context
        self._loaded: Any = None
        self._function: Any = None
        self._inputs: dict[str, tf.dtypes.DType] = {}

    def load(self) -> None:
        path = self._context.model_file
        signature = self._context.parameters.get(SIGNATURE_PARAMETER, DEFAULT_SIGNATURE)
        if not path.is_dir():
            raise ModelLoadError(f"model '{self._context.name}': {path} is not a SavedModel directory")
        _size_thread_pools()
        try:
            loaded = tf.saved_model.load(str(path), tags=[SERVE_TAG])
        except Exception as exc:  # TensorFlow raises many kinds; none is ferry's to tell apart
            raise ModelLoadError(f"model '{self._context.name}': TensorFlow cannot load {path}: {exc}") from None
        if signature not in loaded.signatures:
            known = ", ".join(sorted(loaded.signatures)) or "none"
            raise ModelLoadError(f"model '{self._context.name}': the SavedModel has no signature '{signature}' "
                                 f"(it has {known})")
        self._loaded, self._function = loaded, loaded.signatures[signature]
        _, specs = self._function.structured_input_signature
        self._inputs = {name: spec.dtype for name, spec in specs.items()}

    def infer(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        assert self._function is not None, "infer() before load()"
        feed = {}
        for name, array in inputs.items():
            dtype = self._inputs.get(name)
            if dtype is None:
                raise InvalidInput(f"model '{self._context.name}': the signature has no input '{name}'")
            feed[name] = tf.constant(array, dtype=dtype)
        try:
            outputs = self._function(**feed)
        except tf.errors.InvalidArgumentError as exc:
            raise InvalidInput(f"model '{self._context.name}': {exc.message}") from None
        except Exception as exc:
            raise ExecutionError(f"model '{self._context.name}': {type(exc).__name__}: {exc}") from None
        return {name: _array(tensor) for name, tensor in outputs.items()}

    def unload(self) -> None:
        self._function = None
        self._loaded = None


def _array(tensor: Any) -> np.ndarray:
    array = tensor.numpy()
    return array.astype(object) if array.dtype.kind == "S" else np.asarray(array)


_sized = False


def _size_thread_pools() -> None:
    global _sized
    if _sized:
        return
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    try:
        tf.config.threading.set_intra_op_parallelism_threads(cores)
        tf.config.threading.set_inter_op_parallelism_threads(1)
    except RuntimeError:
        pass  # TensorFlow was already running in this process: its pools stay as they are
    _sized = True
