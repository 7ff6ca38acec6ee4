"""Triton datatypes and their numpy and wire forms.

Three spellings exist for one type: the KServe V2 name (``FP32``), the
``config.pbtxt`` name (``TYPE_FP32``) and a numpy dtype. On the wire a tensor
is raw little-endian bytes; BYTES elements are each a 4-byte little-endian
length followed by the bytes, exactly as the V2 binary extension sends them.
"""

from __future__ import annotations

import struct
from typing import Any

import ml_dtypes
import numpy as np

from workers.errors import TensorError

_NUMPY = {
    "BOOL": np.dtype(np.bool_),
    "UINT8": np.dtype("<u1"),
    "UINT16": np.dtype("<u2"),
    "UINT32": np.dtype("<u4"),
    "UINT64": np.dtype("<u8"),
    "INT8": np.dtype("<i1"),
    "INT16": np.dtype("<i2"),
    "INT32": np.dtype("<i4"),
    "INT64": np.dtype("<i8"),
    "FP16": np.dtype("<f2"),
    "FP32": np.dtype("<f4"),
    "FP64": np.dtype("<f8"),
    "BF16": np.dtype(ml_dtypes.bfloat16),
}

DATATYPES = frozenset(_NUMPY) | {"BYTES"}

_FROM_NUMPY = {dtype: name for name, dtype in _NUMPY.items()}


def config_datatype(value: Any) -> str:
    """A config's ``data_type`` (``TYPE_FP32``, or ``FP32``) as a V2 datatype;
    ValueError otherwise, for pydantic validators to report."""
    if not isinstance(value, str):
        raise ValueError(f"expected a type such as TYPE_FP32, got {value!r}")
    if value in DATATYPES:
        return value
    try:
        return from_config_name(value)
    except TensorError as err:
        raise ValueError(str(err)) from None


def from_config_name(name: str) -> str:
    """``TYPE_FP32`` -> ``FP32``; ``TYPE_STRING`` -> ``BYTES``."""
    if not name.startswith("TYPE_"):
        raise TensorError(f"data_type '{name}' must start with TYPE_")
    short = name[len("TYPE_"):]
    short = "BYTES" if short == "STRING" else short
    if short not in DATATYPES:
        raise TensorError(f"unknown data_type '{name}'")
    return short


def to_config_name(datatype: str) -> str:
    return "TYPE_STRING" if datatype == "BYTES" else f"TYPE_{datatype}"


def numpy_dtype(datatype: str) -> np.dtype:
    """The numpy dtype for a fixed-size datatype; BYTES maps to object."""
    if datatype == "BYTES":
        return np.dtype(object)
    try:
        return _NUMPY[datatype]
    except KeyError:
        raise TensorError(f"unknown datatype '{datatype}'") from None


def datatype_of(array: np.ndarray) -> str:
    """The V2 datatype name of a numpy array."""
    if array.dtype.kind in "OSU":
        return "BYTES"
    dtype = array.dtype.newbyteorder("<") if array.dtype.byteorder == ">" else array.dtype
    try:
        return _FROM_NUMPY[dtype]
    except KeyError:
        raise TensorError(f"numpy dtype {array.dtype} has no V2 datatype") from None


def element_size(datatype: str) -> int | None:
    """Bytes per element, or None for BYTES (variable length)."""
    return None if datatype == "BYTES" else numpy_dtype(datatype).itemsize


def element_count(shape: tuple[int, ...] | list[int]) -> int:
    count = 1
    for dim in shape:
        count *= dim
    return count


def decode_array(name: str, datatype: str, shape: tuple[int, ...], data: bytes | memoryview) -> np.ndarray:
    """Raw wire bytes -> numpy array, checking the size against the shape."""
    if shape and min(shape) < 0:
        raise TensorError(f"tensor '{name}': shape {list(shape)} has a negative dimension")
    count = element_count(shape)
    if datatype == "BYTES":
        return np.array(split_bytes(name, data, count), dtype=object).reshape(shape)
    dtype = numpy_dtype(datatype)
    if len(data) != count * dtype.itemsize:
        raise TensorError(
            f"tensor '{name}': {len(data)} bytes of {datatype} do not fill shape "
            f"{list(shape)} ({count} elements, {count * dtype.itemsize} bytes expected)"
        )
    return np.frombuffer(data, dtype=dtype).reshape(shape)


def encode_array(array: np.ndarray) -> tuple[str, bytes | memoryview]:
    """numpy array -> (datatype, raw wire bytes). Those of a numeric array are a view on
    it (a copy only where it is not contiguous): the array must not change afterwards."""
    datatype = datatype_of(array)
    if datatype == "BYTES":
        return datatype, join_bytes(array.reshape(-1))
    dtype = numpy_dtype(datatype)
    return datatype, np.ascontiguousarray(array, dtype=dtype).reshape(-1).view(np.uint8).data


def split_bytes(name: str, data: bytes | memoryview, count: int) -> list[bytes]:
    """Parse ``count`` length-prefixed BYTES elements, using all of ``data``."""
    view = memoryview(data)
    items: list[bytes] = []
    offset = 0
    for index in range(count):
        if offset + 4 > len(view):
            raise TensorError(
                f"tensor '{name}': BYTES element {index} has no length prefix "
                f"(buffer ends at byte {len(view)})"
            )
        (length,) = struct.unpack_from("<I", view, offset)
        offset += 4
        if offset + length > len(view):
            raise TensorError(
                f"tensor '{name}': BYTES element {index} declares {length} bytes, "
                f"which runs past the end of the {len(view)}-byte buffer"
            )
        items.append(bytes(view[offset:offset + length]))
        offset += length
    if offset != len(view):
        raise TensorError(
            f"tensor '{name}': {len(view) - offset} bytes left over after "
            f"{count} BYTES elements"
        )
    return items


def join_bytes(elements: np.ndarray | list[object]) -> bytes:
    parts: list[bytes] = []
    for element in elements:
        raw = as_bytes(element)
        parts.append(struct.pack("<I", len(raw)))
        parts.append(raw)
    return b"".join(parts)


def as_bytes(element: object) -> bytes:
    if isinstance(element, bytes):
        return element
    if isinstance(element, str):
        return element.encode("utf-8")
    if isinstance(element, (bytearray, memoryview)):
        return bytes(element)
    return str(element).encode("utf-8")
