"""Reading one ``config.pbtxt`` into a ``ModelConfig``.

``load_config`` validates the plain values ``pbtxt.parse`` gives (Triton's
field names: ``input``, ``data_type: TYPE_FP32``, ``instance_group``...) into
a ``ModelConfig`` (``workers.repository.config``), then checks the rules that
span fields. Every problem is a ``ConfigError`` naming the file and a dotted
field such as ``input[1].data_type``. Fields ferry does not implement are
logged once each as ``config.unsupported_field``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import structlog
from pydantic import BaseModel, ValidationError

from workers.datatypes import element_count
from workers.ensemble.config import check as check_ensemble
from workers.errors import ConfigError
from workers.repository.config import DynamicBatching, ModelConfig, TensorConfig, VersionPolicy
from workers.repository.pbtxt import parse_file
from workers.sequences.config import check as check_sequence_batching

log = structlog.get_logger(__name__)


def parse_config_file(path: Path) -> ModelConfig:
    """Read, parse and validate one ``config.pbtxt`` (no autocomplete)."""
    return load_config(path, parse_file(path))


def load_config(path: Path, parsed: dict[str, Any]) -> ModelConfig:
    """Validate parsed pbtxt values into a ``ModelConfig``."""
    try:
        config = ModelConfig.model_validate(parsed)
    except ValidationError as err:
        raise _config_error(path, err) from None
    _check(path, config)
    _warn_unsupported(path, config, prefix="")
    return _name_groups(config)


def load_version_policy(path: Path, parsed: Any) -> VersionPolicy:
    """Validate ``version_policy`` alone, for choosing versions before autocomplete."""
    try:
        policy = VersionPolicy.model_validate({} if parsed is None else parsed)
    except ValidationError as err:
        raise _config_error(path, err, prefix=("version_policy",)) from None
    _check_version_policy(path, policy)
    return policy


def _config_error(path: Path, err: ValidationError, prefix: tuple[str, ...] = ()) -> ConfigError:
    first = err.errors()[0]
    kind = first["type"]
    message = "expected a message { ... }" if kind in ("model_type", "dict_type") else first["msg"]
    if kind == "value_error":
        message = message.removeprefix("Value error, ")
    elif isinstance(first.get("input"), list):
        message = f"expected one value, got a list (is the field given more than once?): {message}"
    elif kind != "missing" and not isinstance(first.get("input"), dict):
        message = f"{message} (got {first.get('input')!r})"
    return ConfigError(str(path), _dotted(prefix + tuple(first["loc"])), message)


def _dotted(loc: tuple[int | str, ...]) -> str:
    text = ""
    for part in loc:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else str(part))
    return text or "(config)"


def _check(path: Path, config: ModelConfig) -> None:
    _check_unique(path, "input", config.inputs)
    _check_unique(path, "output", config.outputs)
    for kind, tensors in (("input", config.inputs), ("output", config.outputs)):
        for index, tensor in enumerate(tensors):
            _check_reshape(path, f"{kind}[{index}]", tensor)
    for index, output in enumerate(config.outputs):
        _check_label_file(path, f"output[{index}].label_filename", output.label_filename)
    for index, group in enumerate(config.instance_groups):
        if group.gpus and group.kind in ("KIND_CPU", "KIND_MODEL"):
            raise ConfigError(str(path), f"instance_group[{index}].gpus", f"{group.kind} cannot name GPUs")
    if config.dynamic_batching is not None:
        _check_dynamic_batching(path, config.dynamic_batching, config.max_batch_size)
    if config.sequence_batching is not None:
        if config.dynamic_batching is not None:
            raise ConfigError(str(path), "sequence_batching", "set dynamic_batching or sequence_batching, not both")
        names = {t.name for t in config.inputs} | {t.name for t in config.outputs}
        check_sequence_batching(path, config.sequence_batching, config.max_batch_size, names)
        if config.decoupled:
            raise ConfigError(str(path), "model_transaction_policy.decoupled",
                              "ferry does not run decoupled models with sequence_batching")
    check_ensemble(path, config.ensemble_scheduling, config.platform, [t.name for t in config.inputs],
                   [t.name for t in config.outputs], _set_fields(config))
    _check_version_policy(path, config.version_policy)


def _check_label_file(path: Path, field: str, filename: str) -> None:
    """A file of the model's own directory (``ModelRepository`` checks that it is there)."""
    if filename and (Path(filename).name != filename or filename in (".", "..")):
        raise ConfigError(str(path), field, f"'{filename}' must be a file name in the model's directory, not a path")


def _set_fields(config: ModelConfig) -> list[str]:
    fields = [name for name in ("dynamic_batching", "sequence_batching") if getattr(config, name) is not None]
    return fields + (["model_transaction_policy.decoupled"] if config.decoupled else [])


def _check_unique(path: Path, kind: str, tensors: tuple[TensorConfig, ...]) -> None:
    seen: set[str] = set()
    for index, tensor in enumerate(tensors):
        if tensor.name in seen:
            raise ConfigError(str(path), f"{kind}[{index}].name", f"duplicate {kind} name '{tensor.name}'")
        seen.add(tensor.name)


def _check_reshape(path: Path, field: str, tensor: TensorConfig) -> None:
    if tensor.reshape is None or -1 in tensor.dims or -1 in tensor.reshape.shape:
        return
    if element_count(tensor.dims) != element_count(tensor.reshape.shape):
        raise ConfigError(
            str(path), f"{field}.reshape.shape",
            f"shape {list(tensor.reshape.shape)} does not hold the {element_count(tensor.dims)} "
            f"elements of dims {list(tensor.dims)}",
        )


def _check_dynamic_batching(path: Path, batching: DynamicBatching, max_batch_size: int) -> None:
    for size in batching.preferred_batch_size:
        if size > max_batch_size:
            raise ConfigError(
                str(path), "dynamic_batching.preferred_batch_size",
                f"preferred batch size {size} exceeds max_batch_size {max_batch_size}",
            )
    levels, default = batching.priority_levels, batching.default_priority_level
    if levels > 0 and not 1 <= default <= levels:
        raise ConfigError(
            str(path), "dynamic_batching.default_priority_level",
            f"must be between 1 and priority_levels ({levels}), got {default}",
        )


def _check_version_policy(path: Path, policy: VersionPolicy) -> None:
    chosen = [name for name in ("latest", "all", "specific") if getattr(policy, name) is not None]
    if len(chosen) > 1:
        raise ConfigError(str(path), "version_policy", f"set only one of latest, all, specific; got {chosen}")


def _warn_unsupported(path: Path, model: BaseModel, prefix: str) -> None:
    for key in model.model_extra or {}:
        log.warning("config.unsupported_field", file=str(path), field=prefix + key)
    for attr, info in type(model).model_fields.items():
        name = prefix + (info.alias or attr)
        value = getattr(model, attr)
        if isinstance(value, BaseModel):
            _warn_unsupported(path, value, name + ".")
        elif isinstance(value, tuple):
            for index, item in enumerate(value):
                if isinstance(item, BaseModel):
                    _warn_unsupported(path, item, f"{name}[{index}].")


def _name_groups(config: ModelConfig) -> ModelConfig:
    """Unnamed instance groups get Triton's ``<model>_<index>`` names."""
    groups = tuple(
        group if group.name else group.model_copy(update={"name": f"{config.name}_{index}"})
        for index, group in enumerate(config.instance_groups)
    )
    return config.model_copy(update={"instance_groups": groups})
