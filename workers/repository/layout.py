"""A model repository in Triton's layout.

    <root>/<model>/config.pbtxt
    <root>/<model>/<version>/<model file>

``scan`` reads every model directory and keeps each model's ``ModelEntry`` or
the ``ConfigError`` that rejected it, so one bad model never hides the others.
Model names come from clients, so ``entry`` checks each name before touching
the disk and never follows one outside the root.

Backend choice: the config's ``backend``, else its ``platform``, else the
file in the newest version directory (``model.onnx`` means onnxruntime,
``model.py`` python, ``model.pt`` or ``model.pt2`` pytorch). ONNX configs are always completed from the model (an
absent ``config.pbtxt`` included); python models need a ``config.pbtxt``.
An ensemble (``platform: "ensemble"``) has no backend and no model file, only
an empty version directory; ``scan`` rejects one whose steps do not fit the
repository's other models (``workers.ensemble.config.step_errors``).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Any

import structlog

from workers.backends import PLATFORMS
from workers.backends.tree_runtimes import fil_model_filename
from workers.backends.triton_python.autocomplete import complete as complete_python, needs_completion
from workers.ensemble.config import PLATFORM as ENSEMBLE_PLATFORM, step_errors as ensemble_step_errors
from workers.errors import ConfigError, ModelNotFound
from workers.repository.autocomplete import OnnxSignature, autocomplete, read_signature
from workers.repository.config import ModelConfig, VersionPolicy
from workers.repository.config_file import load_config, load_version_policy
from workers.repository.pbtxt import parse_file
from workers.repository.savedmodel import DEFAULT_SIGNATURE, read_savedmodel_signature

log = structlog.get_logger(__name__)

CONFIG_FILENAME = "config.pbtxt"
DEFAULT_MODEL_FILENAMES: Mapping[str, str] = MappingProxyType({
    "onnxruntime": "model.onnx",
    "python": "model.py",
    "pytorch": "model.pt",
    "tensorrt": "model.plan",
    "openvino": "model.xml",
    "tensorflow": "model.savedmodel",  # a SavedModel directory
})
# Files that also tell their backend when found, beyond the defaults above.
ALTERNATE_MODEL_FILENAMES: Mapping[str, str] = MappingProxyType({"model.pt2": "pytorch"})
PLATFORM_BACKENDS: Mapping[str, str] = PLATFORMS
AUTOCOMPLETED_BACKENDS = ("onnxruntime", "tensorflow")

# Triton ignores version directories that are not numbers or start with 0.
_VERSION_DIR = re.compile(r"[1-9][0-9]*")
_FORBIDDEN_IN_NAMES = ("..", "/", "\\", "\0")


class InvalidModelName(ModelNotFound):
    """A model name that could reach outside the repository."""


@dataclass(frozen=True, slots=True)
class ModelEntry:
    name: str
    path: Path
    config: ModelConfig
    versions: tuple[int, ...]  # ascending, as the version policy selects them

    def version_dir(self, version: int) -> Path:
        if version not in self.versions:
            served = ", ".join(map(str, self.versions))
            raise ModelNotFound(f"model '{self.name}' has no version {version} (serving: {served})")
        return self.path / str(version)

    def model_file(self, version: int) -> Path:
        return self.version_dir(version) / self.config.default_model_filename


@dataclass(frozen=True, slots=True)
class RepositoryIndex:
    entries: Mapping[str, ModelEntry]
    errors: Mapping[str, ConfigError]

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(sorted({*self.entries, *self.errors}))


SignatureReader = Callable[[Path], OnnxSignature]


class ModelRepository:
    def __init__(
        self,
        root: Path,
        model_filenames: Mapping[str, str] = DEFAULT_MODEL_FILENAMES,
        signature_reader: SignatureReader = read_signature,
    ) -> None:
        self.root = root.resolve()
        self._filenames = model_filenames
        self._read_signature = signature_reader

    def scan(self) -> RepositoryIndex:
        entries: dict[str, ModelEntry] = {}
        errors: dict[str, ConfigError] = {}
        for name in self._directory_names():
            try:
                entries[name] = self.entry(name)
            except (ConfigError, ModelNotFound) as err:
                errors[name] = _as_config_error(self.root / name, err)
                log.warning("repository.model_rejected", model=name, error=str(errors[name]))
        for name, error in ensemble_step_errors(entries, CONFIG_FILENAME).items():
            del entries[name]
            errors[name] = error
            log.warning("repository.model_rejected", model=name, error=str(error))
        return RepositoryIndex(MappingProxyType(entries), MappingProxyType(errors))

    def entry(self, name: str, config: Mapping[str, Any] | None = None, path: Path | None = None) -> ModelEntry:
        """Load one model afresh; ``ModelNotFound`` for names that are not models here.

        A load request's overrides replace the config (``config``, parsed
        values whose name is already checked) or the whole directory (``path``,
        a directory ferry wrote, which may serve a model the repository lacks, as
        Triton's file overrides may); the name is checked either way."""
        if path is None:
            path = self._model_dir(name)
        elif not is_safe_name(name):
            raise InvalidModelName(f"{name!r} is not a valid model name")
        config_path = path / CONFIG_FILENAME
        raw = _raw_config(config_path, name) if config is None else {**config, "name": name}
        available = _version_dirs(path)
        if raw.get("platform") == ENSEMBLE_PLATFORM:  # no backend, no model file: its steps are other models
            policy = load_version_policy(config_path, raw.get("version_policy"))
            return ModelEntry(name, path, load_config(config_path, raw), _select_versions(config_path, policy, available))
        backend = self._backend(config_path, raw, path, available)
        filename = self._model_filename(config_path, raw, backend)
        policy = load_version_policy(config_path, raw.get("version_policy"))
        versions = _select_versions(config_path, policy, available)
        if backend == "onnxruntime":
            raw = self._autocomplete(config_path, raw, path / str(versions[-1]) / filename)
        elif backend == "tensorflow" and versions:
            signature = _parameter(raw, SIGNATURE_PARAMETER) or DEFAULT_SIGNATURE
            raw = autocomplete(config_path, raw, read_savedmodel_signature(path / str(versions[-1]) / filename,
                                                                           signature),
                               platform="tensorflow_savedmodel", backend="tensorflow")
        elif backend == "python" and versions and needs_completion(path / str(versions[-1]) / filename):
            raw = complete_python(config_path, raw, path / str(versions[-1]) / filename)
        loaded = load_config(config_path, raw)
        _check_label_files(config_path, loaded)
        return ModelEntry(name, path, loaded, versions)

    def _directory_names(self) -> list[str]:
        try:
            children = sorted(self.root.iterdir())
        except OSError as err:
            reason = err.strerror or str(err)
            raise ConfigError(str(self.root), "(repository)", f"cannot list the repository: {reason}") from None
        return [child.name for child in children if not child.name.startswith(".") and child.is_dir()]

    def _model_dir(self, name: str) -> Path:
        if not is_safe_name(name):
            raise InvalidModelName(f"{name!r} is not a valid model name")
        try:
            resolved = (self.root / name).resolve(strict=True)
        except (OSError, RuntimeError):
            raise ModelNotFound(f"no model '{name}' in the repository") from None
        if resolved == self.root or not resolved.is_relative_to(self.root):
            raise InvalidModelName(f"model '{name}' resolves outside the repository")
        if not resolved.is_dir():
            raise ModelNotFound(f"no model '{name}' in the repository")
        return resolved

    def _backend(self, config_path: Path, raw: dict[str, Any], path: Path, available: tuple[int, ...]) -> str:
        """The backend, written into ``raw`` so the config carries it."""
        backend = raw.get("backend") or self._backend_by_platform(config_path, raw.get("platform"))
        backend = backend or self._detect_backend(config_path, raw, path, available)
        if not isinstance(backend, str):
            raise ConfigError(str(config_path), "backend", f"expected a string, got {backend!r}")
        if backend not in AUTOCOMPLETED_BACKENDS and not config_path.exists():
            raise ConfigError(
                str(config_path), "(file)",
                f"{backend} models need a config.pbtxt; only "
                f"{', '.join(AUTOCOMPLETED_BACKENDS)} models are autocompleted",
            )
        raw["backend"] = backend
        return backend

    def _backend_by_platform(self, config_path: Path, platform: Any) -> str:
        if not platform or not isinstance(platform, str):
            return ""
        if platform not in PLATFORM_BACKENDS:
            known = ", ".join(PLATFORM_BACKENDS)
            raise ConfigError(
                str(config_path), "platform",
                f"unsupported platform '{platform}' (known: {known}); set backend instead",
            )
        return PLATFORM_BACKENDS[platform]

    def _detect_backend(
        self, config_path: Path, raw: dict[str, Any], path: Path, available: tuple[int, ...]
    ) -> str:
        given = raw.get("default_model_filename")
        if isinstance(given, str) and given:
            # A named model file tells the backend by its extension (net.onnx -> onnxruntime).
            for backend, filename in self._detectable():
                if Path(given).suffix == Path(filename).suffix:
                    return backend
        for version in reversed(available):
            for backend, filename in self._detectable():
                if (path / str(version) / filename).is_file():
                    if filename != self._filenames.get(backend):
                        raw.setdefault("default_model_filename", filename)
                    return backend
        files = " or ".join(self._filenames.values())
        raise ConfigError(
            str(config_path), "backend", f"not set, and no version directory holds {files} to tell it by",
        )

    def _detectable(self) -> list[tuple[str, str]]:
        """(backend, file name) pairs that tell a backend by the model file."""
        return [*self._filenames.items(), *((b, f) for f, b in ALTERNATE_MODEL_FILENAMES.items())]

    def _model_filename(self, config_path: Path, raw: dict[str, Any], backend: str) -> str:
        filename = raw.get("default_model_filename") or self._filenames.get(backend)
        if backend == "fil":  # as in Triton's FIL backend, parameters.model_type names the file
            try:
                filename = fil_model_filename(raw)
            except ValueError as err:
                field, _, message = str(err).partition(": ")
                raise ConfigError(str(config_path), field, message) from None
        raw["default_model_filename"] = filename
        if filename is None:
            raise ConfigError(
                str(config_path), "backend",
                f"backend '{backend}' has no default model file; set default_model_filename",
            )
        if not isinstance(filename, str) or filename in (".", "..") or any(c in filename for c in "/\\\0"):
            raise ConfigError(
                str(config_path), "default_model_filename", f"{filename!r} must be a plain file name",
            )
        return filename

    def _autocomplete(self, config_path: Path, raw: dict[str, Any], model_file: Path) -> dict[str, Any]:
        if not model_file.is_file():
            raise ConfigError(
                str(model_file), "(model)",
                "missing: the ONNX model is needed to complete and check the config",
            )
        return autocomplete(config_path, raw, self._read_signature(model_file))


def is_safe_name(name: object) -> bool:
    """A name that stays one directory level inside the repository."""
    if not isinstance(name, str) or not name or name.startswith("."):
        return False
    return not any(part in name for part in _FORBIDDEN_IN_NAMES)


def _raw_config(config_path: Path, name: str) -> dict[str, Any]:
    if not config_path.exists():
        return {"name": name}
    raw = parse_file(config_path)
    given = raw.setdefault("name", name)
    if given != name:
        raise ConfigError(
            str(config_path), "name", f"{given!r} differs from the model's directory name '{name}'",
        )
    return raw


def _version_dirs(path: Path) -> tuple[int, ...]:
    try:
        children = list(path.iterdir())
    except OSError as err:
        reason = err.strerror or str(err)
        raise ConfigError(str(path), "(directory)", f"cannot list the model directory: {reason}") from None
    return tuple(sorted(int(c.name) for c in children if _VERSION_DIR.fullmatch(c.name) and c.is_dir()))


def _select_versions(config_path: Path, policy: VersionPolicy, available: tuple[int, ...]) -> tuple[int, ...]:
    if policy.specific is not None:
        missing = [v for v in policy.specific.versions if v not in available]
        if missing:
            raise ConfigError(
                str(config_path), "version_policy.specific.versions",
                f"version(s) {missing} have no directory under {config_path.parent}",
            )
    versions = policy.select(available)
    if not versions:
        raise ConfigError(
            str(config_path), "version_policy",
            f"no version directories (1, 2, ...) under {config_path.parent}",
        )
    return versions


def _as_config_error(path: Path, err: ConfigError | ModelNotFound) -> ConfigError:
    # A directory the name checks refuse (a symlink out of the root, say) is
    # still a rejected model from the operator's point of view.
    return err if isinstance(err, ConfigError) else ConfigError(str(path), "name", str(err))


def _check_label_files(config_path: Path, config: ModelConfig) -> None:
    """Labels named for the classification extension must be there when the model loads, as in Triton."""
    for index, output in enumerate(config.outputs):
        if output.label_filename and not (config_path.parent / output.label_filename).is_file():
            raise ConfigError(str(config_path), f"output[{index}].label_filename",
                              f"no file '{output.label_filename}' in {config_path.parent}")


SIGNATURE_PARAMETER = "TF_SIGNATURE_DEF"  # a SavedModel's signature, as in the TensorFlow backend


def _parameter(raw: dict[str, Any], key: str) -> str:
    """A config parameter's string value from parsed pbtxt, '' when absent or malformed."""
    entries = raw.get("parameters")
    for entry in entries if isinstance(entries, list) else []:
        value = entry.get("value") if isinstance(entry, dict) and entry.get("key") == key else None
        if isinstance(value, dict) and isinstance(value.get("string_value"), str):
            return str(value["string_value"])
    return ""
