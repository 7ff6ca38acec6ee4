"""Runtimes that score a tree ensemble on the CPU.

Each runtime turns FP32 features ``[n, f]`` into FP32 scores ``[n, k]``: the
probability of the positive class for a binary classifier (k = 1), one
probability per class for a multi-class one, the predicted value(s) for a
regressor. NaN is a missing value, routed as the training library routes it.

    native    the training library's own predict (xgboost, lightgbm)
    gtil      Treelite's general tree inference library
    tl2cgen   the model compiled to C by TL2cgen, built with gcc into a
              shared library cached by the model file's hash
    onnx      the Treelite model converted to one ONNX tree-ensemble node
              (``tree_onnx``) and run by ONNX Runtime

Model files are read by their library's own parser (XGBoost JSON/UBJSON or
binary, LightGBM text, a Treelite checkpoint); nothing here ever unpickles.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Any, Protocol

import numpy as np

from workers.errors import ModelLoadError

# Triton FIL backend's model types and the file each one expects by default.
MODEL_FILENAMES: Mapping[str, str] = MappingProxyType({
    "xgboost": "xgboost.model",
    "xgboost_json": "xgboost.json",
    "xgboost_ubj": "xgboost.ubj",
    "lightgbm": "model.txt",
    "treelite_checkpoint": "checkpoint.tl",
})
RUNTIMES = ("native", "gtil", "tl2cgen", "onnx")
_PICKLE_SUFFIXES = (".pkl", ".pickle", ".joblib", ".sav")


@dataclass(frozen=True, slots=True)
class ForestFile:
    model_type: str
    path: Path
    threads: int
    cache_dir: Path | None = None   # for tl2cgen's compiled libraries


class TreeRuntime(Protocol):
    num_features: int

    def predict(self, features: np.ndarray) -> np.ndarray: ...

    def close(self) -> None: ...


def open_runtime(runtime: str, forest: ForestFile) -> TreeRuntime:
    """Load ``forest`` into ``runtime``; ModelLoadError naming the file on failure."""
    refuse_pickle(forest.path)
    try:
        opener = _OPENERS[runtime]
    except KeyError:
        raise ModelLoadError(f"{forest.path}: runtime '{runtime}' is unknown "
                             f"(known: {', '.join(RUNTIMES)})") from None
    try:
        return opener(forest)
    except ModelLoadError:
        raise
    except ImportError as err:
        raise ModelLoadError(f"{forest.path}: runtime '{runtime}' needs {err.name or err}, which is not "
                             "installed; install it with: pip install 'ferry[trees]'") from None
    except Exception as exc:
        raise ModelLoadError(f"{forest.path}: the {runtime} runtime could not load this "
                             f"{forest.model_type} model: {exc}") from None


def fil_model_filename(raw_config: Mapping[str, Any]) -> str:
    """The model file of a parsed ``backend: "fil"`` config; ValueError naming the field at fault."""
    given = raw_config.get("default_model_filename")
    if isinstance(given, str) and given:
        if Path(given).suffix.lower() in _PICKLE_SUFFIXES:
            raise ValueError(f"default_model_filename: {given!r} is a pickle, which ferry never loads; "
                             "export the model as a Treelite checkpoint (see workers/offline/trees_export.py)")
        return given
    entries = raw_config.get("parameters") or []
    entries = entries if isinstance(entries, list) else [entries]
    model_type = next((e.get("value", {}).get("string_value") for e in entries
                       if isinstance(e, dict) and e.get("key") == "model_type"), "xgboost")
    if model_type not in MODEL_FILENAMES:
        raise ValueError(f"parameters.model_type: {model_type!r} is unknown (known: {', '.join(MODEL_FILENAMES)})")
    return MODEL_FILENAMES[model_type]


def refuse_pickle(path: Path) -> None:
    """Pickles run code when loaded; a tree model must come in a data format."""
    try:
        with open(path, "rb") as file:
            head = file.read(2)
    except OSError as err:
        raise ModelLoadError(f"{path}: cannot read the model file: {err.strerror or err}") from None
    is_pickle = len(head) == 2 and head[0] == 0x80 and 2 <= head[1] <= 5
    if is_pickle or path.suffix.lower() in _PICKLE_SUFFIXES:
        raise ModelLoadError(
            f"{path}: looks like a Python pickle; ferry never unpickles models. Export scikit-learn "
            "forests as a Treelite checkpoint (python -m workers.offline.trees_export MODEL.pkl checkpoint.tl, "
            "run where you trust the pickle) and set model_type to treelite_checkpoint")


def _scores(raw: Any, rows: int) -> np.ndarray:
    return np.ascontiguousarray(np.asarray(raw, dtype=np.float32).reshape(rows, -1))


# --- native ---------------------------------------------------------------

class _XGBoostNative:
    def __init__(self, forest: ForestFile) -> None:
        self._booster = load_xgboost(forest.path, forest.threads)
        self.num_features = self._booster.num_features()

    def predict(self, features: np.ndarray) -> np.ndarray:
        raw = self._booster.inplace_predict(features, validate_features=False)
        return _scores(raw, features.shape[0])

    def close(self) -> None:
        self._booster = None


class _LightGBMNative:
    def __init__(self, forest: ForestFile) -> None:
        import lightgbm

        self._booster: Any = lightgbm.Booster(model_file=str(forest.path))
        self._threads = forest.threads
        self.num_features = self._booster.num_feature()

    def predict(self, features: np.ndarray) -> np.ndarray:
        raw = self._booster.predict(features, num_threads=self._threads)
        return _scores(raw, features.shape[0])

    def close(self) -> None:
        self._booster = None


def load_xgboost(path: Path, threads: int) -> Any:
    import xgboost

    # From a buffer XGBoost tells JSON, UBJSON and its old binary format apart by
    # content; from a path it goes by the suffix, and warns for xgboost.model.
    booster = xgboost.Booster(params={"nthread": threads})
    booster.load_model(bytearray(path.read_bytes()))
    return booster


def _native(forest: ForestFile) -> TreeRuntime:
    if forest.model_type.startswith("xgboost"):
        return _XGBoostNative(forest)
    if forest.model_type == "lightgbm":
        return _LightGBMNative(forest)
    raise ModelLoadError(f"{forest.path}: runtime 'native' has no library for {forest.model_type} "
                         "models; use gtil or tl2cgen")


# --- treelite: gtil and tl2cgen ----------------------------------------------

def load_treelite(forest: ForestFile) -> Any:
    import treelite

    path, kind = str(forest.path), forest.model_type
    if kind == "lightgbm":
        return treelite.frontend.load_lightgbm_model(path)
    if kind == "treelite_checkpoint":
        return treelite.Model.deserialize(path)
    if kind in ("xgboost_json", "xgboost_ubj", "xgboost"):
        return _load_xgboost_treelite(forest.path, kind)
    raise ModelLoadError(f"{forest.path}: model_type '{kind}' is unknown")


def _load_xgboost_treelite(path: Path, kind: str) -> Any:
    import treelite

    head = path.read_bytes()[:2]
    # XGBoost >= 2.1 writes UBJSON under any name but .json, xgboost.model included.
    if kind == "xgboost_json" or head == b'{"':
        return treelite.frontend.load_xgboost_model(str(path), format_choice="json")
    if kind == "xgboost_ubj" or head[:1] == b"{":
        return treelite.frontend.load_xgboost_model(str(path), format_choice="ubjson")
    return treelite.frontend.load_xgboost_model_legacy_binary(str(path))


class _Gtil:
    def __init__(self, forest: ForestFile) -> None:
        self._model = load_treelite(forest)
        self._threads = forest.threads
        self.num_features = self._model.num_feature

    def predict(self, features: np.ndarray) -> np.ndarray:
        import treelite

        return _scores(treelite.gtil.predict(self._model, features, nthread=self._threads), features.shape[0])

    def close(self) -> None:
        self._model = None


class _Tl2cgen:
    def __init__(self, forest: ForestFile) -> None:
        import tl2cgen

        model = load_treelite(forest)
        self.num_features = model.num_feature
        library = compiled_library(forest, model)
        self._predictor: Any = tl2cgen.Predictor(str(library), nthread=forest.threads)

    def predict(self, features: np.ndarray) -> np.ndarray:
        import tl2cgen

        raw = self._predictor.predict(tl2cgen.DMatrix(features, missing=np.nan))
        return _scores(raw, features.shape[0])

    def close(self) -> None:
        self._predictor = None


def compiled_library(forest: ForestFile, model: Any) -> Path:
    """The model compiled by gcc, built once per model file content and reused."""
    import tl2cgen

    cache = forest.cache_dir or Path(tempfile.gettempdir()) / "ferry-tl2cgen"
    cache.mkdir(parents=True, exist_ok=True)
    digest = hashlib.sha256(forest.path.read_bytes() + tl2cgen.__version__.encode()).hexdigest()[:24]
    library = cache / f"{digest}.so"
    if library.is_file():
        return library
    partial = cache / f"{digest}.{os.getpid()}.tmp.so"
    params = {"parallel_comp": max(1, forest.threads)}
    tl2cgen.export_lib(model, toolchain="gcc", libpath=str(partial), params=params, nthread=forest.threads)
    os.replace(partial, library)   # atomic: another instance may compile the same model
    return library


# --- onnx -------------------------------------------------------------------

class _Onnx:
    def __init__(self, forest: ForestFile) -> None:
        import onnxruntime as ort

        from workers.backends.tree_onnx import UnsupportedTrees, convert

        try:
            onnx_model, self._postprocess, self.num_features = convert(load_treelite(forest))
        except UnsupportedTrees as err:
            raise ModelLoadError(f"{forest.path}: runtime 'onnx' cannot run {err}; use native or gtil") from None
        options = ort.SessionOptions()
        options.intra_op_num_threads = forest.threads
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
        options.log_severity_level = 3
        self._session = ort.InferenceSession(onnx_model.SerializeToString(), sess_options=options,
                                             providers=["CPUExecutionProvider"])

    def predict(self, features: np.ndarray) -> np.ndarray:
        (margin,) = self._session.run(["margin"], {"input": features})
        return _scores(self._postprocess(margin), features.shape[0])

    def close(self) -> None:
        self._session = None


_OPENERS: Mapping[str, Callable[[ForestFile], TreeRuntime]] = MappingProxyType({
    "native": _native,
    "gtil": _Gtil,
    "tl2cgen": _Tl2cgen,
    "onnx": _Onnx,
})
