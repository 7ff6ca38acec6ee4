"""Property-based fuzz of the envelope: whatever the bytes, decoding raises
only ``EnvelopeError`` and ``peek_reply_to`` never raises; a request over the
count limits still yields the reply channel to answer it on; and every
request within the limits round-trips.

Derandomized, with no example database, so CI runs the same cases each time."""

from __future__ import annotations

from typing import Any

import msgpack
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from broker.envelope import (
    DEFAULT_LIMITS, Request, WireTensor, decode_request, decode_response, encode_request, peek_reply_to,
)
from broker.errors import EnvelopeError
from tests.broker.test_envelope import sample_request

FUZZ = settings(max_examples=200, derandomize=True, database=None, deadline=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
LIMITS = DEFAULT_LIMITS

INT64 = st.integers(min_value=-(2**63), max_value=2**64 - 1)  # what msgpack can carry
scalars = st.one_of(st.none(), st.booleans(), INT64, st.floats(), st.text(max_size=12), st.binary(max_size=12))
values = st.recursive(scalars, lambda inner: st.one_of(
    st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=8), inner, max_size=4)), max_leaves=12)
names = st.text(min_size=1, max_size=12)


def packed(body: Any) -> bytes:
    return msgpack.packb(body, use_bin_type=True)


def valid_body() -> dict[str, Any]:
    return msgpack.unpackb(encode_request(sample_request()), raw=False)


@st.composite
def mutated_requests(draw: st.DrawFn) -> bytes:
    body = valid_body()
    for _ in range(draw(st.integers(1, 3))):
        key = draw(st.one_of(st.sampled_from(sorted(body)), st.text(max_size=8)))
        if draw(st.booleans()):
            body[key] = draw(values)
        else:
            body.pop(key, None)
    return packed(body)


@st.composite
def over_limit_requests(draw: st.DrawFn) -> bytes:
    """A request whose id and reply channel are fine but which breaks a count limit."""
    body = valid_body()
    count = draw(st.integers(min_value=LIMITS.max_params + 1, max_value=2_000))
    field = draw(st.sampled_from(["parameters", "outputs", "inputs", "trace"]))
    if field in ("parameters", "trace"):
        body[field] = {f"k{i}": str(i) for i in range(count)}
    elif field == "outputs":
        body[field] = [f"o{i}" for i in range(count)]
    else:
        body[field] = [[f"t{i}", "INT8", [0], b""] for i in range(count)]
    return packed(body)


@st.composite
def requests_within_limits(draw: st.DrawFn) -> Request:
    tensor = st.builds(WireTensor, name=names, datatype=st.sampled_from(["FP32", "BYTES", "INT8"]),
                       shape=st.lists(st.integers(0, LIMITS.max_dim_size), max_size=LIMITS.max_dims).map(tuple),
                       data=st.binary(max_size=16))
    return sample_request(
        inputs=tuple(draw(st.lists(tensor, max_size=4))),
        outputs=tuple(draw(st.lists(names, max_size=4))),
        priority=draw(st.integers(0, 2**64 - 1)),
        timeout_us=draw(st.integers(0, LIMITS.max_timeout_us)),
        sequence_id=draw(st.one_of(st.none(), INT64, names)),
        parameters=draw(st.dictionaries(names, st.one_of(st.booleans(), INT64, st.floats(allow_nan=False),
                                                         st.text(max_size=8)), max_size=LIMITS.max_params)),
    )


@FUZZ
@given(st.one_of(st.binary(max_size=300), mutated_requests(), values.map(packed)))
def test_any_bytes_raise_only_envelope_error_and_peek_never_raises(raw):
    for decode in (decode_request, decode_response):
        try:
            decode(raw)
        except EnvelopeError:
            pass
    found = peek_reply_to(raw)
    assert found is None or all(isinstance(part, str) and part for part in found)


@FUZZ
@given(over_limit_requests())
def test_a_request_over_a_count_limit_can_still_be_answered(raw):
    try:
        decode_request(raw)
    except EnvelopeError:
        pass
    assert peek_reply_to(raw) == ("r1", "ferry.replies.g1")


@FUZZ
@given(requests_within_limits())
def test_every_request_within_the_limits_round_trips(request):
    assert decode_request(encode_request(request)) == request
