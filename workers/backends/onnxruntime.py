"""ONNX Runtime backend: CPU, or CUDA and TensorRT execution providers for GPU
instances (``workers.backends.onnxruntime_providers`` chooses them and fails
the load when one is missing)."""

from __future__ import annotations

import os

import numpy as np
import onnxruntime as ort
import structlog

from workers.backends.base import ModelContext
from workers.backends.onnxruntime_providers import check_active, choose_providers
from workers.errors import InvalidInput, ModelLoadError

log = structlog.get_logger("ferry.backend.onnxruntime")


class OnnxRuntimeBackend:
    def __init__(self, context: ModelContext) -> None:
        self._context = context
        self._session: ort.InferenceSession | None = None
        self._string_inputs: set[str] = set()
        config = context.config
        # Worked out once, not per request: what each call asks for and reshapes.
        self._output_names = [o.name for o in config.outputs] + list(config.state_outputs)
        self._input_reshapes = {i.name: tuple(i.reshape.shape) for i in config.inputs if i.reshape is not None}
        self._output_reshapes = {o.name: tuple(o.dims) for o in config.outputs if o.reshape is not None}
        self._batched = config.max_batch_size > 0

    def load(self) -> None:
        options = self._session_options()
        context = self._context
        providers = choose_providers(context.config, context.instance, context.instance_index,
                                     ort.get_available_providers())
        try:
            self._session = ort.InferenceSession(str(context.model_file), sess_options=options, providers=providers)
        except Exception as exc:
            raise ModelLoadError(f"{context.model_file}: onnxruntime could not load it: {exc}") from None
        dropped = check_active(context.config, context.instance, providers, self._session.get_providers())
        if dropped:
            log.warning("onnxruntime.provider_unavailable", model=context.name, dropped=dropped,
                        kind=context.instance.kind, active=self._session.get_providers())
        self._string_inputs = {i.name for i in self._session.get_inputs() if i.type == "tensor(string)"}
        log.info("onnxruntime.loaded", model=self._context.name, version=self._context.version,
                 providers=self._session.get_providers())

    def infer(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        assert self._session is not None, "infer() before load()"
        feed = {name: self._prepare(name, array) for name, array in inputs.items()}
        names = self._output_names
        results = self._session.run(names, feed)
        if not self._output_reshapes:
            return dict(zip(names, results))
        return {name: self._reshape_output(name, value) for name, value in zip(names, results)}

    def unload(self) -> None:
        self._session = None

    def _session_options(self) -> ort.SessionOptions:
        options = ort.SessionOptions()
        params = self._context.parameters
        count = max(1, self._context.config.instance_count)
        default_threads = max(1, (os.cpu_count() or 1) // count) if count > 1 else 0
        options.intra_op_num_threads = int(params.get("intra_op_thread_count", default_threads))
        options.inter_op_num_threads = int(params.get("inter_op_thread_count", 0))
        # ORT's pool threads spin while they wait for work; in a server they
        # spin on the cores the HTTP stack and the event loop need, so ferry
        # turns it off unless a model's parameters ask for it.
        spinning = params.get("allow_spinning", "false").lower() in ("1", "true", "yes")
        options.add_session_config_entry("session.intra_op.allow_spinning", "1" if spinning else "0")
        options.log_severity_level = 3
        return options

    def _prepare(self, name: str, array: np.ndarray) -> np.ndarray:
        reshape = self._input_reshapes.get(name)
        if reshape is not None:
            array = array.reshape(self._batch_prefix(array) + reshape)
        if name in self._string_inputs:
            try:
                return np.vectorize(_to_str, otypes=[object])(array) if array.size else array
            except UnicodeDecodeError:
                raise InvalidInput(f"input '{name}': BYTES element is not valid UTF-8, "
                                   "which an ONNX string tensor requires") from None
        return array

    def _reshape_output(self, name: str, value: np.ndarray) -> np.ndarray:
        dims = self._output_reshapes.get(name)
        return value if dims is None else value.reshape(self._batch_prefix(value) + dims)

    def _batch_prefix(self, array: np.ndarray) -> tuple[int, ...]:
        return (array.shape[0],) if self._batched else ()


def _to_str(element: object) -> str:
    return element.decode("utf-8") if isinstance(element, bytes) else str(element)
