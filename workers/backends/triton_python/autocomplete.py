"""Triton's ``auto_complete_config`` for Python models: before the config is
checked, a ``TritonPythonModel`` may fill in what its ``config.pbtxt`` leaves
out (inputs, outputs, ``max_batch_size``, dynamic batching, the transaction
policy) through the object Triton passes it.

What the config already says wins: an input or output it names is not added
again, and a ``max_batch_size`` it sets is kept unless the model asks for the
same; a conflict is the model's error, as in Triton. The model's module is
imported in the process reading the repository (the gateway too), so that
every process sees the same completed config.
"""

from __future__ import annotations

import copy
import importlib.util
from pathlib import Path
from typing import Any

from workers.backends.triton_python import pb_utils
from workers.backends.triton_python.adapter import CLASS_NAME
from workers.errors import ConfigError


class AutoCompleteModelConfig:
    """What ``auto_complete_config`` is given: the config so far, and Triton's setters."""

    def __init__(self, raw: dict[str, Any]) -> None:
        self._raw = raw

    def as_dict(self) -> dict[str, Any]:
        return copy.deepcopy(self._raw)

    def set_max_batch_size(self, size: int) -> None:
        given = self._raw.get("max_batch_size", 0)
        if given and given != size:
            raise pb_utils.TritonModelException(
                f"configuration specified max_batch_size {given}, but in auto-complete-config function "
                f"for model '{self._raw.get('name')}' specified max_batch_size {size}")
        self._raw["max_batch_size"] = int(size)

    def set_dynamic_batching(self) -> None:
        self._raw.setdefault("dynamic_batching", {})

    def add_input(self, tensor: dict[str, Any]) -> None:
        self._add("input", tensor)

    def add_output(self, tensor: dict[str, Any]) -> None:
        self._add("output", tensor)

    def set_model_transaction_policy(self, policy: dict[str, Any]) -> None:
        given = self._raw.get("model_transaction_policy")
        if given and given != policy:
            raise pb_utils.TritonModelException(
                f"configuration specified model_transaction_policy {given}, but auto-complete-config asks for "
                f"{policy}")
        self._raw["model_transaction_policy"] = dict(policy)

    def _add(self, kind: str, tensor: dict[str, Any]) -> None:
        if not isinstance(tensor, dict) or not isinstance(tensor.get("name"), str):
            raise pb_utils.TritonModelException(f"add_{kind}() takes a dict with a 'name', got {tensor!r}")
        missing = [key for key in ("data_type", "dims") if key not in tensor]
        if missing:
            raise pb_utils.TritonModelException(f"{kind} '{tensor['name']}' in auto-complete-config function "
                                                f"is missing '{missing[0]}'")
        tensors = self._raw.setdefault(kind, [])
        if any(t.get("name") == tensor["name"] for t in tensors):
            return  # the config's own description stands
        tensors.append({**tensor, "dims": list(tensor["dims"])})


def needs_completion(model_file: Path) -> bool:
    try:
        return "auto_complete_config" in model_file.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return False


def complete(config_path: Path, raw: dict[str, Any], model_file: Path) -> dict[str, Any]:
    """``raw`` as the model's ``auto_complete_config`` completes it (unchanged without one)."""
    model_class = _model_class(config_path, model_file)
    method = getattr(model_class, "auto_complete_config", None) if model_class is not None else None
    if method is None:
        return raw
    completed = AutoCompleteModelConfig(copy.deepcopy(raw))
    try:
        method(completed)
    except Exception as exc:
        raise ConfigError(str(config_path), "(auto_complete_config)",
                          f"{model_file}: auto_complete_config failed: {exc}") from None
    return completed.as_dict()


def _model_class(config_path: Path, model_file: Path) -> Any:
    pb_utils.make_importable()
    name = f"ferry_autocomplete_{abs(hash(str(model_file)))}"
    spec = importlib.util.spec_from_file_location(name, model_file)
    if spec is None or spec.loader is None:
        raise ConfigError(str(config_path), "(model)", f"{model_file}: not an importable Python file")
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except Exception as exc:
        raise ConfigError(str(config_path), "(model)", f"{model_file}: import failed: {exc!r}") from None
    return getattr(module, CLASS_NAME, None)
