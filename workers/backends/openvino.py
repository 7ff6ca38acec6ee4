"""OpenVINO backend, on the CPU: IR (``model.xml`` beside ``model.bin``) or
ONNX (``default_model_filename: "model.onnx"`` with ``backend: "openvino"``).

Each instance compiles its own copy of the model and keeps one infer request.
Tensors bind by name. A batching model whose file fixes the batch size gets
its first dimension made dynamic before compiling, so the dynamic batcher's
batches fit. Parameters: ``inference_num_threads`` (default: the cores shared
among the model's instances), ``inference_precision`` (default ``f32``; the
CPU plugin would otherwise pick bf16 where the CPU has it, changing results)
and ``num_streams`` (default 1).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np
import openvino as ov
import structlog

from workers.backends.base import ModelContext
from workers.errors import ExecutionError, ModelLoadError

log = structlog.get_logger("ferry.backend.openvino")

DEVICE = "CPU"


class OpenVinoBackend:
    def __init__(self, context: ModelContext) -> None:
        self._context = context
        self._compiled: Any = None
        self._request: Any = None

    def load(self) -> None:
        path = self._context.model_file
        if not path.is_file():
            raise ModelLoadError(f"{path}: missing (the openvino backend reads model.xml with model.bin, or ONNX)")
        if self._context.instance.kind == "KIND_GPU":
            raise ModelLoadError(f"{path}: instance group '{self._context.instance.name}' is KIND_GPU, "
                                 "but ferry's openvino backend runs on the CPU only")
        core = ov.Core()
        try:
            model = core.read_model(str(path))
        except Exception as exc:  # noqa: BLE001 - OpenVINO raises RuntimeError of many kinds
            raise ModelLoadError(f"{path}: openvino could not read it: {_first_line(exc)}") from None
        self._check_names(path, model)
        self._make_batch_dynamic(model)
        try:
            self._compiled = core.compile_model(model, DEVICE, self._properties())
        except Exception as exc:  # noqa: BLE001
            raise ModelLoadError(f"{path}: openvino could not compile it for {DEVICE}: {_first_line(exc)}") from None
        self._request = self._compiled.create_infer_request()
        log.info("openvino.loaded", model=self._context.name, version=self._context.version,
                 file=path.name, device=DEVICE)

    def infer(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        assert self._request is not None, "infer() before load()"
        feed = {name: np.ascontiguousarray(array) for name, array in inputs.items()}
        names = [o.name for o in self._context.config.outputs] + list(self._context.config.state_outputs)
        try:
            results = self._request.infer(feed)
            return {name: np.array(results[self._compiled.output(name)]) for name in names}
        except Exception as exc:  # noqa: BLE001 - a model's failure fails this batch, never the worker
            raise ExecutionError(f"model '{self._context.name}': openvino inference failed: "
                                 f"{_first_line(exc)}") from None

    def unload(self) -> None:
        self._request = None
        self._compiled = None

    def _check_names(self, path: Path, model: Any) -> None:
        config = self._context.config
        for kind, ports, wanted in (("input", model.inputs, [i.name for i in config.inputs]),
                                    ("output", model.outputs, [o.name for o in config.outputs])):
            known = {name for port in ports for name in port.get_names()}
            missing = [name for name in wanted if name not in known]
            if missing:
                raise ModelLoadError(f"{path}: the model has no {kind} '{missing[0]}' "
                                     f"(its {kind}s: {', '.join(sorted(known))})")

    def _make_batch_dynamic(self, model: Any) -> None:
        config = self._context.config
        if config.max_batch_size <= 0:
            return
        shapes: dict[str, Any] = {}
        for port in model.inputs:
            shape = port.get_partial_shape()
            if shape.rank.is_static and len(shape) > 0 and shape[0].is_static:
                shape[0] = ov.Dimension(1, config.max_batch_size)
                shapes[port.get_any_name()] = shape
        if shapes:
            model.reshape(shapes)

    def _properties(self) -> dict[str, str]:
        params = self._context.parameters
        count = max(1, self._context.config.instance_count)
        threads = params.get("inference_num_threads", str(max(1, (os.cpu_count() or 1) // count)))
        return {
            "INFERENCE_NUM_THREADS": threads,
            "INFERENCE_PRECISION_HINT": params.get("inference_precision", "f32"),
            "NUM_STREAMS": params.get("num_streams", "1"),
        }


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
