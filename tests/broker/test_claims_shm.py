"""Claim-checked bytes in /dev/shm, in files (``arena_bytes=0``) and in a writer's arena: owned by
the requester, taken or deleted once used, swept or reused once the owner is gone or the TTL has
passed, and never a path a claim can choose. The arena's own rules are in test_claims_arena.py."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from broker.claims.check import ClaimCheck, ClaimSettings
from broker.claims.shm_store import ShmClaims
from broker.claims.store import process_tag
from broker.envelope import Request, Response, WireTensor
from broker.errors import ClaimMissing, TransportError

LARGE = WireTensor("LARGE", "UINT8", (4096,), bytes(i % 251 for i in range(4096)))
REPO_ROOT = Path(__file__).resolve().parents[2]


def blobs(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir() if p.name.startswith("ferry-claim-"))


def held(store: ShmClaims, directory: Path) -> int:
    """Blobs not yet deleted: files, and live blocks of the store's arena."""
    return len(blobs(directory)) + store.live_blocks()


@pytest.mark.parametrize("arena_bytes", [0, 1 << 20], ids=["files", "arena"])
async def test_inputs_are_deleted_on_release_and_outputs_taken_by_their_reader(tmp_path: Path, arena_bytes: int):
    store = ShmClaims(tmp_path, arena_bytes=arena_bytes)
    check = ClaimCheck(store, ClaimSettings(threshold_bytes=1024))
    request = Request(id="r", model="m", inputs=(LARGE,), reply_to="x")
    stashed = await check.stash_request(request, claim_outputs=True)
    claim = stashed.inputs[0].claim
    if arena_bytes:
        assert claim.startswith(f"shm:ferry-arena-{process_tag()}-") and blobs(tmp_path) == []
    else:
        assert blobs(tmp_path) == [claim.removeprefix("shm:")]
        assert blobs(tmp_path)[0].startswith(f"ferry-claim-{process_tag()}-")
    assert held(store, tmp_path) == 1
    redeemed = await check.redeem_request(stashed)
    assert redeemed.inputs[0].data == LARGE.data
    await check.release(redeemed)
    assert held(store, tmp_path) == 0

    reply = await check.stash_response(Response(id="r", model="m", outputs=(LARGE,)), stashed)
    assert held(store, tmp_path) == 1
    assert (await check.redeem_response(reply)).outputs == (LARGE,)
    assert held(store, tmp_path) == 0
    await check.aclose()
    assert list(tmp_path.iterdir()) == []  # the arena goes with its writer's store


@pytest.mark.parametrize("claim", [
    "shm:../../etc/passwd", "shm:/etc/passwd", "shm:ferry-claim-1.2-nothex", "shm:ferry-claim-1.2-" + "a" * 31,
    "redis:" + "a" * 32, "shm:../ferry-arena-1.2@0:1:1", "shm:ferry-arena-1.2@0:1", "shm:ferry-arena-1.2/x@0:1:1",
    "shm:ferry-arena-1.2-0a0b0c0d@-64:1:1", "shm:ferry-arena-1.2@0:1:1",
    "shm:ferry-arena-1.2-0a0b0c0d@0:1:1",  # well formed, but no such arena
])
async def test_a_claim_that_names_no_claim_file_is_refused_before_any_path_is_built(tmp_path: Path, claim: str):
    with pytest.raises(ClaimMissing):
        await ShmClaims(tmp_path).get([claim])


async def test_an_owner_tag_that_is_not_one_makes_this_process_the_owner(tmp_path: Path):
    store = ShmClaims(tmp_path, arena_bytes=0)
    [claim] = await store.put([b"x"], 60, owner="../../evil")
    assert claim.startswith(f"shm:ferry-claim-{store.owner}-")


def test_the_blobs_of_a_killed_owner_are_swept_and_a_live_owners_kept_until_the_ttl(tmp_path: Path):
    script = ("import asyncio, sys, time\n"
              "from pathlib import Path\n"
              "from broker.claims.shm_store import ShmClaims\n"
              "asyncio.run(ShmClaims(Path(sys.argv[1]), arena_bytes=0).put([b'x' * 1000], 60, ''))\n"
              "print('written', flush=True)\n"
              "time.sleep(60)\n")
    child = subprocess.Popen([sys.executable, "-c", script, str(tmp_path)], cwd=REPO_ROOT, stdout=subprocess.PIPE)
    try:
        assert child.stdout is not None and child.stdout.readline() == b"written\n"
        [theirs] = blobs(tmp_path)
        assert theirs.startswith(f"ferry-claim-{child.pid}.")
        ShmClaims(tmp_path)  # opening sweeps: its owner lives
        assert blobs(tmp_path) == [theirs]
    finally:
        child.kill()
        child.wait()
        if child.stdout is not None:
            child.stdout.close()
    ours = tmp_path / f"ferry-claim-{process_tag()}-{'b' * 32}"
    ours.write_bytes(b"y")
    other = tmp_path / "not-a-claim"
    other.write_bytes(b"z")
    store = ShmClaims(tmp_path, ttl_s=60)
    assert blobs(tmp_path) == [ours.name]  # the killed owner's blob is gone, ours stays
    old = time.time() - 120
    os.utime(ours, (old, old))
    assert store.sweep() == 1
    assert blobs(tmp_path) == [] and other.exists()


async def test_a_blob_that_cannot_be_written_is_a_transport_error_and_leaves_nothing(tmp_path: Path):
    directory = tmp_path / "shm"
    directory.mkdir()
    store = ShmClaims(directory)
    shutil.rmtree(directory)  # as good as full, for the write (its presence file goes too)
    with pytest.raises(TransportError, match="shm claims: cannot write"):
        await store.put([b"x", b"y"], 60, store.owner)
    assert not directory.exists()
