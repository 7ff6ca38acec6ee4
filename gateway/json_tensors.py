"""A tensor's ``data`` as a KServe V2 JSON body gives it, turned into the raw
little-endian bytes the envelope carries (BYTES: length-prefixed strings).

orjson hands over exact Python types, checked per datatype before numpy sees
them, and each value is range-checked, so nothing is cast or wrapped quietly.
Checking the type of every element costs as much as numpy's conversion, so it
is skipped where the array's own text has shown that all of them are numbers
(``gateway.json_lift``): for a float datatype, which takes any number, and for
an integer one when numpy's type discovery finds only integers.
"""

from __future__ import annotations

import itertools
from typing import Any

import numpy as np

from gateway.errors import InvalidRequest
from gateway.json_lift import LiftedArray
from workers.datatypes import element_count, join_bytes, numpy_dtype

INTEGERS = frozenset({"UINT8", "UINT16", "UINT32", "UINT64", "INT8", "INT16", "INT32", "INT64"})
FLOATS = frozenset({"FP16", "FP32", "FP64"})
# Exact Python types orjson yields per datatype: checked up front because
# numpy would quietly cast 1.5 to 1, True to 1 or "2" to 2.0.
_JSON_TYPES: dict[str, frozenset[type]] = {
    "BOOL": frozenset({bool}),
    "BYTES": frozenset({str}),
    **{name: frozenset({int}) for name in INTEGERS},
    **{name: frozenset({int, float}) for name in FLOATS},
}
_JSON_EXPECTED = {"BOOL": "true or false", "BYTES": "strings",
                  **{name: "integers" for name in INTEGERS}, **{name: "numbers" for name in FLOATS}}
_JSON_NAMES = {bool: "a boolean", int: "an integer", float: "a fractional number", str: "a string",
               list: "an array", dict: "an object", type(None): "null"}


def json_bytes(name: str, datatype: str, shape: tuple[int, ...], data: Any) -> bytes:
    where = f"input '{name}'"
    if datatype == "BF16":
        raise InvalidRequest(f"{where}: BF16 data cannot be sent as JSON; send it as binary tensor data")
    lifted = isinstance(data, LiftedArray)
    flat = _flatten(data.values if lifted else data, where)
    count = element_count(shape)
    if len(flat) != count:
        raise InvalidRequest(f"{where}: 'data' holds {len(flat)} elements but shape {list(shape)} "
                             f"needs {count}")
    if lifted:
        vouched = _vouched_array(where, datatype, flat)
        if vouched is not None:
            return vouched.tobytes()
    found = set(map(type, flat)) - _JSON_TYPES[datatype]
    if found:
        kinds = ", ".join(sorted(json_name_of_type(kind) for kind in found))
        raise InvalidRequest(f"{where}: {datatype} data must be {_JSON_EXPECTED[datatype]}, found {kinds}")
    if datatype == "BYTES":
        return join_bytes([text.encode("utf-8") for text in flat])
    return _numeric_array(where, datatype, flat).tobytes()


def _flatten(data: Any, where: str) -> list[Any]:
    if not isinstance(data, list):
        raise InvalidRequest(f"{where}: field 'data' must be a list, got {json_name(data)}")
    flat = data
    while flat and type(flat[0]) is list:
        if set(map(type, flat)) != {list}:
            raise InvalidRequest(f"{where}: 'data' mixes nested lists and values at one level")
        flat = list(itertools.chain.from_iterable(flat))
    return flat


def _vouched_array(where: str, datatype: str, flat: list[Any]) -> np.ndarray | None:
    """The array of elements known to be numbers or lists, skipping the check of each
    one's type; None where that check is still needed: a list among the numbers
    (numpy refuses the ragged array), or an integer type given floats."""
    try:
        if datatype in FLOATS:
            return _numeric_array(where, datatype, flat)
        if datatype not in INTEGERS:
            return None
        # numpy's own type discovery is one pass where checking types and converting
        # are two: integer kinds come out only when every element is an int in 64 bits.
        discovered = np.array(flat)
    except ValueError:
        return None
    if discovered.dtype.kind not in "iu":
        return None
    return _narrowed(where, datatype, numpy_dtype(datatype), discovered)


def _numeric_array(where: str, datatype: str, flat: list[Any]) -> np.ndarray:
    dtype = numpy_dtype(datatype)
    if datatype in INTEGERS:
        return _integer_array(where, datatype, dtype, flat)
    if datatype == "BOOL":
        return np.array(flat, dtype=dtype)
    with np.errstate(over="ignore"):
        array = np.array(flat, dtype=dtype)
    # JSON cannot spell infinity, so any here is an overflow of a finite value.
    if not np.isfinite(array).all():
        raise InvalidRequest(f"{where}: a value is out of range for {datatype}")
    return array


def _integer_array(where: str, datatype: str, dtype: np.dtype, flat: list[Any]) -> np.ndarray:
    # Widen first and compare after, so no numpy version wraps out-of-range values silently.
    wide_dtype = np.uint64 if datatype == "UINT64" else np.int64
    try:
        wide = np.array(flat, dtype=wide_dtype)
    except OverflowError:
        wide = None
    return _narrowed(where, datatype, dtype, wide)


def _narrowed(where: str, datatype: str, dtype: np.dtype, wide: np.ndarray | None) -> np.ndarray:
    info = np.iinfo(dtype)
    if wide is None or (wide.size and (wide.min() < info.min or wide.max() > info.max)):
        raise InvalidRequest(f"{where}: a value is out of range for {datatype} "
                             f"[{info.min}, {info.max}]")
    return wide.astype(dtype)


def json_name(value: Any) -> str:
    return json_name_of_type(type(value))


def json_name_of_type(kind: type) -> str:
    return _JSON_NAMES.get(kind, kind.__name__)
