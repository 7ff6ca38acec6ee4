"""Large ``data`` arrays read apart from the rest of a V2 JSON header, so that the
text of each one can vouch for what it holds.

The per-element cost of a JSON tensor was in three parts: orjson building a
Python number for each element, ``json_tensors`` checking the type of every one
of them, and numpy converting them. When an array's text holds no ``t``, ``f``
or ``n`` (so no true, false or null) and, being bounded by the next ``"``,
``{`` or ``}``, no string or object, every element is a number, and the check
can be skipped (a list left among them still makes numpy refuse the array).
Parsing such arrays in numpy straight from the bytes was measured too, and is
slower than orjson (``benchmarks/README.md``), so orjson still reads the numbers.

Each such ``"data": [...]`` is parsed by orjson on its own, and a placeholder
string put in its place for the parse of the remainder. Placeholders start
with a NUL, so they cannot collide with anything the client wrote when the
header holds no ``\\u0000``. Unless every array parses, every placeholder comes
back as the ``data`` of an entry of ``inputs`` and the remainder is valid JSON,
``load_lifted`` gives up and the header is read whole as before: a client sees
the same tensors and the same errors either way.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import orjson

MIN_LIFT_BYTES = 16384  # below this the skipped check saves no more than lifting costs (bench_json.py)
_DATA_KEY = re.compile(rb'"data"[ \t\n\r]*:[ \t\n\r]*\[')
_PLACEHOLDER = "\x00ferry-data-"
_NOT_NUMBERS = (b"t", b"f", b"n")  # true, false, null; strings and objects lie past the end
# An input's data sits three levels down (header, inputs, input): read with as many
# around it, a nested array meets orjson's nesting limit exactly where it would there.
_NESTING = (b"[[[", b"]]]")


@dataclass(frozen=True, slots=True)
class LiftedArray:
    """A ``data`` array whose text held numbers and arrays only, as orjson read it."""

    values: list[Any]


def load_lifted(body: bytes, length: int) -> dict[str, Any] | None:
    """The JSON header ``body[:length]`` with its large numeric ``data`` arrays as
    ``LiftedArray``; None when there are none, or when it must be read whole to be sure."""
    if length < MIN_LIFT_BYTES:
        return None
    text = body if type(body) is bytes else bytes(body)
    if text.find(b"\\", 0, length) >= 0 and text.find(b"\\u0000", 0, length) >= 0:
        return None
    pieces: list[bytes] = []
    lifted: list[LiftedArray] = []
    done = searched = 0
    # search, not finditer: a match is looked for again only past a lifted array,
    # whose text (no quotes) need not be searched for the next key
    while (match := _DATA_KEY.search(text, searched, length)) is not None:
        start = match.end() - 1
        array = _lift(text, start, length)
        if array is None:
            searched = match.end()
            continue
        end, found = array
        pieces += [text[done:start], b'"\\u0000ferry-data-%d"' % len(lifted)]
        lifted.append(found)
        done = searched = end
    if not lifted:
        return None
    pieces.append(text[done:length])
    try:
        header = orjson.loads(b"".join(pieces))
    except orjson.JSONDecodeError:
        return None
    return header if _put_back(header, lifted) else None


def _lift(text: bytes, start: int, length: int) -> tuple[int, LiftedArray] | None:
    """The end of the array opening at ``text[start]`` and its values, if it is
    long, holds nothing but numbers and arrays, and orjson reads it."""
    stop = min((at for at in (text.find(mark, start, length) for mark in (b'"', b"{", b"}")) if at >= 0),
               default=length)
    close = text.find(b"]", start, stop)
    if close < 0:
        return None
    nested = text.find(b"[", start + 1, close) >= 0
    # A nested array ends at the last ']' before the next string or object: in valid
    # JSON only ',' and blanks can lie between, and invalid JSON fails to parse below.
    end = text.rfind(b"]", start, stop) + 1 if nested else close + 1
    if end - start < MIN_LIFT_BYTES or any(text.find(mark, start, end) >= 0 for mark in _NOT_NUMBERS):
        return None
    try:
        if nested:
            values = orjson.loads(_NESTING[0] + text[start:end] + _NESTING[1])[0][0][0]
        else:
            values = orjson.loads(memoryview(text)[start:end])
    except orjson.JSONDecodeError:
        return None
    return end, LiftedArray(values)


def _put_back(header: Any, lifted: list[LiftedArray]) -> bool:
    """Replace each placeholder that is an input's ``data``; True if that was all of them."""
    inputs = header.get("inputs") if isinstance(header, dict) else None
    found = 0
    for item in inputs if isinstance(inputs, list) else ():
        data = item.get("data") if isinstance(item, dict) else None
        if isinstance(data, str) and data.startswith(_PLACEHOLDER):
            item["data"] = lifted[int(data[len(_PLACEHOLDER):])]
            found += 1
    return found == len(lifted)
