"""A load request's overrides: a model config and model files sent with it.

Triton's load body is ``{"parameters": {"config": "<JSON ModelConfig>",
"file:<version>/<path>": "<base64 content>", "unload_dependents": bool}}``.
``parse_load_parameters`` checks every parameter before anything touches the
disk: the config's ``name`` must be the model's, file paths must be plain
relative paths under a numbered version directory, and content must be
base64. ``materialize`` writes override files only into a fresh temporary
directory that ferry owns (as Triton does); with files the model is served
from there alone, and ``config`` must come with them.
"""

from __future__ import annotations

import base64
import binascii
import os
import re
import shutil
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any

import orjson

from workers.errors import ConfigError, InvalidInput
from workers.repository.pbtxt import parse_json
from workers.repository.safe_paths import inside, path_problem

FILE_PREFIX = "file:"
TEMP_PREFIX = "ferry-override-"
_VERSION = re.compile(r"[1-9][0-9]{0,8}")
# Protobuf's JSON form writes int64 as strings; pbtxt gives ints.


class InvalidOverride(InvalidInput):
    def __init__(self, parameter: str, message: str) -> None:
        super().__init__(f"load parameter '{parameter}': {message}")
        self.parameter = parameter


@dataclass(frozen=True, slots=True)
class LoadOverrides:
    config: Mapping[str, Any] | None = None  # pbtxt-shaped values, as load_config takes them
    files: Mapping[str, bytes] = field(default_factory=lambda: MappingProxyType({}))  # "<version>/<path>"
    unload_dependents: bool = False

    @property
    def empty(self) -> bool:
        return self.config is None and not self.files

    def to_wire(self) -> dict[str, Any]:
        return {"config": None if self.config is None else dict(self.config),
                "files": dict(self.files), "unload_dependents": self.unload_dependents}


def from_wire(model: str, body: Any) -> LoadOverrides:
    """The overrides a control message carries, checked again on arrival."""
    if not isinstance(body, dict):
        return LoadOverrides()
    config, files = body.get("config"), body.get("files") or {}
    if config is not None and not isinstance(config, dict):
        raise InvalidOverride("config", "expected a JSON object")
    if not isinstance(files, dict) or not all(isinstance(v, bytes) for v in files.values()):
        raise InvalidOverride("file:", "expected file contents as bytes")
    for relative in files:
        _check_file_path(FILE_PREFIX + str(relative), str(relative))
    overrides = LoadOverrides(_checked_config(model, config) if config is not None else None,
                              MappingProxyType(dict(files)), bool(body.get("unload_dependents", False)))
    _check_files_need_config(overrides)
    return overrides


def parse_load_parameters(model: str, parameters: Any) -> LoadOverrides:
    """A load request's ``parameters`` object as overrides; ``InvalidOverride`` names the one at fault."""
    if parameters is None:
        return LoadOverrides()
    if not isinstance(parameters, dict):
        raise InvalidOverride("parameters", "expected a JSON object")
    config: dict[str, Any] | None = None
    files: dict[str, bytes] = {}
    unload_dependents = False
    for key, value in parameters.items():
        if key == "config":
            config = _parse_config(model, value)
        elif key.startswith(FILE_PREFIX):
            relative = key[len(FILE_PREFIX):]
            _check_file_path(key, relative)
            files[relative] = _decode_content(key, value)
        elif key == "unload_dependents":
            if not isinstance(value, bool):
                raise InvalidOverride(key, "expected true or false")
            unload_dependents = value
        else:
            raise InvalidOverride(key, "unknown; expected 'config', 'file:<version>/<path>' or 'unload_dependents'")
    overrides = LoadOverrides(config, MappingProxyType(files), unload_dependents)
    _check_files_need_config(overrides)
    return overrides


def parse_unload_parameters(parameters: Any) -> bool:
    """``unload_dependents`` of an unload request's ``parameters``."""
    if parameters is None:
        return False
    if not isinstance(parameters, dict):
        raise InvalidOverride("parameters", "expected a JSON object")
    for key, value in parameters.items():
        if key != "unload_dependents":
            raise InvalidOverride(key, "unknown; an unload takes only 'unload_dependents'")
        if not isinstance(value, bool):
            raise InvalidOverride(key, "expected true or false")
    return bool(parameters.get("unload_dependents", False))


@dataclass(frozen=True, slots=True)
class Materialized:
    """Where a model with overrides is served from, and the directory ferry owns (if any)."""

    model_dir: Path | None  # None: the repository's own directory
    owned_dir: Path | None

    def remove(self) -> None:
        if self.owned_dir is not None:
            shutil.rmtree(self.owned_dir, ignore_errors=True)


def materialize(model: str, overrides: LoadOverrides) -> Materialized:
    """Write the override files into a fresh temporary model directory."""
    if not overrides.files:
        return Materialized(None, None)
    owned = Path(tempfile.mkdtemp(prefix=TEMP_PREFIX))
    model_dir = owned / model
    try:
        model_dir.mkdir()
        for relative, content in sorted(overrides.files.items()):
            _write_new(model_dir, relative, content)
    except BaseException:
        shutil.rmtree(owned, ignore_errors=True)
        raise
    return Materialized(model_dir, owned)


def _write_new(model_dir: Path, relative: str, content: bytes) -> None:
    try:
        target = inside(model_dir, relative)
    except ValueError as exc:
        raise InvalidOverride(FILE_PREFIX + relative, str(exc)) from None
    target.parent.mkdir(parents=True, exist_ok=True)
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0)
    fd = os.open(target, flags, 0o600)
    with os.fdopen(fd, "wb") as out:
        out.write(content)


def _check_file_path(key: str, relative: str) -> None:
    problem = path_problem(relative)
    if problem is not None:
        raise InvalidOverride(key, f"{relative!r} is not a plain relative path: {problem}")
    version, _, rest = relative.partition("/")
    if not _VERSION.fullmatch(version) or not rest:
        raise InvalidOverride(key, "expected file:<version>/<path>, the version a number such as 1")


def _decode_content(key: str, value: Any) -> bytes:
    if not isinstance(value, str):
        raise InvalidOverride(key, "expected the file's content as a base64 string")
    try:
        return base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError):
        raise InvalidOverride(key, "the content is not valid base64") from None


def _parse_config(model: str, value: Any) -> dict[str, Any]:
    """Triton's JSON config, read with protobuf's JSON rules against Triton's schema, as Triton reads it."""
    if isinstance(value, dict):
        value = orjson.dumps(value)
    if not isinstance(value, (str, bytes)):
        raise InvalidOverride("config", "expected a JSON object (a model config)")
    try:
        config = parse_json(value, "config")
    except ConfigError as exc:
        raise InvalidOverride("config", f"field '{exc.field}': {exc.detail}") from None
    return _checked_config(model, config)


def _checked_config(model: str, config: dict[str, Any]) -> dict[str, Any]:
    name = config.get("name", model)
    if name != model:
        raise InvalidOverride("config", f"its name {name!r} differs from the model being loaded, '{model}'")
    return {**config, "name": model}


def _check_files_need_config(overrides: LoadOverrides) -> None:
    if overrides.files and overrides.config is None:
        raise InvalidOverride("config", "file overrides need a config override too (the model is "
                                        "served from the override files alone)")
