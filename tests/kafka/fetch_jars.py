"""Fetch the jars of a Kafka broker into a per-user cache, once.

Kafka ships no Python package, and its release tarball comes from a host the
test machines cannot reach, so the broker is assembled from Maven Central:
``pom.xml`` beside this file names the broker and a logging backend, and
``mvn dependency:copy-dependencies`` copies them with all their dependencies.

The jars land in ``${FERRY_CACHE_DIR:-~/.cache/ferry}/kafka-<version>/lib``.
That folder only ever appears whole, by renaming a finished temporary folder,
so a reader never sees half a download; an exclusive lock makes processes that
race (pytest-xdist workers, two terminals) wait for one download instead of
each doing their own. A stamp of the pom's hash inside the folder makes an
edit of the pom fetch again instead of silently using the old jars.

Run it as a script to warm the cache ahead of time: ``python tests/kafka/fetch_jars.py``.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

KAFKA_VERSION = "4.4.0"
POM = Path(__file__).with_name("pom.xml")
STAMP = "pom.sha256"
MVN_TIMEOUT_S = 900


class FetchError(RuntimeError):
    """The jars could not be fetched; the message says why."""


@dataclass(frozen=True)
class Jars:
    lib: Path
    fetched: bool  # False when the cache already held them

    @property
    def classpath(self) -> str:
        return str(self.lib / "*")


def cache_root() -> Path:
    return Path(os.environ.get("FERRY_CACHE_DIR") or Path.home() / ".cache" / "ferry")


def fetch_jars(cache: Path | None = None, mvn: str = "mvn") -> Jars:
    """Return the cached jars, downloading them first if they are missing or stale."""
    home = (cache or cache_root()) / f"kafka-{KAFKA_VERSION}"
    lib = home / "lib"
    wanted = hashlib.sha256(POM.read_bytes()).hexdigest()
    if _stamp(lib) == wanted:
        return Jars(lib, fetched=False)
    home.mkdir(parents=True, exist_ok=True)
    with open(home / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if _stamp(lib) == wanted:  # another process finished while we waited
            return Jars(lib, fetched=False)
        _download(home, lib, wanted, mvn)
    return Jars(lib, fetched=True)


def _stamp(lib: Path) -> str | None:
    try:
        return (lib / STAMP).read_text().strip()
    except OSError:
        return None


def _download(home: Path, lib: Path, stamp: str, mvn: str) -> None:
    found = shutil.which(mvn)
    if found is None:
        raise FetchError(f"{mvn} is not installed; it is needed once to fetch the Kafka jars into {lib}")
    staging = Path(tempfile.mkdtemp(prefix=".fetch-", dir=home))
    try:
        _copy_dependencies(found, staging / "lib")
        (staging / "lib" / STAMP).write_text(stamp + "\n")
        if lib.exists():  # stale: set it aside first, since rename cannot replace a full folder
            lib.rename(staging / "stale")
        (staging / "lib").rename(lib)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _copy_dependencies(mvn: str, into: Path) -> None:
    arguments = [
        mvn, "-B", "-q", "-Dstyle.color=never", "-f", str(POM),
        "dependency:copy-dependencies", "-DincludeScope=runtime", f"-DoutputDirectory={into}",
    ]  # fmt: skip
    try:
        done = subprocess.run(
            arguments, check=False, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=MVN_TIMEOUT_S
        )
    except subprocess.TimeoutExpired as exc:
        raise FetchError(f"mvn took over {MVN_TIMEOUT_S} s to fetch the Kafka jars") from exc
    if done.returncode != 0 or not any(into.glob("kafka_2.13-*.jar")):
        tail = (done.stdout + done.stderr)[-4000:]
        raise FetchError(f"mvn could not fetch the Kafka jars (exit {done.returncode}):\n{tail}")


if __name__ == "__main__":
    try:
        jars = fetch_jars()
    except FetchError as exc:
        sys.exit(str(exc))
    print(f"{'fetched' if jars.fetched else 'cached'}: {jars.lib}")
