"""``SharedMemoryRegions`` on real /dev/shm segments."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from gateway.errors import FeatureDisabled, InvalidRequest, RegionNotFound
from gateway.shared_memory.refs import RegionSlice
from gateway.shared_memory.regions import DISABLED, SharedMemoryRegions
from tests.shm_segments import Segments, contents, open_descriptors, path_of


@pytest.fixture
def segments() -> Iterator[Segments]:
    with Segments() as made:
        yield made


@pytest.fixture
async def regions() -> AsyncIterator[SharedMemoryRegions]:
    async with SharedMemoryRegions(enabled=True) as registry:
        yield registry


def _refused(call, *args) -> str:
    with pytest.raises(InvalidRequest) as caught:
        call(*args)
    return str(caught.value)


def test_status_lists_regions_by_name_as_triton_does(regions, segments):
    key = segments.make(128)
    regions.register("b", key, 64, 64)
    regions.register("a", key, 0, 32)
    assert regions.status() == [{"name": "a", "key": key, "offset": 0, "byte_size": 32},
                                {"name": "b", "key": key, "offset": 64, "byte_size": 64}]
    assert regions.status("b") == [{"name": "b", "key": key, "offset": 64, "byte_size": 64}]
    with pytest.raises(RegionNotFound, match="Unable to find system shared memory region: 'c'"):
        regions.status("c")


def test_a_slice_reads_from_the_registered_offset_on(regions, segments):
    key = segments.make(4096 + 16, bytes(range(256)) * 17)
    regions.register("r", key, 4099, 16)  # not a page boundary
    assert regions.resolve(RegionSlice("r", 8, 4), "input 'X'").read("input 'X'") == bytes(range(7, 15))


def test_a_slice_writes_its_bytes_and_nothing_around_them(regions, segments):
    key = segments.make(32, b"\xff" * 32)
    regions.register("r", key, 8, 16)
    target = regions.resolve(RegionSlice("r", 8, 4), "output 'Y'")
    target.check_write(b"abcd", "output 'Y'")
    target.write(b"abc", "output 'Y'")  # fewer bytes than the slice holds
    assert contents(key) == b"\xff" * 12 + b"abc" + b"\xff" * 17


def test_registering_a_name_twice_is_refused_with_tritons_words(regions, segments):
    key = segments.make(16)
    regions.register("r", key, 0, 16)
    assert _refused(regions.register, "r", key, 0, 8) == "shared memory region 'r' already in manager"


def test_a_key_with_no_segment_is_refused(regions):
    message = _refused(regions.register, "r", "/ferry_no_such_segment", 0, 16)
    assert message.startswith("Unable to open shared memory region: '/ferry_no_such_segment'")
    assert "No such file or directory" in message


@pytest.mark.parametrize("key", ["", "/", "//", "/a/b", "/..", "/.", "../etc/passwd", "/x\0y"])
def test_a_key_that_is_not_a_segment_name_is_refused(regions, key):
    assert _refused(regions.register, "r", key, 0, 16).startswith("Unable to open shared memory region")


def test_a_range_beyond_the_segment_or_empty_is_refused(regions, segments):
    key = segments.make(64)
    message = _refused(regions.register, "r", key, 32, 48)
    assert message.startswith("failed to register shared memory region 'r': invalid args")
    assert "offset 32 + byte_size 48 is past the 64 bytes" in message
    assert "invalid args" in _refused(regions.register, "r", key, 0, 0)
    assert regions.status() == []


def test_a_symlink_or_a_fifo_is_not_opened(tmp_path: Path):
    regions = SharedMemoryRegions(enabled=True, directory=tmp_path)
    (tmp_path / "real").write_bytes(bytes(16))
    (tmp_path / "link").symlink_to(tmp_path / "real")
    os.mkfifo(tmp_path / "fifo")
    assert "Unable to open shared memory region: '/link'" in _refused(regions.register, "r", "/link", 0, 16)
    assert "is not a shared memory segment" in _refused(regions.register, "r", "/fifo", 0, 16)
    regions.register("r", "/real", 0, 16)  # the directory is only where segments are looked for
    regions.unregister("r")


@pytest.mark.parametrize("wanted, fragment", [
    (RegionSlice("nope", 4), "input 'X': Unable to find shared memory region: 'nope'"),
    (RegionSlice("r", 4, 16), "input 'X': Invalid offset for shared memory region: 'r'"),
    (RegionSlice("r", 8, 12), "input 'X': Invalid offset + byte size for shared memory region: 'r' (12 + 8 bytes"),
])
def test_a_slice_outside_its_region_is_refused(regions, segments, wanted, fragment):
    regions.register("r", segments.make(64), 0, 16)
    assert fragment in _refused(regions.resolve, wanted, "input 'X'")


def test_an_output_larger_than_its_slice_is_refused_with_tritons_words(regions, segments):
    regions.register("r", segments.make(16), 0, 16)
    target = regions.resolve(RegionSlice("r", 8), "output 'Y'")
    assert _refused(target.check_write, bytes(12), "output 'Y'") == (
        "shared memory size specified with the request for output 'Y' (8 bytes) should be at least "
        "12 bytes to hold the results")


def test_a_read_only_segment_serves_inputs_and_refuses_outputs(regions, segments):
    key = segments.make(16, b"0123456789abcdef", mode=0o400)
    regions.register("r", key, 0, 16)
    assert regions.resolve(RegionSlice("r", 4), "input 'X'").read("input 'X'") == b"0123"
    target = regions.resolve(RegionSlice("r", 4), "output 'Y'")
    assert "is read-only to the server" in _refused(target.check_target, "output 'Y'")
    assert contents(key) == b"0123456789abcdef"


def test_a_region_unregistered_in_flight_is_not_written_even_when_its_name_is_taken_again(regions, segments):
    first, second = segments.make(8, b"AAAAAAAA"), segments.make(8, b"BBBBBBBB")
    regions.register("r", first, 0, 8)
    target = regions.resolve(RegionSlice("r", 8), "output 'Y'")
    regions.unregister("r")
    regions.register("r", second, 0, 8)
    message = _refused(target.check_write, b"12345678", "output 'Y'")
    assert message == ("output 'Y': shared memory region 'r' was unregistered while the request was in flight; "
                       "nothing was written to it")
    assert (contents(first), contents(second)) == (b"AAAAAAAA", b"BBBBBBBB")


def test_a_segment_shrunk_by_its_client_gives_an_error_not_a_crash(regions, segments):
    key = segments.make(64)
    regions.register("r", key, 0, 64)
    source = regions.resolve(RegionSlice("r", 32, 16), "input 'X'")
    target = regions.resolve(RegionSlice("r", 16, 32), "output 'Y'")
    os.truncate(path_of(key), 20)
    assert "ends 28 bytes short: segment" in _refused(source.read, "input 'X'")
    assert "no longer holds its 16 bytes" in _refused(target.check_write, bytes(16), "output 'Y'")
    assert path_of(key).stat().st_size == 20  # never grown back by a write


async def test_unregister_and_close_leave_nothing_open_and_the_segments_in_place(segments):
    regions = SharedMemoryRegions(enabled=True)
    one, two = segments.make(16), segments.make(16)
    regions.register("a", one, 0, 16)
    regions.register("b", one, 0, 8)
    regions.register("c", two, 0, 16)
    assert (open_descriptors(one), open_descriptors(two)) == (2, 1)
    regions.unregister("a")
    regions.unregister("never registered")  # no error, as in Triton
    assert open_descriptors(one) == 1
    await regions.aclose()
    assert (open_descriptors(one), open_descriptors(two)) == (0, 0)
    assert regions.status() == []
    assert path_of(one).exists() and path_of(two).exists()


def test_unregister_all_closes_every_region(regions, segments):
    key = segments.make(16)
    regions.register("a", key, 0, 16)
    regions.register("b", key, 8, 8)
    regions.unregister_all()
    assert regions.status() == [] and open_descriptors(key) == 0


def test_a_disabled_registry_refuses_to_register_and_unregister_but_reports_status(segments):
    regions = SharedMemoryRegions(enabled=False)
    for call, args in ((regions.register, ("r", segments.make(8), 0, 8)), (regions.unregister, ("r",)),
                       (regions.unregister_all, ())):
        with pytest.raises(FeatureDisabled, match="Client shared memory is disabled"):
            call(*args)
    assert regions.status() == []
    assert DISABLED in _refused(regions.resolve, RegionSlice("r", 8), "input 'X'")
