"""What a V2 tensor's ``parameters`` say about shared memory, checked with the
wording of Triton's front ends:

    {"shared_memory_region": "r", "shared_memory_byte_size": 64, "shared_memory_offset": 0}

The offset is optional (0). On an input the bytes are read from the region
and ``data`` and ``binary_data_size`` must be absent; on a requested output
the bytes are written to it and the response carries no data. Pure: the
region itself is looked up later, by ``gateway.shared_memory.regions``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from gateway.errors import InvalidRequest
from workers.datatypes import element_count, numpy_dtype

REGION = "shared_memory_region"
BYTE_SIZE = "shared_memory_byte_size"
OFFSET = "shared_memory_offset"


@dataclass(frozen=True, slots=True)
class RegionSlice:
    region: str
    byte_size: int
    offset: int = 0

    def parameters(self) -> dict[str, Any]:
        """As the request gave them (an offset of 0 left out, as tritonclient sends it)."""
        given: dict[str, Any] = {REGION: self.region, BYTE_SIZE: self.byte_size}
        if self.offset:
            given[OFFSET] = self.offset
        return given


@dataclass(frozen=True, slots=True)
class RegionInput:
    """An input whose bytes wait in a registered region; the HTTP infer route
    reads them before the request becomes an envelope."""

    name: str
    datatype: str
    shape: tuple[int, ...]
    slice: RegionSlice


def region_slice(parameters: dict[str, Any], where: str) -> RegionSlice | None:
    """The slice ``parameters`` name, or None when they name no region."""
    region = parameters.get(REGION)
    if region is None:
        for key in (OFFSET, BYTE_SIZE):
            if key in parameters:
                raise InvalidRequest(f"{where}: '{key}' can not be specified without '{REGION}'")
        return None
    if not isinstance(region, str) or not region:
        raise InvalidRequest(f"{where}: invalid value for '{REGION}', expected the name of a region")
    if BYTE_SIZE not in parameters:
        raise InvalidRequest(f"{where}: '{BYTE_SIZE}' must be specified along with '{REGION}'")
    return RegionSlice(region, _size(parameters[BYTE_SIZE], BYTE_SIZE, where),
                       _size(parameters.get(OFFSET, 0), OFFSET, where))


def region_input(name: str, datatype: str, shape: tuple[int, ...], where: str, region: RegionSlice) -> RegionInput:
    """A fixed-size datatype must take exactly the bytes its shape holds; BYTES
    elements are checked once read."""
    if datatype != "BYTES":
        expected = element_count(shape) * numpy_dtype(datatype).itemsize
        if region.byte_size != expected:
            raise InvalidRequest(f"{where}: {BYTE_SIZE} {region.byte_size} does not match shape {list(shape)} "
                                 f"of {datatype} ({expected} bytes expected)")
    return RegionInput(name, datatype, shape, region)


def _size(value: Any, key: str, where: str) -> int:
    if type(value) is not int or value < 0:
        raise InvalidRequest(f"{where}: invalid value {value!r} for '{key}', expected a non-negative integer")
    return value
