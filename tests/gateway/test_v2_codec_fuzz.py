"""Property-based fuzz of the V2 request parser: whatever the bytes, only
``InvalidRequest`` escapes, and whatever it accepts (and ``build_request``
turns into an envelope) a worker can decode: the gateway and the envelope
hold a request to one set of limits.

Derandomized, with no example database, so CI runs the same cases each time."""

from __future__ import annotations

import struct
from typing import Any

import orjson
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from broker.envelope import decode_request, encode_request
from gateway.errors import InvalidRequest
from gateway.service import build_request
from gateway.v2_codec import parse_infer_request
from workers.datatypes import DATATYPES

FUZZ = settings(max_examples=150, derandomize=True, database=None, deadline=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])

INT64 = st.integers(min_value=-(2**63), max_value=2**64 - 1)  # what orjson reads as an int
scalars = st.one_of(st.none(), st.booleans(), INT64, st.floats(allow_nan=False, allow_infinity=False),
                    st.text(max_size=20))
json_values = st.recursive(scalars, lambda inner: st.one_of(
    st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=8), inner, max_size=4)), max_leaves=12)
names = st.one_of(st.sampled_from(["INPUT0", "x", ""]), st.text(min_size=250, max_size=260), json_values)
dims = st.one_of(st.integers(min_value=-2, max_value=4), st.sampled_from([2**40 - 1, 2**40, 2**62, 2**64 - 1]))
shapes = st.one_of(st.lists(dims, max_size=18), json_values)
datatypes = st.one_of(st.sampled_from(sorted(DATATYPES)), st.text(max_size=6))
parameter_values = st.one_of(scalars, st.sampled_from([2**62, 2**64 - 1, 2_592_000_000_000, -1]), json_values)
known_parameters = st.sampled_from(["timeout", "priority", "sequence_id", "sequence_start", "sequence_end",
                                    "binary_data_output", "binary_data_size"])
parameters = st.one_of(
    st.dictionaries(st.one_of(known_parameters, st.text(max_size=6)), parameter_values, max_size=6),
    st.integers(min_value=60, max_value=70).map(lambda n: {f"p{i}": i for i in range(n)}),
    json_values,
)


@st.composite
def tensors(draw: st.DrawFn) -> Any:
    tensor: dict[str, Any] = {"name": draw(names), "datatype": draw(datatypes), "shape": draw(shapes)}
    if draw(st.booleans()):
        tensor["data"] = draw(st.one_of(st.lists(scalars, max_size=8), json_values))
    if draw(st.booleans()):
        tensor["parameters"] = draw(st.one_of(
            st.fixed_dictionaries({"binary_data_size": st.one_of(st.integers(-1, 40), json_values)}),
            json_values))
    return draw(st.one_of(st.just(tensor), json_values)) if draw(st.integers(0, 9)) == 0 else tensor


def tensor_lists(count: st.SearchStrategy[int]) -> st.SearchStrategy[list[Any]]:
    return st.one_of(st.lists(tensors(), max_size=3),
                     count.map(lambda n: [{"name": f"t{i}", "datatype": "FP32", "shape": [0], "data": []}
                                          for i in range(n)]))


@st.composite
def bodies(draw: st.DrawFn) -> tuple[bytes, int | None]:
    header: dict[str, Any] = {}
    for key, strategy in (("id", st.one_of(st.text(max_size=8), json_values)),
                          ("inputs", st.one_of(tensor_lists(st.integers(250, 260)), json_values)),
                          ("outputs", st.one_of(tensor_lists(st.integers(250, 1030)), json_values)),
                          ("parameters", parameters)):
        if draw(st.integers(0, 4)):
            header[key] = draw(strategy)
    head = orjson.dumps(header)
    blob = draw(st.one_of(st.just(b""), st.binary(max_size=64), st.lists(
        st.binary(max_size=8), max_size=4).map(lambda items: b"".join(struct.pack("<I", len(i)) + i for i in items))))
    header_length = draw(st.one_of(st.none(), st.just(len(head)), st.integers(-2, len(head) + len(blob) + 2)))
    return head + blob, header_length


@FUZZ
@given(st.binary(max_size=200), st.one_of(st.none(), st.integers(-5, 250)))
def test_arbitrary_bytes_raise_only_invalid_request(body, header_length):
    try:
        parse_infer_request(body, header_length)
    except InvalidRequest:
        pass


@FUZZ
@given(bodies())
def test_what_the_gateway_accepts_a_worker_can_decode(case):
    body, header_length = case
    try:
        parsed = parse_infer_request(body, header_length)
        request = build_request(parsed, "m", "", "ferry.replies.g1", "r1", now_ns=1_700_000_000_000_000_000)
    except InvalidRequest:
        return
    assert decode_request(encode_request(request)) == request
