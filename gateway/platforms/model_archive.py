"""A model directory a platform downloaded (SageMaker's ``/opt/ml/models/<hash>/model``),
read into the load requests that serve it.

As Triton's SageMaker front end reads one: the directory is a model itself
(``config.pbtxt`` at its root), or holds model directories; with several, the
one whose platform is ``ensemble`` is the target and the others are its
members, loaded first under their own directory names. Every model travels as
a load with config and file overrides (Triton's load API), so the workers
serve it from a directory ferry owns, wherever the platform put the original;
hidden files stay behind, as overrides refuse them, and an empty version
directory travels as one empty file, ``ferry.keep``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType

from gateway.errors import InvalidRequest
from workers.errors import ConfigError
from workers.repository.overrides import LoadOverrides
from workers.repository.pbtxt import parse

CONFIG = "config.pbtxt"
FORBIDDEN = ("/dev/", "/proc/", "/sys/")
KEEP = "ferry.keep"  # the file that keeps an empty version directory (an ensemble's) in a load


@dataclass(frozen=True, slots=True)
class ArchiveModel:
    name: str
    overrides: LoadOverrides


def read_archive(url: str, target: str) -> list[ArchiveModel]:
    """The loads that serve the archive at ``url`` as ``target``, members first."""
    root = Path(os.path.normpath(os.path.abspath(url)))
    if any(str(root).startswith(prefix) or str(root) + "/" == prefix for prefix in FORBIDDEN):
        raise InvalidRequest(f"invalid url {url!r}: a model cannot be loaded from /dev/, /proc/ or /sys/")
    if not root.is_dir():
        raise InvalidRequest(f"invalid url {url!r}: not a directory")
    if (root / CONFIG).is_file():
        return [_model(root, target)]
    found = sorted(p for p in root.iterdir() if p.is_dir() and not p.is_symlink() and (p / CONFIG).is_file())
    if not found:
        raise InvalidRequest(f"invalid url {url!r}: no {CONFIG} in it or in any directory under it")
    if len(found) == 1:
        return [_model(found[0], target)]
    ensembles = [p for p in found if _platform(p) == "ensemble"]
    if len(ensembles) != 1:
        raise InvalidRequest(f"invalid url {url!r}: {len(found)} model directories and {len(ensembles)} "
                             "ensembles; several models need exactly one ensemble to serve")
    members = [_model(p, p.name) for p in found if p != ensembles[0]]
    return [*members, _model(ensembles[0], target)]


def _platform(model_dir: Path) -> str:
    return str(_config(model_dir).get("platform", ""))


def _config(model_dir: Path) -> dict:
    path = model_dir / CONFIG
    try:
        return parse(path.read_text(encoding="utf-8"), str(path))
    except (OSError, UnicodeDecodeError) as exc:
        raise InvalidRequest(f"cannot read {path}: {exc}") from None
    except ConfigError as exc:
        raise InvalidRequest(str(exc)) from None


def _model(model_dir: Path, name: str) -> ArchiveModel:
    files: dict[str, bytes] = {}
    for version in sorted(p for p in model_dir.iterdir() if p.is_dir() and not p.is_symlink() and _is_version(p.name)):
        found = 0
        for folder, dirs, names in os.walk(version):  # links are not followed (os.walk's default)
            for file in names:
                path = Path(folder, file)
                if path.is_file() and not path.is_symlink() and not file.startswith("."):
                    files[path.relative_to(model_dir).as_posix()] = path.read_bytes()
                    found += 1
        if not found:  # a load carries files, not directories: an ensemble's empty version gets one
            files[f"{version.name}/{KEEP}"] = b""
    config = {**_config(model_dir), "name": name}
    return ArchiveModel(name, LoadOverrides(config, MappingProxyType(files)))


def _is_version(name: str) -> bool:
    return name.isdigit() and not name.startswith("0")
