"""Compressed bodies: inflating what Triton's clients send, refusing what cannot be
inflated safely, and choosing a response encoding from Accept-Encoding."""

from __future__ import annotations

import gzip
import zlib

import pytest

from gateway.compression import compress, decompress, response_encoding
from gateway.errors import InvalidRequest, PayloadTooLarge, UnsupportedEncoding

BODY = b'{"inputs": []}' * 100


@pytest.mark.parametrize(("encoding", "packed"), [
    ("gzip", gzip.compress(BODY)), ("deflate", zlib.compress(BODY)), ("GZIP", gzip.compress(BODY)),
    ("identity", BODY), (None, BODY), ("", BODY),
])
def test_what_tritonclient_sends_is_inflated(encoding, packed):
    assert decompress(packed, encoding, 1 << 20) == BODY


@pytest.mark.parametrize("encoding", ["br", "zstd", "compress", "gzip, br"])
def test_other_encodings_are_refused_naming_those_taken(encoding):
    with pytest.raises(UnsupportedEncoding, match="^Unsupported compression type$") as raised:
        decompress(BODY, encoding, 1 << 20)
    assert raised.value.accepted == "gzip, deflate"


def test_a_body_that_inflates_past_the_limit_is_refused_before_it_is_all_inflated():
    bomb = gzip.compress(bytes(64 << 20))  # 64 MiB of zeros in about 64 KB
    with pytest.raises(PayloadTooLarge, match="inflates past the 1048576-byte limit"):
        decompress(bomb, "gzip", 1 << 20)
    assert decompress(gzip.compress(bytes(1 << 20)), "gzip", 1 << 20) == bytes(1 << 20)  # exactly the limit


@pytest.mark.parametrize(("encoding", "packed", "error"), [
    ("gzip", b"not gzip at all", "not valid gzip data"),
    ("deflate", gzip.compress(BODY), "not valid deflate data"),
    ("gzip", gzip.compress(BODY)[:-12], "ends early"),
    ("deflate", zlib.compress(BODY) + b"tail", "4 bytes after its deflate data"),
])
def test_broken_compressed_bodies_are_bad_requests(encoding, packed, error):
    with pytest.raises(InvalidRequest, match=error):
        decompress(packed, encoding, 1 << 20)


@pytest.mark.parametrize(("accept", "chosen"), [
    (None, None), ("", None), ("identity", None), ("br", None),
    ("gzip", "gzip"), ("deflate", "deflate"), ("deflate, gzip", "deflate"),
    ("gzip;q=0.5, deflate", "deflate"), ("gzip;q=0, deflate;q=0", None), ("gzip;q=abc, deflate;q=0.1", "deflate"),
    (" GZip ; q=0.9 , br", "gzip"),
])
def test_the_response_encoding_follows_accept_encoding_weights(accept, chosen):
    assert response_encoding(accept) == chosen


@pytest.mark.parametrize("encoding", ["gzip", "deflate"])
def test_compress_is_what_clients_inflate(encoding):
    packed = compress(BODY, encoding)
    assert (gzip.decompress(packed) if encoding == "gzip" else zlib.decompress(packed)) == BODY
