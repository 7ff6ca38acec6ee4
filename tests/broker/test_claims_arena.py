"""A writer's arena in /dev/shm (``broker.claims.shm_arena``, through ``ShmClaims``): its space
reused once blocks are released, a block never released stepped over, a block whose reader died
or whose TTL passed reused, a claim to a reused block refused rather than answered with another
blob's bytes, another arena made when those there are full and files past the last, and the arena
of a killed writer swept."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from broker.claims.shm_store import ShmClaims
from broker.errors import ClaimMissing

REPO_ROOT = Path(__file__).resolve().parents[2]
BLOB = 100_000
CAPACITY = 1 << 20  # room for ten such blobs at once


def blob(seed: int) -> bytes:
    return bytes((seed + i) % 251 for i in range(256)) * (BLOB // 256) + bytes(BLOB % 256)


def arenas(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir() if p.name.startswith("ferry-arena-"))


def files(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir() if p.name.startswith("ferry-claim-"))


async def test_released_space_is_reused_so_the_arena_carries_many_times_its_size(tmp_path: Path):
    writer, reader = ShmClaims(tmp_path, arena_bytes=CAPACITY), ShmClaims(tmp_path)
    in_flight = []
    for n in range(100):  # ten times the arena, three blobs in flight at a time
        [claim] = await writer.put([blob(n)], 60, reader.owner)
        assert claim.startswith("shm:ferry-arena-"), claim
        in_flight.append((n, claim))
        if len(in_flight) == 3:
            first, oldest = in_flight.pop(0)
            assert await reader.get([oldest], delete=True) == [blob(first)]
    assert files(tmp_path) == [] and writer.live_blocks() == 2
    [arena] = arenas(tmp_path)
    assert arena.startswith(f"ferry-arena-{writer.owner}-")
    assert (tmp_path / arena).stat().st_size == CAPACITY
    await writer.aclose()
    await reader.aclose()
    assert arenas(tmp_path) == []


async def test_a_block_never_released_is_stepped_over_and_still_read_whole(tmp_path: Path):
    writer, reader = ShmClaims(tmp_path, arena_bytes=CAPACITY), ShmClaims(tmp_path)
    [kept] = await writer.put([blob(7)], 60, reader.owner)
    for n in range(40):
        [claim] = await writer.put([blob(n)], 60, reader.owner)
        assert claim.startswith("shm:ferry-arena-")
        await reader.delete([claim])
    assert files(tmp_path) == []
    assert await reader.get([kept]) == [blob(7)]


async def test_full_arenas_make_another_up_to_their_count_then_blobs_go_to_files(tmp_path: Path):
    writer, reader = ShmClaims(tmp_path, arena_bytes=CAPACITY, arenas=2), ShmClaims(tmp_path)
    claims = [(await writer.put([blob(n)], 60, reader.owner))[0] for n in range(25)]
    assert len(arenas(tmp_path)) == 2 and len(files(tmp_path)) == 5
    assert [c.split("@")[0] for c in claims[:20]] == [claims[0].split("@")[0]] * 10 + [claims[10].split("@")[0]] * 10
    [large] = await writer.put([bytes(CAPACITY // 4 + 1)], 60, reader.owner)  # would crowd an arena out
    assert large.startswith("shm:ferry-claim-")
    assert await reader.get(claims, delete=True) == [blob(n) for n in range(25)]
    assert len(files(tmp_path)) == 1 and writer.live_blocks() == 0
    [again] = await writer.put([blob(0)], 60, reader.owner)  # the arenas there are used again
    assert again.startswith("shm:ferry-arena-") and len(arenas(tmp_path)) == 2
    await writer.aclose()
    assert arenas(tmp_path) == []


async def test_a_claim_to_a_reused_block_is_refused_not_answered_with_another_blobs_bytes(tmp_path: Path):
    writer, reader = ShmClaims(tmp_path, arena_bytes=CAPACITY), ShmClaims(tmp_path)
    [old] = await writer.put([blob(1)], 60, reader.owner)
    assert await reader.get([old], delete=True) == [blob(1)]
    with pytest.raises(ClaimMissing, match="no longer in its arena"):
        await reader.get([old])
    for n in range(20):  # round the arena: the old block's offset now holds another blob
        [claim] = await writer.put([blob(n)], 60, reader.owner)
        if claim.split("@")[1].split(":")[0] == old.split("@")[1].split(":")[0]:
            break
    else:
        pytest.fail("the released block's space was never reused")
    with pytest.raises(ClaimMissing, match="no longer in its arena"):
        await reader.get([old])
    await reader.delete([old])  # a late release leaves the new block alone
    assert await reader.get([claim]) == [blob(n)]


async def test_blocks_for_a_reader_that_died_or_past_the_ttl_are_reused(tmp_path: Path):
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        with open(f"/proc/{child.pid}/stat") as stat:
            dead_owner = f"{child.pid}.{stat.read().rpartition(')')[2].split()[19]}"
    finally:
        child.kill()
        child.wait()
    writer = ShmClaims(tmp_path, arena_bytes=CAPACITY, arenas=1, ttl_s=60)
    for n in range(10):  # fill the arena for a reader that is gone
        [claim] = await writer.put([blob(n)], 60, dead_owner)
        assert claim.startswith("shm:ferry-arena-")
    [claim] = await writer.put([blob(10)], 60, writer.owner)
    assert claim.startswith("shm:ferry-arena-") and files(tmp_path) == []

    (tmp_path / "ttl").mkdir()
    short = ShmClaims(tmp_path / "ttl", arena_bytes=CAPACITY, arenas=1, ttl_s=0.2)
    for n in range(10):  # a reader that lives but never reads
        await short.put([blob(n)], 60, writer.owner)
    [spilled] = await short.put([blob(10)], 60, writer.owner)
    assert spilled.startswith("shm:ferry-claim-")
    time.sleep(0.3)
    [claim] = await short.put([blob(11)], 60, writer.owner)
    assert claim.startswith("shm:ferry-arena-")


async def test_a_killed_writers_arena_is_swept_and_a_reader_forgets_its_mapping(tmp_path: Path):
    script = ("import asyncio, sys, time\n"
              "from pathlib import Path\n"
              "from broker.claims.shm_store import ShmClaims\n"
              "store = ShmClaims(Path(sys.argv[1]), arena_bytes=1 << 20)\n"
              "print(asyncio.run(store.put([b'x' * 1000], 60, sys.argv[2]))[0], flush=True)\n"
              "time.sleep(60)\n")
    reader = ShmClaims(tmp_path)
    child = subprocess.Popen([sys.executable, "-c", script, str(tmp_path), reader.owner], cwd=REPO_ROOT,
                             stdout=subprocess.PIPE)
    try:
        assert child.stdout is not None
        claim = child.stdout.readline().decode().strip()
        assert claim.startswith(f"shm:ferry-arena-{child.pid}.")
        ShmClaims(tmp_path)  # opening sweeps: its writer lives
        assert len(arenas(tmp_path)) == 1
        assert await reader.get([claim]) == [b"x" * 1000]  # mapped by the reader now
    finally:
        child.kill()
        child.wait()
        if child.stdout is not None:
            child.stdout.close()
    ShmClaims(tmp_path)  # another process's store, opening, removes the file
    # the writer's arena and presence file are gone; this process's presence stays while its stores are open
    assert arenas(tmp_path) == [] and os.listdir(tmp_path) == [f"ferry-proc-{reader.owner}"]
    assert reader.sweep() == 0  # the reader drops its mapping all the same: the memory goes
    with pytest.raises(ClaimMissing, match="its writer is gone"):
        await reader.get([claim])


async def test_two_stores_in_one_process_have_an_arena_each_and_a_typed_view_goes_in_whole(tmp_path: Path):
    first, second = ShmClaims(tmp_path, arena_bytes=CAPACITY), ShmClaims(tmp_path, arena_bytes=CAPACITY)
    floats = np.arange(1000, dtype=np.float32)
    [one] = await first.put([memoryview(floats)], 60, first.owner)  # 4,000 bytes in a view of 1,000 items
    [two] = await second.put([b"y" * 10], 60, first.owner)
    assert len(arenas(tmp_path)) == 2 and one.split("@")[0] != two.split("@")[0]
    assert one.endswith(":4000:1") and await second.get([one, two]) == [floats.tobytes(), b"y" * 10]


async def test_a_file_named_like_an_arena_that_is_none_is_a_missing_claim(tmp_path: Path):
    store = ShmClaims(tmp_path)
    name = f"ferry-arena-{store.owner}-0a0b0c0d"  # of a live process, so no sweep removes it
    (tmp_path / name).touch()
    with pytest.raises(ClaimMissing, match="cannot be mapped"):
        await store.get([f"shm:{name}@0:1:1"])
