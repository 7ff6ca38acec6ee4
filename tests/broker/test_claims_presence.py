"""Processes that share a claim directory but not a PID namespace (containers sharing /dev/shm):
each sees the other running through its locked presence file, so neither sweeps the other's
arena nor reuses a block the other is still to read; once one is SIGKILLed, its arena and its
presence file are swept. A forked child does not keep its parent's presence alive."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from broker.claims.shm_store import ShmClaims
from broker.claims.store import process_start

REPO_ROOT = Path(__file__).resolve().parents[2]
# Writes a blob for the owner named in argv[2] into its arena, prints the claim and its own tag, waits.
WRITER = ("import asyncio, sys, time\n"
          "from pathlib import Path\n"
          "from broker.claims.shm_store import ShmClaims\n"
          "store = ShmClaims(Path(sys.argv[1]), arena_bytes=1 << 20)\n"
          "print(asyncio.run(store.put([b'x' * 1000], 60, sys.argv[2]))[0], store.owner, flush=True)\n"
          "time.sleep(120)\n")


def _new_pid_namespace_works() -> bool:
    if shutil.which("unshare") is None:
        return False
    done = subprocess.run(["unshare", "--pid", "--fork", "--mount-proc", "true"], capture_output=True)
    return done.returncode == 0


needs_namespaces = pytest.mark.skipif(not _new_pid_namespace_works(),
                                      reason="unshare --pid needs root (CAP_SYS_ADMIN) and util-linux")


@pytest.fixture
def other_namespace(tmp_path: Path) -> Iterator[tuple[subprocess.Popen[bytes], str, str]]:
    """A writer in a PID namespace of its own, sharing ``tmp_path``, its blob its own: the process,
    its claim, its tag."""
    process = subprocess.Popen(["unshare", "--pid", "--mount-proc", "--kill-child=SIGKILL", sys.executable, "-c",
                                WRITER, str(tmp_path), ""], cwd=REPO_ROOT, stdout=subprocess.PIPE)
    try:
        assert process.stdout is not None
        claim, tag = process.stdout.readline().decode().split()
        yield process, claim, tag
    finally:
        process.kill()
        process.wait()
        if process.stdout is not None:
            process.stdout.close()


def arenas_and_presence(directory: Path, tag: str) -> list[str]:
    return sorted(name.split("-")[1] for name in os.listdir(directory)
                  if name.startswith((f"ferry-arena-{tag}-", f"ferry-proc-{tag}")))


@needs_namespaces
async def test_a_writer_in_another_pid_namespace_is_seen_running_and_swept_once_killed(
        tmp_path: Path, other_namespace: tuple[subprocess.Popen[bytes], str, str]):
    process, claim, tag = other_namespace
    pid, start = (int(part) for part in tag.split("."))
    assert process_start(pid) != start  # its pid here is no process, or another one
    reader = ShmClaims(tmp_path)  # opening sweeps
    assert arenas_and_presence(tmp_path, tag) == ["arena", "proc"]
    assert await reader.get([claim], delete=True) == [b"x" * 1000]
    process.kill()  # unshare; the kernel then kills the namespace's processes
    process.wait()
    deadline = time.monotonic() + 10
    while arenas_and_presence(tmp_path, tag) and time.monotonic() < deadline:
        time.sleep(0.05)
        reader.sweep()
    assert arenas_and_presence(tmp_path, tag) == []
    await reader.aclose()
    assert os.listdir(tmp_path) == []


@needs_namespaces
async def test_a_block_for_a_reader_in_another_pid_namespace_is_not_reused_before_it_is_read(
        tmp_path: Path, other_namespace: tuple[subprocess.Popen[bytes], str, str]):
    _, _, tag = other_namespace  # the reader, running in its namespace
    writer = ShmClaims(tmp_path, arena_bytes=1 << 20, arenas=1)
    blobs = [bytes([n]) * 90_000 for n in range(20)]  # ten fit in the arena
    claims = [(await writer.put([blob], 60, tag))[0] for blob in blobs]
    in_arena = [claim for claim in claims if claim.startswith("shm:ferry-arena-")]
    assert 0 < len(in_arena) < len(claims)  # once the arena is full, files: no block of the reader reused
    reader = ShmClaims(tmp_path)
    assert await reader.get(claims) == blobs
    await reader.aclose()
    await writer.aclose()


async def test_a_forked_child_does_not_keep_its_parents_presence(tmp_path: Path):
    script = ("import os, sys, time\n"
              "from pathlib import Path\n"
              "from broker.claims.shm_store import ShmClaims\n"
              "store = ShmClaims(Path(sys.argv[1]))\n"
              "started, running = os.pipe()\n"
              "child = os.fork()\n"
              "if child == 0:\n"  # past the fork hooks here: on a loaded machine the child may run late
              "    os.write(running, b'.')\n"
              "    time.sleep(120)\n"
              "    os._exit(0)\n"
              "os.read(started, 1)\n"
              "print(store.owner, child, flush=True)\n"
              "time.sleep(120)\n")
    parent = subprocess.Popen([sys.executable, "-c", script, str(tmp_path)], cwd=REPO_ROOT, stdout=subprocess.PIPE)
    child = 0
    try:
        assert parent.stdout is not None
        tag, child_pid = parent.stdout.readline().decode().split()
        child = int(child_pid)
        assert os.listdir(tmp_path) == [f"ferry-proc-{tag}"]
        parent.kill()
        parent.wait()
        assert process_start(child) is not None  # the child runs on, holding what it inherited
        store = ShmClaims(tmp_path)  # opening sweeps
        assert not (tmp_path / f"ferry-proc-{tag}").exists()
        await store.aclose()
    finally:
        parent.kill()
        parent.wait()
        if child:
            os.kill(child, signal.SIGKILL)
        if parent.stdout is not None:
            parent.stdout.close()
