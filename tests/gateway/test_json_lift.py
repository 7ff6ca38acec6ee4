"""Large ``data`` arrays read apart from the header (gateway.json_lift): whatever
is lifted, the request parses to the same tensors and fails with the same
messages as when the header is read whole.

The reference is the same body with ``"~": "\\u0000"`` in front, which
load_lifted always reads whole."""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.errors import InvalidRequest
from gateway.json_lift import MIN_LIFT_BYTES, LiftedArray, load_lifted
from gateway.json_tensors import json_bytes
from gateway.v2_codec import parse_infer_request

FILL = b"0.5, " * (MIN_LIFT_BYTES // 4 + 1)  # makes any array long enough to lift
FILLED = FILL.count(b",")


def _data(core: bytes) -> bytes:
    """``core`` (the text inside one array's brackets) behind enough numbers to lift."""
    return b"[" + FILL + core + b"]"


def _body(data: bytes, datatype: str = "FP32", shape: list[int] | None = None, extra: bytes = b"") -> bytes:
    shape_text = orjson.dumps(shape if shape is not None else [data.count(b",") + 1])  # a flat array's
    return (b'{"inputs":[{"name":"X","datatype":"' + datatype.encode() + b'","shape":' + shape_text
            + b',"data":' + data + b"}]" + extra + b"}")


def _whole(body: bytes) -> bytes:
    return b'{"~":"\\u0000",' + body[1:]


def _outcome(body: bytes) -> Any:
    try:
        parsed = parse_infer_request(body, None)
    except InvalidRequest as exc:
        return ("error", str(exc))
    return [(t.name, t.datatype, t.shape, t.data) for t in parsed.inputs]


def _same_as_whole(body: bytes) -> Any:
    assert load_lifted(_whole(body), len(_whole(body))) is None
    outcome = _outcome(body)
    assert outcome == _outcome(_whole(body))
    return outcome


# -- lifted: the same tensors ------------------------------------------------

LIFTED = [
    ("flat", "FP32", _data(b"1.5, -2.25, 3")),
    ("no spaces", "FP32", b"[" + FILL.replace(b" ", b"") + b"1]"),
    ("newlines and tabs", "FP32", b"[\n\t" + FILL.replace(b" ", b"\n ") + b"1\r\n]"),
    ("exponents", "FP32", _data(b"1e5, 1E-5, -2.5e+3, 6.02e23, 1e-45, 3.4028234e38")),
    ("negative zero float", "FP32", _data(b"-0.0")),
    ("negative zero integer", "FP32", _data(b"-0")),
    ("FP16 rounding and subnormal", "FP16", _data(b"0.333, 65504, 6e-8")),
    ("FP64 extremes", "FP64", _data(b"1e300, 5e-324, -1.7976931348623157e308")),
    ("integers beyond 2**64 as floats", "FP64", _data(b"18446744073709551616, 123456789012345678901234567890")),
    ("integers for FP32", "FP32", _data(b"16777217, 9007199254740993")),
]


@pytest.mark.parametrize("case, datatype, data", LIFTED, ids=[case[0] for case in LIFTED])
def test_lifted_float_data_parses_to_the_same_tensor(case, datatype, data):
    body = _body(data, datatype)
    assert load_lifted(body, len(body)) is not None
    outcome = _same_as_whole(body)
    assert outcome[0][0] == "X"


def test_negative_zero_keeps_its_sign_only_as_a_float():
    (tensor,) = parse_infer_request(_body(_data(b"-0.0"), "FP32"), None).inputs
    values = np.frombuffer(tensor.data, "<f4")
    assert np.signbit(values[-1])
    (tensor,) = parse_infer_request(_body(_data(b"-0"), "FP32"), None).inputs
    assert not np.signbit(np.frombuffer(tensor.data, "<f4")[-1])


NESTED = [
    ("regular", b"[[" + FILL + b"1],[" + FILL + b"2]]", [2, FILLED + 1]),
    ("ragged but even", b"[[" + FILL + b"1],[2, 3]]", [FILLED + 3]),
    ("empty inner array", b"[[],[" + FILL + b"1]]", [FILLED + 1]),
    ("spaced brackets", b"[ [ " + FILL + b"1 ] , [ 2 ] ]", [FILLED + 2]),
]


@pytest.mark.parametrize("case, data, shape", NESTED, ids=[case[0] for case in NESTED])
def test_nested_data_parses_to_the_same_tensor(case, data, shape):
    body = _body(data, "FP32", shape)
    assert load_lifted(body, len(body)) is not None
    ((name, _, _, data_bytes),) = _same_as_whole(body)
    assert name == "X" and len(data_bytes) == 4 * int(np.prod(shape))


# -- lifted: the same errors -------------------------------------------------

ERRORS = [
    ("too few elements", "FP32", _data(b"1"), [FILLED + 2], "holds"),
    ("too many elements", "FP32", _data(b"1, 2"), [FILLED + 1], "holds"),
    ("FP32 overflow", "FP32", _data(b"3.5e38"), None, "out of range for FP32"),
    ("FP16 overflow", "FP16", _data(b"70000"), None, "out of range for FP16"),
    ("fraction for INT32", "INT32", _data(b"1"), None, "must be integers, found a fractional number"),
    ("exponent for INT64", "INT64", b"[" + FILL.replace(b"0.5", b"1e0") + b"1]", None, "must be integers"),
    ("numbers for BOOL", "BOOL", _data(b"1"), None, "must be true or false"),
    ("numbers for BYTES", "BYTES", _data(b"1"), None, "must be strings"),
    ("numbers for BF16", "BF16", _data(b"1"), None, "BF16 data cannot be sent as JSON"),
    ("value below a nested array", "FP32", _data(b"[1]"), None, "found an array"),
    ("mixed nesting", "FP32", b"[[" + FILL + b"1], 2]", [FILLED + 2], "mixes nested lists and values"),
]


@pytest.mark.parametrize("case, datatype, data, shape, fragment", ERRORS, ids=[case[0] for case in ERRORS])
def test_lifted_data_fails_with_the_same_message(case, datatype, data, shape, fragment):
    body = _body(data, datatype, shape)
    assert load_lifted(body, len(body)) is not None
    kind, message = _same_as_whole(body)
    assert kind == "error" and fragment in message and "input 'X'" in message


INTS = b"7, " * (MIN_LIFT_BYTES // 3 + 1)  # enough integers to lift
INTEGER_CASES = [
    ("INT64 extremes", "INT64", b"-9223372036854775808, 9223372036854775807, -0", None),
    ("UINT64 above 2**63", "UINT64", b"9223372036854775808, 18446744073709551615", None),
    ("UINT8 bounds", "UINT8", b"0, 255", None),
    ("INT64 overflow", "INT64", b"9223372036854775808", "out of range for INT64"),
    ("UINT64 negative", "UINT64", b"-1", "out of range for UINT64"),
    ("INT8 overflow", "INT8", b"128", "out of range for INT8"),
    ("UINT64 beyond 64 bits", "UINT64", b"18446744073709551616", "must be integers, found a fractional number"),
    ("negative and above 2**63", "INT64", b"-1, 9223372036854775808", "out of range for INT64"),
    ("a float among integers", "INT32", b"1.0", "must be integers, found a fractional number"),
]


@pytest.mark.parametrize("case, datatype, core, fragment", INTEGER_CASES, ids=[case[0] for case in INTEGER_CASES])
def test_lifted_integer_data_parses_or_fails_as_before(case, datatype, core, fragment):
    body = _body(b"[" + INTS + core + b"]", datatype)
    assert load_lifted(body, len(body)) is not None
    outcome = _same_as_whole(body)
    if fragment is None:
        assert outcome[0][1] == datatype
    else:
        assert outcome[0] == "error" and fragment in outcome[1]


def test_integer_data_too_large_for_the_datatype_fails_as_before():
    data = b"[" + INTS + b"9223372036854775808]"
    body = _body(data, "INT64")
    assert load_lifted(body, len(body)) is not None
    assert _same_as_whole(body) == ("error", "input 'X': a value is out of range for INT64 "
                                              "[-9223372036854775808, 9223372036854775807]")
    extremes = b"[" + INTS + b"-9223372036854775808, 9223372036854775807]"
    (tensor,) = parse_infer_request(_body(extremes, "INT64"), None).inputs
    assert list(np.frombuffer(tensor.data, "<i8")[-2:]) == [-2**63, 2**63 - 1]


# -- read whole ----------------------------------------------------------------

WHOLE = [
    ("strings", _data(b'"1"'), b""),
    ("booleans", _data(b"true"), b""),
    ("null", _data(b"null"), b""),
    ("object", _data(b"{}"), b""),
    ("NaN", _data(b"NaN"), b""),
    ("Infinity", _data(b"-Infinity"), b""),
    ("double comma", _data(b"1,,2"), b""),
    ("trailing comma", _data(b"1,"), b""),
    ("leading zero", _data(b"01"), b""),
    ("bare point", _data(b"1."), b""),
    ("plus sign", _data(b"+1"), b""),
    ("infinite double", _data(b"1e400"), b""),
    ("unclosed", b"[" + FILL, b""),
    ("short", b"[1, 2, 3]", b""),
    ("placeholder-like string elsewhere", _data(b"1"), b',"id":"\\u0000ferry-data-0"'),
    ("data also under parameters", _data(b"1"), b',"parameters":{"data":' + _data(b"2") + b"}"),
    ("inputs given twice", _data(b"1"), b',"inputs":[]'),
]


@pytest.mark.parametrize("case, data, extra", WHOLE, ids=[case[0] for case in WHOLE])
def test_what_text_cannot_vouch_for_is_read_whole(case, data, extra):
    body = _body(data, "FP32", None, extra)
    assert load_lifted(body, len(body)) is None  # so parse_infer_request reads it as it always did


def test_malformed_json_keeps_its_position_in_the_message():
    body = _body(_data(b"1,,2"))
    with pytest.raises(InvalidRequest, match=f"malformed JSON in request header: .*char {body.index(b',,') + 1}"):
        parse_infer_request(body, None)


def test_several_inputs_keep_their_order_and_their_binary_data():
    header = (b'{"inputs":[{"name":"A","datatype":"FP32","shape":[' + str(FILLED + 1).encode() + b'],"data":'
              + _data(b"1") + b'},{"name":"B","datatype":"INT8","shape":[2],"parameters":{"binary_data_size":2}},'
              b'{"name":"C","datatype":"FP16","shape":[' + str(FILLED + 1).encode() + b'],"data":' + _data(b"2")
              + b'},{"name":"D","datatype":"BYTES","shape":[1],"data":["x"]}]}')
    body = header + b"\x01\x02"
    assert load_lifted(body, len(header)) is not None
    parsed = parse_infer_request(body, len(header))
    assert [t.name for t in parsed.inputs] == ["A", "B", "C", "D"]
    assert parsed.inputs[1].data == b"\x01\x02"
    assert np.frombuffer(parsed.inputs[2].data, "<f2")[-1] == 2.0


def test_a_lifted_array_holds_what_orjson_reads():
    text = b"[[" + FILL + b"1], [2]]"
    body = _body(text, "FP32", [FILLED + 2])
    header = load_lifted(body, len(body))
    assert header is not None
    lifted = header["inputs"][0]["data"]
    assert isinstance(lifted, LiftedArray) and lifted.values == orjson.loads(text)


def test_nesting_as_deep_as_orjson_allows_there_is_lifted_and_one_more_level_is_not():
    for depth, lifted in ((1021, True), (1022, False)):
        body = _body(b"[" * depth + FILL + b"1" + b"]" * depth, "FP32", [FILLED + 1])
        assert (load_lifted(body, len(body)) is not None) is lifted
        if lifted:
            assert _outcome(body) == _outcome(_whole(body))


# -- fuzz ----------------------------------------------------------------------

_pieces = st.sampled_from([b"0", b"1", b"-", b"+", b".", b"e", b"E", b"5", b"9", b",", b", ", b"[", b"]",
                           b" ", b"\n", b"07", b"1.5", b"-0", b"1e400", b"true", b'"x"', b"null", b"{}"])


@settings(max_examples=200, derandomize=True, database=None, deadline=None)
@given(st.lists(_pieces, max_size=12), st.sampled_from(["FP32", "FP16", "FP64", "INT64", "UINT8", "BOOL"]))
def test_fuzzed_data_parses_exactly_as_when_read_whole(core, datatype):
    data = _data(b"".join(core))
    body = _body(data, datatype)
    header = load_lifted(body, len(body))
    if header is not None:
        whole = orjson.loads(body)  # only valid JSON is lifted
        lifted = header["inputs"][0]["data"]
        assert lifted.values == whole["inputs"][0]["data"]
        assert _json_outcome(datatype, lifted) == _json_outcome(datatype, lifted.values)
        assert _outcome(body) == _outcome(_whole(body))


_numbers = st.one_of(st.floats(allow_nan=False, allow_infinity=False),
                     st.floats(allow_nan=False, allow_infinity=False, width=32),
                     st.integers(-(2**70), 2**70), st.integers(-300, 300), st.just(-0.0))


@settings(max_examples=200, derandomize=True, database=None, deadline=None)
@given(st.lists(_numbers, min_size=1, max_size=20), st.sampled_from([b",", b", ", b" ,\n\t"]),
       st.sampled_from(["FP32", "FP16", "FP64", "INT64", "INT8", "UINT64", "BYTES"]))
def test_fuzzed_numbers_parse_exactly_as_when_read_whole(values, separator, datatype):
    data = _data(separator.join(json.dumps(value).encode() for value in values))
    body = _body(data, datatype)
    assert load_lifted(body, len(body)) is not None
    assert _outcome(body) == _outcome(_whole(body))


def _json_outcome(datatype: str, data: Any) -> Any:
    try:
        return json_bytes("X", datatype, (len(data.values if isinstance(data, LiftedArray) else data),), data)
    except InvalidRequest as exc:
        return str(exc)
