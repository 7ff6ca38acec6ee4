"""The Python backend: a version directory's ``model.py`` defines ``Model``.

    class Model:
        def load(self, context: ModelContext) -> None: ...
        def infer(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]: ...
        def unload(self) -> None: ...

Tensors go in and out by name as numpy arrays (BYTES as object arrays of
bytes), batched along dimension 0 when the model batches. A ``ValueError``
from ``infer`` means the request's input is invalid. The input arrays belong to
ferry and may be rewritten by the instance's next batch: copy what you keep.

A decoupled model (``model_transaction_policy { decoupled: true }``) gets one
request at a time, and its ``infer`` returns an iterable (a generator, say)
of output dicts: each is one response, and there may be none.

A ``model.py`` written for Triton's Python backend (``class TritonPythonModel``,
importing ``triton_python_backend_utils``) is served as it is, through
``workers.backends.triton_python``.
"""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Iterable, Iterator
from typing import Any

import numpy as np

from workers.backends.base import ModelContext
from workers.backends.triton_python import pb_utils
from workers.backends.triton_python.adapter import CLASS_NAME, TritonPythonBackend
from workers.errors import ExecutionError, InvalidInput, ModelLoadError


class PythonBackend:
    calls_models = True  # a Triton model's BLS requests wait on the worker's event loop: never run on it

    def __init__(self, context: ModelContext) -> None:
        self._context = context
        self._model: Any = None
        self._triton: TritonPythonBackend | None = None

    def load(self) -> None:
        module = self._import()
        triton_class = getattr(module, CLASS_NAME, None)
        if triton_class is not None and "class_name" not in self._context.parameters \
                and not hasattr(module, "Model"):
            self._triton = TritonPythonBackend(self._context, triton_class)
            self._triton.load()
            return
        model_class = getattr(module, self._context.parameters.get("class_name", "Model"), None)
        if model_class is None or not callable(getattr(model_class, "infer", None)):
            raise ModelLoadError(f"{self._context.model_file}: defines no class 'Model' with an infer method")
        try:
            model = model_class()
            if hasattr(model, "load"):
                model.load(self._context)
        except Exception as exc:
            raise ModelLoadError(f"{self._context.model_file}: load() failed: {exc!r}") from None
        self._model = model

    def infer(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        if self._triton is not None:
            return self._triton.infer(inputs)
        assert self._model is not None, "infer() before load()"
        try:
            outputs = self._model.infer(inputs)
        except ValueError as exc:
            raise InvalidInput(f"model '{self._context.name}': {exc}") from None
        return self._arrays(outputs)

    def infer_stream(self, inputs: dict[str, np.ndarray]) -> Iterator[dict[str, np.ndarray]]:
        if self._triton is not None:
            yield from self._triton.infer_stream(inputs)
            return
        assert self._model is not None, "infer_stream() before load()"
        try:
            responses = self._model.infer(inputs)
            if isinstance(responses, dict) or not isinstance(responses, Iterable):
                raise ExecutionError(f"model '{self._context.name}' is decoupled: infer() must return an "
                                     f"iterable of output dicts, not {type(responses).__name__}")
            for outputs in responses:
                yield self._arrays(outputs)
        except ValueError as exc:
            raise InvalidInput(f"model '{self._context.name}': {exc}") from None

    def _arrays(self, outputs: Any) -> dict[str, np.ndarray]:
        if not isinstance(outputs, dict):
            raise ExecutionError(f"model '{self._context.name}': infer() returned "
                                 f"{type(outputs).__name__}, not a dict of arrays")
        return {name: np.asarray(value) for name, value in outputs.items()}

    def unload(self) -> None:
        if self._triton is not None:
            self._triton.unload()
            self._triton = None
        if self._model is not None and hasattr(self._model, "unload"):
            self._model.unload()
        self._model = None

    def _import(self) -> Any:
        path = self._context.model_file
        module_name = f"ferry_model_{self._context.name}_{self._context.version}_{self._context.instance_index}"
        spec = importlib.util.spec_from_file_location(module_name, path)
        if spec is None or spec.loader is None:
            raise ModelLoadError(f"{path}: not an importable Python file")
        module = importlib.util.module_from_spec(spec)
        sys.modules[module_name] = module
        pb_utils.make_importable()
        try:
            spec.loader.exec_module(module)
        except Exception as exc:
            sys.modules.pop(module_name, None)
            raise ModelLoadError(f"{path}: import failed: {exc!r}") from None
        return module
