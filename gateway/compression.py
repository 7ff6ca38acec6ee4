"""Compressed HTTP bodies, as Triton takes and gives them.

A request body may come with ``Content-Encoding: gzip`` or ``deflate`` (the
zlib format, which is what HTTP's ``deflate`` means and what ``tritonclient``
sends); ``identity`` or no header means none. Any other encoding is refused
with Triton's message and an ``Accept-Encoding`` header naming the two it
takes. An infer response is compressed when ``Accept-Encoding`` asks for gzip
or deflate, the one with the higher ``q`` weight, ties to the first listed.

A body is inflated at most to the server's body limit, so a small
compressed body cannot grow into an unbounded one (a "zip bomb").
"""

from __future__ import annotations

import zlib

from gateway.errors import InvalidRequest, PayloadTooLarge, UnsupportedEncoding

ACCEPTED = "gzip, deflate"
_WBITS = {"gzip": 16 + zlib.MAX_WBITS, "deflate": zlib.MAX_WBITS}
_CHUNK = 1 << 20


def decompress(body: bytes, encoding: str | None, limit: int) -> bytes:
    """``body`` decoded by its ``Content-Encoding``, at most ``limit`` bytes of it."""
    name = (encoding or "").strip().lower()
    if name in ("", "identity"):
        return body
    wbits = _WBITS.get(name)
    if wbits is None:
        raise UnsupportedEncoding("Unsupported compression type", ACCEPTED)
    inflater = zlib.decompressobj(wbits)
    parts: list[bytes] = []
    size = 0
    pending = body
    try:
        while pending:
            part = inflater.decompress(pending, min(_CHUNK, limit - size + 1))
            size += len(part)
            if size > limit:
                raise PayloadTooLarge(f"request body inflates past the {limit}-byte limit ({name})")
            parts.append(part)
            pending = inflater.unconsumed_tail
            if inflater.eof:
                break
        if not inflater.eof:
            raise InvalidRequest(f"request body is not complete {name} data: it ends early")
    except zlib.error as exc:
        raise InvalidRequest(f"request body is not valid {name} data: {exc}") from None
    if inflater.unused_data:
        raise InvalidRequest(f"request body has {len(inflater.unused_data)} bytes after its {name} data")
    return b"".join(parts)


def response_encoding(accept: str | None) -> str | None:
    """``gzip`` or ``deflate`` if ``Accept-Encoding`` wants one, else None (send as is)."""
    if not accept:
        return None
    best: str | None = None
    best_weight = 0.0
    for item in accept.split(","):
        name, _, params = item.partition(";")
        name = name.strip().lower()
        if name not in _WBITS:
            continue
        weight = _weight(params)
        if weight > best_weight:
            best, best_weight = name, weight
    return best


def compress(payload: bytes, encoding: str) -> bytes:
    packer = zlib.compressobj(6, zlib.DEFLATED, _WBITS[encoding])
    return packer.compress(payload) + packer.flush()


def _weight(params: str) -> float:
    """The ``q`` of ``;q=0.5`` (1 when absent, 0 when unreadable: not wanted)."""
    for param in params.split(";"):
        key, _, value = param.partition("=")
        if key.strip().lower() == "q":
            try:
                weight = float(value.strip())
            except ValueError:
                return 0.0
            return weight if 0.0 <= weight <= 1.0 else 0.0
    return 1.0
