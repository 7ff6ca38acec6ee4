"""Tree models (XGBoost, LightGBM, scikit-learn forests), configured as for
Triton's FIL backend (``backend: "fil"``), run on the CPU.

One FP32 input ``[batch, features]``; one FP32 output ``[batch, 1]`` (a class
id, or a regressor's value), or ``[batch, classes]`` with ``predict_proba``.
Parameters, as Triton's FIL backend names them (strings, as in any config):

    model_type     xgboost | xgboost_json | xgboost_ubj | lightgbm |
                   treelite_checkpoint (default xgboost); it names the file:
                   xgboost.model, xgboost.json, xgboost.ubj, model.txt, checkpoint.tl
    output_class   "true" for a classifier (``is_classifier`` is the newer name)
    predict_proba  "true": one probability per class instead of the class id;
                   a binary model gives [p] with dims [1], [1 - p, p] with dims [2]
    threshold      a binary classifier's decision threshold (default 0.5)

and ferry's own: ``runtime`` (``auto``, the default, or one of native, gtil,
tl2cgen, onnx: see ``tree_runtimes``), ``nthread`` (threads per instance),
``tl2cgen_cache_dir`` (where compiled models are kept).

``auto`` follows benchmarks/bench_trees.py: each request batch goes to the
runtime measured fastest for its size and model kind (``AUTO_RUNTIMES``).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType

import numpy as np
import structlog

from workers.backends.base import ModelContext
from workers.backends.tree_runtimes import MODEL_FILENAMES, RUNTIMES, ForestFile, TreeRuntime, open_runtime
from workers.errors import InvalidInput, ModelLoadError

log = structlog.get_logger("ferry.backend.fil")

_TRUE, _FALSE = ("true", "1", "yes"), ("false", "0", "no")


@dataclass(frozen=True, slots=True)
class AutoChoice:
    """Batches of up to ``small_rows`` rows run on ``small``, larger ones on ``large``."""

    small: str
    large: str
    small_rows: int


# Figures: benchmarks/README.md, "bench_trees.py" (2 cores, 300 trees of depth 8, 50 features).
AUTO_RUNTIMES: Mapping[str, AutoChoice] = MappingProxyType({
    "xgboost": AutoChoice("onnx", "native", 64),
    "xgboost_json": AutoChoice("onnx", "native", 64),
    "xgboost_ubj": AutoChoice("onnx", "native", 64),
    "lightgbm": AutoChoice("onnx", "onnx", 0),
    "treelite_checkpoint": AutoChoice("onnx", "onnx", 0),
})


@dataclass(frozen=True, slots=True)
class TreeSettings:
    model_type: str
    classifier: bool
    predict_proba: bool
    threshold: float
    runtime: str
    threads: int
    cache_dir: Path | None

    @classmethod
    def of(cls, context: ModelContext) -> TreeSettings:
        params = context.parameters
        model_type = params.get("model_type", "xgboost")
        if model_type not in MODEL_FILENAMES:
            raise _config_error(context, "parameters.model_type",
                                f"'{model_type}' is unknown (known: {', '.join(MODEL_FILENAMES)})")
        runtime = params.get("runtime", "auto")
        if runtime != "auto" and runtime not in RUNTIMES:
            raise _config_error(context, "parameters.runtime",
                                f"'{runtime}' is unknown (known: auto, {', '.join(RUNTIMES)})")
        cache = params.get("tl2cgen_cache_dir")
        return cls(
            model_type=model_type,
            classifier=_flag(context, "output_class", params.get("output_class", params.get("is_classifier"))),
            predict_proba=_flag(context, "predict_proba", params.get("predict_proba")),
            threshold=_number(context, "threshold", params.get("threshold", "0.5")),
            runtime=runtime,
            threads=_threads(context),
            cache_dir=Path(cache) if cache else None,
        )


def model_filename(model_type: str) -> str:
    """The file a model_type is read from unless default_model_filename says otherwise."""
    return MODEL_FILENAMES[model_type]


class TreeBackend:
    def __init__(self, context: ModelContext) -> None:
        self._context = context
        self._settings = TreeSettings.of(context)
        self._small: TreeRuntime | None = None
        self._large: TreeRuntime | None = None
        self._small_rows = 0
        self._classes = 1
        self._input = ""
        self._output = ""

    def load(self) -> None:
        self._input, self._output = _tensor_names(self._context)
        choice = self._choice()
        forest = ForestFile(self._settings.model_type, self._context.model_file,
                            self._settings.threads, self._settings.cache_dir)
        self._small = open_runtime(choice.small, forest)
        self._large = self._small if choice.large == choice.small else open_runtime(choice.large, forest)
        self._small_rows = choice.small_rows
        self._check_features(self._small.num_features)
        self._classes = self._small.predict(np.zeros((1, self._small.num_features), np.float32)).shape[1]
        self._check_output_dims()
        log.info("fil.loaded", model=self._context.name, version=self._context.version,
                 model_type=self._settings.model_type, runtime_small=choice.small,
                 runtime_large=choice.large, small_rows=choice.small_rows, threads=self._settings.threads)

    def infer(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        assert self._small is not None and self._large is not None, "infer() before load()"
        features = self._features(inputs)
        runtime = self._small if features.shape[0] <= self._small_rows else self._large
        return {self._output: self._shape_output(runtime.predict(features))}

    def unload(self) -> None:
        for runtime in {id(r): r for r in (self._small, self._large) if r is not None}.values():
            runtime.close()
        self._small = self._large = None

    def _choice(self) -> AutoChoice:
        if self._settings.runtime == "auto":
            return AUTO_RUNTIMES[self._settings.model_type]
        return AutoChoice(self._settings.runtime, self._settings.runtime, 0)

    def _features(self, inputs: dict[str, np.ndarray]) -> np.ndarray:
        array = inputs.get(self._input)
        if array is None:
            raise InvalidInput(f"model '{self._context.name}' expects input '{self._input}'")
        assert self._small is not None
        width = self._small.num_features
        if array.ndim != 2 or array.shape[1] != width:
            raise InvalidInput(f"input '{self._input}': shape {list(array.shape)}; model "
                               f"'{self._context.name}' takes [batch, {width}] features")
        if array.dtype != np.float32:
            raise InvalidInput(f"input '{self._input}': datatype {array.dtype}, expected FP32")
        return np.ascontiguousarray(array)

    def _shape_output(self, scores: np.ndarray) -> np.ndarray:
        settings = self._settings
        if not settings.classifier:
            return scores
        if settings.predict_proba:
            return np.hstack([1 - scores, scores]) if self._binary_as_two_columns() else scores
        if scores.shape[1] == 1:
            return (scores > settings.threshold).astype(np.float32)
        if scores.shape[1] == 2:
            return (scores[:, 1:] > settings.threshold).astype(np.float32)
        return np.argmax(scores, axis=1).astype(np.float32).reshape(-1, 1)

    def _binary_as_two_columns(self) -> bool:
        return self._classes == 1 and self._output_width() == 2

    def _output_width(self) -> int:
        spec = self._context.config.output(self._output)
        assert spec is not None
        return spec.dims[-1]

    def _check_features(self, width: int) -> None:
        spec = self._context.config.input(self._input)
        assert spec is not None
        if spec.dims[-1] not in (-1, width):
            raise _config_error(self._context, "input[0].dims",
                                f"{list(spec.dims)} does not end in the model's {width} features")

    def _check_output_dims(self) -> None:
        settings, width = self._settings, self._output_width()
        if settings.classifier and settings.predict_proba:
            allowed = {self._classes, 2} if self._classes == 1 else {self._classes}
        else:
            allowed = {1} if settings.classifier else {self._classes}
        if width != -1 and width not in allowed:
            what = "class probabilities" if settings.classifier and settings.predict_proba else "values"
            raise _config_error(self._context, "output[0].dims",
                                f"ends in {width}, but the model gives {sorted(allowed)[0]} {what} per row")


def _tensor_names(context: ModelContext) -> tuple[str, str]:
    config = context.config
    if len(config.inputs) != 1 or len(config.outputs) != 1:
        raise _config_error(context, "input", "a fil model has exactly one input and one output "
                                              "(input__0 and output__0 in Triton's examples)")
    for field, tensor in (("input[0]", config.inputs[0]), ("output[0]", config.outputs[0])):
        if tensor.datatype != "FP32":
            raise _config_error(context, f"{field}.data_type", f"must be TYPE_FP32, not {tensor.datatype}")
        rank = 1 if config.max_batch_size > 0 else 2
        if len(tensor.dims) != rank:
            raise _config_error(context, f"{field}.dims", f"{list(tensor.dims)} must have {rank} dimension(s)"
                                " (rows are the batch dimension)")
    return config.inputs[0].name, config.outputs[0].name


def _flag(context: ModelContext, name: str, value: str | None) -> bool:
    if value is None or value.lower() in _FALSE:
        return False
    if value.lower() in _TRUE:
        return True
    raise _config_error(context, f"parameters.{name}", f"expected \"true\" or \"false\", got {value!r}")


def _number(context: ModelContext, name: str, value: str) -> float:
    try:
        return float(value)
    except ValueError:
        raise _config_error(context, f"parameters.{name}", f"expected a number, got {value!r}") from None


def _threads(context: ModelContext) -> int:
    given = context.parameters.get("nthread")
    if given is not None:
        if not given.isdigit() or int(given) < 1:
            raise _config_error(context, "parameters.nthread", f"expected a positive integer, got {given!r}")
        return int(given)
    return max(1, (os.cpu_count() or 1) // max(1, context.config.instance_count))


def _config_error(context: ModelContext, field: str, message: str) -> ModelLoadError:
    config_path = context.version_dir.parent / "config.pbtxt"
    return ModelLoadError(f"{config_path}: field '{field}': {message}")
