import random

import ml_dtypes
import numpy as np
import orjson
import pytest
import tritonclient.http as triton

from broker.envelope import Response, WireTensor
from gateway.errors import InvalidRequest
from gateway.v2_codec import (
    ParsedInfer, RequestedOutput, parse_infer_request, render_error, render_infer_response,
)
from workers.datatypes import decode_array, join_bytes


def _ints(dtype: str) -> np.ndarray:
    info = np.iinfo(dtype)
    return np.array([[info.min, 0, 1], [7, info.max - 1, info.max]], dtype=dtype)


SAMPLES: dict[str, np.ndarray] = {
    "BOOL": np.array([[True, False, True], [False, False, True]]),
    **{name: _ints(name.lower()) for name in
       ("UINT8", "UINT16", "UINT32", "UINT64", "INT8", "INT16", "INT32", "INT64")},
    "FP16": np.array([[-1.5, 0.0, 65504.0], [0.333, 1e-4, -2.0]], dtype=np.float16),
    "FP32": np.array([[-1.5, 0.1, 3.4e38], [1e-30, 2.0, -7.25]], dtype=np.float32),
    "FP64": np.array([[-1.5, 0.1, 1e300], [5e-324, 2.0, -7.25]], dtype=np.float64),
    "BF16": np.array([[-1.5, 0.0, 3.0e38], [0.125, 2.0, -7.0]], dtype=ml_dtypes.bfloat16),
    "BYTES": np.array([[b"a", b"", "\u00e9t\u00e9".encode()], [b"\x00\x01", b"long" * 50, b"z"]],
                      dtype=object),
}
JSON_DATATYPES = [name for name in SAMPLES if name != "BF16"]


def _wire(name: str, datatype: str, array: np.ndarray) -> bytes:
    if datatype == "BYTES":
        return join_bytes(array.reshape(-1))
    return array.tobytes()


def _body(header: dict, *blobs: bytes) -> tuple[bytes, int | None]:
    head = orjson.dumps(header)
    return (head + b"".join(blobs), len(head)) if blobs else (head, None)


def _parse_one(header_input: dict, *blobs: bytes) -> WireTensor:
    body, length = _body({"inputs": [header_input]}, *blobs)
    (tensor,) = parse_infer_request(body, length).inputs
    return tensor


def _as_equal(expected: np.ndarray, actual: np.ndarray) -> None:
    assert actual.shape == expected.shape
    if expected.dtype == object:
        as_bytes = [v if isinstance(v, bytes) else v.encode() for v in actual.reshape(-1)]
        assert as_bytes == list(expected.reshape(-1))
    else:
        np.testing.assert_array_equal(actual.astype(expected.dtype), expected)


# -- request parsing: every datatype, both encodings ----------------------------

@pytest.mark.parametrize("datatype", list(SAMPLES))
def test_binary_input_round_trips_every_datatype(datatype):
    array = SAMPLES[datatype]
    raw = _wire("X", datatype, array)
    tensor = _parse_one({"name": "X", "shape": [2, 3], "datatype": datatype,
                         "parameters": {"binary_data_size": len(raw)}}, raw)
    assert tensor == WireTensor("X", datatype, (2, 3), raw)


def test_a_binary_input_is_a_view_on_the_body_it_arrived_in():
    raw = np.arange(6, dtype=np.float32).tobytes()
    body, length = _body({"inputs": [{"name": "X", "shape": [2, 3], "datatype": "FP32",
                                      "parameters": {"binary_data_size": len(raw)}}]}, raw)
    (tensor,) = parse_infer_request(body, length).inputs
    array = decode_array("X", "FP32", (2, 3), tensor.data)
    assert np.shares_memory(array, np.frombuffer(body, np.uint8)), "the input's bytes were copied"
    np.testing.assert_array_equal(array, np.arange(6, dtype=np.float32).reshape(2, 3))


@pytest.mark.parametrize("datatype", [d for d in JSON_DATATYPES if d != "BYTES"])
def test_json_input_round_trips_every_numeric_datatype(datatype):
    array = SAMPLES[datatype]
    tensor = _parse_one({"name": "X", "shape": [2, 3], "datatype": datatype, "data": array.tolist()})
    assert tensor == WireTensor("X", datatype, (2, 3), array.tobytes())


def test_json_bytes_input_is_utf8_encoded_with_length_prefixes():
    tensor = _parse_one({"name": "S", "shape": [3], "datatype": "BYTES", "data": ["a", "", "\u00e9"]})
    assert tensor.data == join_bytes([b"a", b"", "\u00e9".encode()])


def test_flat_and_nested_json_data_give_the_same_bytes():
    flat = _parse_one({"name": "X", "shape": [2, 2], "datatype": "INT32", "data": [1, 2, 3, 4]})
    nested = _parse_one({"name": "X", "shape": [2, 2], "datatype": "INT32", "data": [[1, 2], [3, 4]]})
    assert flat == nested


def test_integers_are_accepted_for_float_datatypes():
    tensor = _parse_one({"name": "X", "shape": [2], "datatype": "FP32", "data": [1, 2.5]})
    assert tensor.data == np.array([1, 2.5], dtype="<f4").tobytes()


def test_mixed_binary_and_json_inputs_take_binary_bytes_in_input_order():
    a, c = np.arange(4, dtype="<i4"), np.arange(3, dtype="<f8")
    header = {"id": "req-1", "inputs": [
        {"name": "A", "shape": [4], "datatype": "INT32", "parameters": {"binary_data_size": 16}},
        {"name": "B", "shape": [2], "datatype": "BOOL", "data": [True, False]},
        {"name": "C", "shape": [3], "datatype": "FP64", "parameters": {"binary_data_size": 24}},
    ]}
    parsed = parse_infer_request(*_body(header, a.tobytes(), c.tobytes()))
    assert parsed.id == "req-1"
    assert [t.name for t in parsed.inputs] == ["A", "B", "C"]
    assert parsed.inputs[0].data == a.tobytes()
    assert parsed.inputs[1].data == b"\x01\x00"
    assert parsed.inputs[2].data == c.tobytes()


def test_zero_element_tensors_parse_in_both_encodings():
    header = {"inputs": [
        {"name": "A", "shape": [0, 3], "datatype": "FP32", "data": []},
        {"name": "B", "shape": [0], "datatype": "BYTES", "parameters": {"binary_data_size": 0}},
    ]}
    parsed = parse_infer_request(orjson.dumps(header), len(orjson.dumps(header)))
    assert [t.data for t in parsed.inputs] == [b"", b""]


# -- requested outputs and parameters -----------------------------------------

@pytest.mark.parametrize("parameters, outputs, expected_default, expected", [
    (None, None, False, ()),
    ({"binary_data_output": True}, None, True, ()),
    ({"binary_data_output": True}, [{"name": "Y"}, {"name": "Z", "parameters": {"binary_data": False}}],
     True, (RequestedOutput("Y", True), RequestedOutput("Z", False))),
    (None, [{"name": "Y", "parameters": {"binary_data": True}}, {"name": "Z"}],
     False, (RequestedOutput("Y", True), RequestedOutput("Z", False))),
])
def test_binary_output_flags_follow_request_default_and_per_output_override(
        parameters, outputs, expected_default, expected):
    header: dict = {"inputs": []}
    if parameters is not None:
        header["parameters"] = parameters
    if outputs is not None:
        header["outputs"] = outputs
    parsed = parse_infer_request(orjson.dumps(header), None)
    assert parsed.binary_output_default is expected_default
    assert parsed.outputs == expected


def test_request_parameters_pass_through_without_the_codec_flag():
    header = {"inputs": [], "parameters": {"binary_data_output": True, "priority": 2, "custom": "x"}}
    parsed = parse_infer_request(orjson.dumps(header), None)
    assert parsed == ParsedInfer(id="", inputs=(), outputs=(), parameters={"priority": 2, "custom": "x"},
                                 binary_output_default=True)


def test_a_header_sent_again_reads_each_request_s_own_bytes():
    """A header read once is remembered by its bytes: the next request with the same header
    gets its own tensors, ids and parameters, and a body of the wrong length is still refused."""
    header = {"id": "same", "parameters": {"custom": 1}, "inputs": [
        {"name": "A", "shape": [4], "datatype": "FP32", "parameters": {"binary_data_size": 16}},
        {"name": "S", "shape": [1], "datatype": "BYTES", "parameters": {"binary_data_size": 6}},
    ], "outputs": [{"name": "Y", "parameters": {"binary_data": True}}]}
    parsed = []
    for seed in range(3):
        a = np.full(4, seed, dtype=np.float32)
        parsed.append((a, parse_infer_request(*_body(header, a.tobytes(), join_bytes([b"s%d" % seed])))))
    for seed, (a, each) in enumerate(parsed):
        first, strings = each.inputs
        np.testing.assert_array_equal(decode_array("A", "FP32", (4,), first.data), a)
        assert bytes(strings.data) == join_bytes([b"s%d" % seed])
        assert each.id == "same" and each.outputs == (RequestedOutput("Y", True),)
    parsed[0][1].parameters["custom"] = 2  # one request's parameters are its own
    assert parsed[1][1].parameters == {"custom": 1}
    body, length = _body(header, b"\0" * 16, join_bytes([b"s"]))
    with pytest.raises(InvalidRequest, match="adds up to 22 bytes, but 21 bytes follow"):
        parse_infer_request(body, length)
    bad_strings, length = _body(header, b"\0" * 16, b"\x09\0\0\0ab")
    with pytest.raises(InvalidRequest, match="input 'S'"):
        parse_infer_request(bad_strings, length)


# -- bad requests ---------------------------------------------------------------

def _one(**fields) -> bytes:
    tensor = {"name": "X", "shape": [2], "datatype": "INT32", "data": [1, 2]}
    tensor.update(fields)
    return orjson.dumps({"inputs": [{k: v for k, v in tensor.items() if v is not _DROP}]})


_DROP = object()
_BIN = {"binary_data_size": 8}
_GOOD_HEAD = orjson.dumps({"inputs": [{"name": "X", "shape": [2], "datatype": "INT32", "parameters": _BIN}]})

BAD_REQUESTS = [
    ("malformed JSON", b'{"inputs": [', None, "malformed JSON"),
    ("empty body", b"", None, "malformed JSON"),
    ("invalid utf-8", b'{"id": "\xff"}', None, "malformed JSON"),
    ("NaN literal", b'{"inputs":[{"name":"X","shape":[1],"datatype":"FP32","data":[NaN]}]}', None,
     "NaN and Infinity are not valid JSON"),
    ("Infinity literal", b'{"inputs":[{"name":"X","shape":[1],"datatype":"FP32","data":[-Infinity]}]}',
     None, "NaN and Infinity are not valid JSON"),
    ("header is a list", b"[1, 2]", None, "must be a JSON object"),
    ("inputs missing", b"{}", None, "'inputs' is missing"),
    ("inputs not a list", b'{"inputs": {}}', None, "'inputs' must be a list"),
    ("input not an object", b'{"inputs": [3]}', None, "inputs[0] must be an object"),
    ("id not a string", b'{"id": 5, "inputs": []}', None, "'id' must be a string"),
    ("parameters not an object", b'{"parameters": [], "inputs": []}', None, "'parameters' must be an object"),
    ("binary_data_output not bool", b'{"parameters": {"binary_data_output": 1}, "inputs": []}', None,
     "binary_data_output"),
    ("name missing", _one(name=_DROP), None, "inputs[0]: field 'name'"),
    ("name not a string", _one(name=7), None, "inputs[0]: field 'name'"),
    ("shape missing", _one(shape=_DROP), None, "input 'X': field 'shape'"),
    ("shape not a list", _one(shape="2"), None, "input 'X': field 'shape'"),
    ("shape holds a float", _one(shape=[2.0]), None, "input 'X': shape"),
    ("shape holds a bool", _one(shape=[True, 2]), None, "input 'X': shape"),
    ("negative dimension", _one(shape=[-2]), None, "input 'X': shape [-2] has a negative dimension"),
    ("too many dimensions", _one(shape=[1] * 17, data=[1]), None, "input 'X': shape has 17 dimensions"),
    ("datatype missing", _one(datatype=_DROP), None, "input 'X': field 'datatype'"),
    ("unknown datatype", _one(datatype="FP8"), None, "input 'X': unknown datatype 'FP8'"),
    ("data count short", _one(data=[1]), None, "input 'X': 'data' holds 1 elements"),
    ("data count long", _one(data=[[1, 2], [3]]), None, "input 'X': 'data' holds 3 elements"),
    ("data not a list", _one(data=5), None, "input 'X': field 'data' must be a list"),
    ("data mixes nesting", _one(data=[[1], 2]), None, "input 'X': 'data' mixes nested lists"),
    ("neither data nor binary", _one(data=_DROP), None, "input 'X' has neither"),
    ("both data and binary", _one(parameters=_BIN), None, "input 'X' has both"),
    ("strings for FP32", _one(datatype="FP32", data=["1", "2"]), None, "input 'X': FP32 data must be numbers"),
    ("floats for INT32", _one(data=[1.5, 2]), None, "input 'X': INT32 data must be integers"),
    ("whole floats for INT32", _one(data=[1.0, 2]), None, "input 'X': INT32 data must be integers"),
    ("bools for INT32", _one(data=[True, 1]), None, "input 'X': INT32 data must be integers, found a boolean"),
    ("ints for BOOL", _one(datatype="BOOL", data=[1, 0]), None, "input 'X': BOOL data must be true or false"),
    ("numbers for BYTES", _one(datatype="BYTES", data=[1, "a"]), None, "input 'X': BYTES data must be strings"),
    ("nulls for FP64", _one(datatype="FP64", data=[None, 1.0]), None, "found null"),
    ("300 for UINT8", _one(datatype="UINT8", data=[300, 1]), None, "input 'X': a value is out of range for UINT8"),
    ("-1 for UINT16", _one(datatype="UINT16", data=[-1, 1]), None, "out of range for UINT16"),
    ("-1 for UINT64", _one(datatype="UINT64", data=[-1, 1]), None, "out of range for UINT64"),
    ("2**31 for INT32", _one(data=[2**31, 1]), None, "out of range for INT32"),
    ("2**63 for INT64", _one(datatype="INT64", data=[2**63, 1]), None, "out of range for INT64"),
    ("beyond 64 bits", b'{"inputs":[{"name":"X","shape":[1],"datatype":"UINT64","data":[18446744073709551616]}]}',
     None, "UINT64 data must be integers"),
    ("FP16 overflow", _one(datatype="FP16", data=[70000.0, 1]), None, "out of range for FP16"),
    ("FP32 overflow", _one(datatype="FP32", data=[1e300, 1]), None, "out of range for FP32"),
    ("BF16 as JSON", _one(datatype="BF16", data=[1.0, 2.0]), None, "input 'X': BF16 data cannot be sent as JSON"),
    ("duplicate inputs", orjson.dumps({"inputs": [orjson.loads(_one())["inputs"][0]] * 2}), None,
     "input 'X' appears more than once"),
    ("binary size not an int", _one(data=_DROP, parameters={"binary_data_size": "8"}), None,
     "'binary_data_size' must be a non-negative integer"),
    ("binary size negative", _one(data=_DROP, parameters={"binary_data_size": -8}), None,
     "'binary_data_size' must be a non-negative integer"),
    ("binary size vs shape", _one(data=_DROP, parameters={"binary_data_size": 7}), None,
     "input 'X': binary_data_size 7 does not match shape [2] of INT32 (8 bytes expected)"),
    ("binary without header length", _GOOD_HEAD + bytes(8), None, "header missing?"),
    ("binary size, no bytes, no header length", _GOOD_HEAD, None, "header missing?"),
    ("binary bytes short", _GOOD_HEAD + bytes(7), len(_GOOD_HEAD), "adds up to 8 bytes, but 7 bytes follow"),
    ("binary bytes long", _GOOD_HEAD + bytes(9), len(_GOOD_HEAD), "adds up to 8 bytes, but 9 bytes follow"),
    ("trailing bytes, no binary input", _one() + b"xx", len(_one()), "adds up to 0 bytes, but 2 bytes"),
    ("header length past body", _one(), len(_one()) + 1, "larger than the"),
    ("header length negative", _one(), -1, "is negative"),
    ("header length not an int", _one(), "12", "is not an integer"),
    ("header length a bool", _one(), True, "is not an integer"),
    ("header length cuts JSON", _one(), 5, "malformed JSON"),
    ("shared memory input without its size", _one(data=_DROP, parameters={"shared_memory_region": "r"}), None,
     "input 'X': 'shared_memory_byte_size' must be specified along with 'shared_memory_region'"),
    ("outputs not a list", b'{"inputs": [], "outputs": {}}', None, "'outputs' must be a list"),
    ("output not an object", b'{"inputs": [], "outputs": ["Y"]}', None, "outputs[0] must be an object"),
    ("output without name", b'{"inputs": [], "outputs": [{}]}', None, "outputs[0]: field 'name'"),
    ("output binary_data not bool", b'{"inputs":[],"outputs":[{"name":"Y","parameters":{"binary_data":1}}]}',
     None, "requested output 'Y': parameter 'binary_data' must be true or false"),
    ("duplicate outputs", b'{"inputs":[],"outputs":[{"name":"Y"},{"name":"Y"}]}', None,
     "output 'Y' appears more than once"),
    ("classification not a count", b'{"inputs":[],"outputs":[{"name":"Y","parameters":{"classification":"3"}}]}',
     None, "requested output 'Y': Unable to set 'classification'"),
]


def _bytes_case(data: bytes, count: int) -> tuple[bytes, int]:
    head = orjson.dumps({"inputs": [{"name": "S", "shape": [count], "datatype": "BYTES",
                                     "parameters": {"binary_data_size": len(data)}}]})
    return head + data, len(head)


BAD_BYTES = [
    ("length prefix runs past buffer", b"\x05\x00\x00\x00abc", 1, "declares 5 bytes"),
    ("truncated length prefix", b"\x01\x00", 1, "has no length prefix"),
    ("bytes left over", b"\x01\x00\x00\x00ab", 1, "1 bytes left over"),
    ("fewer elements than shape", b"\x01\x00\x00\x00a", 2, "element 1 has no length prefix"),
]


@pytest.mark.parametrize("body, header_length, fragment",
                         [case[1:] for case in BAD_REQUESTS], ids=[case[0] for case in BAD_REQUESTS])
def test_bad_request_is_rejected_naming_the_fault(body, header_length, fragment):
    with pytest.raises(InvalidRequest) as caught:
        parse_infer_request(body, header_length)
    assert fragment in str(caught.value)


@pytest.mark.parametrize("data, count, fragment", [c[1:] for c in BAD_BYTES], ids=[c[0] for c in BAD_BYTES])
def test_malformed_binary_bytes_input_is_rejected(data, count, fragment):
    with pytest.raises(InvalidRequest) as caught:
        parse_infer_request(*_bytes_case(data, count))
    assert "input 'S'" in str(caught.value) and fragment in str(caught.value)


def _valid_bodies() -> list[tuple[bytes, int | None]]:
    a = np.arange(6, dtype="<f4")
    header = {"id": "f", "parameters": {"binary_data_output": True}, "inputs": [
        {"name": "A", "shape": [2, 3], "datatype": "FP32", "parameters": {"binary_data_size": 24}},
        {"name": "S", "shape": [2], "datatype": "BYTES", "parameters": {"binary_data_size": 12}},
        {"name": "J", "shape": [2, 2], "datatype": "INT16", "data": [[1, -2], [3, 4]]},
        {"name": "T", "shape": [1], "datatype": "BYTES", "data": ["x\u00e9"]},
    ], "outputs": [{"name": "Y", "parameters": {"binary_data": False}}]}
    return [_body(header, a.tobytes(), join_bytes([b"ab", b"cd"])), _body({"inputs": header["inputs"][2:]})]


def _parse_or_reject(body: bytes, header_length) -> None:
    try:
        parse_infer_request(body, header_length)
    except InvalidRequest:
        pass


def test_fuzzed_bodies_raise_nothing_but_invalid_request():
    rng = random.Random(1234)
    for body, length in _valid_bodies():
        parse_infer_request(body, length)
        for cut in range(len(body)):
            _parse_or_reject(body[:cut], length)
            _parse_or_reject(body[:cut], cut if length is None else min(length, cut))
        for _ in range(3000):
            mutated = bytearray(body)
            for _ in range(rng.randint(1, 4)):
                mutated[rng.randrange(len(mutated))] = rng.randrange(256)
            _parse_or_reject(bytes(mutated), length)
    tokens = [b"{", b"}", b"[", b"]", b",", b":", b'"inputs"', b'"name"', b'"shape"', b'"datatype"', b'"data"',
              b'"FP32"', b'"BYTES"', b'"parameters"', b'"binary_data_size"', b"1", b"-1", b"0.5", b"true",
              b"null", b'"x"', b"1e400", b"99999999999999999999"]
    for _ in range(3000):
        noise = b"".join(rng.choice(tokens) for _ in range(rng.randint(0, 30)))
        _parse_or_reject(noise, rng.choice([None, 0, len(noise), rng.randint(-2, len(noise) + 2)]))
        _parse_or_reject(rng.randbytes(rng.randint(0, 64)), rng.choice([None, rng.randint(0, 64)]))


# -- response rendering ---------------------------------------------------------

def _response(*tensors: WireTensor, **fields) -> Response:
    return Response(id=fields.get("id", "r1"), model="m", model_version="3", outputs=tensors,
                    parameters=fields.get("parameters", {}))


def _tensor(datatype: str, name: str = "Y") -> WireTensor:
    return WireTensor(name, datatype, (2, 3), _wire(name, datatype, SAMPLES[datatype]))


@pytest.mark.parametrize("datatype", list(SAMPLES))
def test_binary_output_round_trips_through_tritonclient(datatype):
    body, length = render_infer_response(_response(_tensor(datatype)), (), True)
    assert length is not None
    result = triton.InferResult.from_response_body(body, verbose=False, header_length=length)
    _as_equal(SAMPLES[datatype], result.as_numpy("Y"))


@pytest.mark.parametrize("datatype", JSON_DATATYPES)
def test_json_output_round_trips_through_tritonclient(datatype):
    body, length = render_infer_response(_response(_tensor(datatype)), (RequestedOutput("Y", False),), True)
    assert length is None
    header = orjson.loads(body)
    data = header["outputs"][0]["data"]
    assert isinstance(data, list) and len(data) == 6 and not isinstance(data[0], list)
    result = triton.InferResult.from_response_body(body, verbose=False, header_length=None)
    _as_equal(SAMPLES[datatype], result.as_numpy("Y"))


def test_response_header_carries_model_id_and_parameters():
    body, _ = render_infer_response(_response(_tensor("INT8"), parameters={"k": 1}), (), False)
    header = orjson.loads(body)
    assert {k: header[k] for k in ("model_name", "model_version", "id", "parameters")} == {
        "model_name": "m", "model_version": "3", "id": "r1", "parameters": {"k": 1}}
    assert header["outputs"][0] == {"name": "Y", "datatype": "INT8", "shape": [2, 3],
                                    "data": SAMPLES["INT8"].reshape(-1).tolist()}


def test_response_omits_empty_id_and_parameters():
    header = orjson.loads(render_infer_response(_response(id=""), (), False)[0])
    assert header == {"model_name": "m", "model_version": "3", "outputs": []}


def test_requested_outputs_come_in_requested_order_with_blobs_in_that_order():
    a, b, c = _tensor("INT32", "A"), _tensor("FP64", "B"), _tensor("BYTES", "C")
    requested = (RequestedOutput("C", True), RequestedOutput("A", False), RequestedOutput("B", True))
    body, length = render_infer_response(_response(a, b, c), requested, False)
    header = orjson.loads(body[:length])
    assert [o["name"] for o in header["outputs"]] == ["C", "A", "B"]
    assert body[length:] == c.data + b.data
    result = triton.InferResult.from_response_body(body, verbose=False, header_length=length)
    for name, dtype in (("A", "INT32"), ("B", "FP64"), ("C", "BYTES")):
        _as_equal(SAMPLES[dtype], result.as_numpy(name))


def test_zero_size_binary_output_still_sets_header_length():
    empty = WireTensor("E", "FP32", (0,), b"")
    body, length = render_infer_response(_response(empty), (), True)
    assert length == len(body)
    result = triton.InferResult.from_response_body(body, verbose=False, header_length=length)
    assert result.as_numpy("E").shape == (0,)


@pytest.mark.parametrize("tensor, requested, fragment", [
    (_tensor("INT8"), (RequestedOutput("Z", False),), "requested output 'Z' is not produced"),
    (WireTensor("Y", "BYTES", (1,), join_bytes([b"\xff\xfe"])), (), "output 'Y' holds bytes that are not valid UTF-8"),
    (_tensor("BF16"), (), "output 'Y' is BF16, which cannot be returned as JSON"),
    (WireTensor("Y", "FP32", (2,), np.array([np.nan, 1], "<f4").tobytes()), (), "output 'Y' holds NaN or Infinity"),
    (WireTensor("Y", "FP16", (1,), np.array([np.inf], "<f2").tobytes()), (), "output 'Y' holds NaN or Infinity"),
])
def test_unrenderable_json_output_is_rejected(tensor, requested, fragment):
    with pytest.raises(InvalidRequest) as caught:
        render_infer_response(_response(tensor), requested, False)
    assert fragment in str(caught.value)


def test_non_finite_output_is_fine_as_binary():
    tensor = WireTensor("Y", "FP32", (2,), np.array([np.nan, np.inf], "<f4").tobytes())
    body, length = render_infer_response(_response(tensor), (), True)
    assert body[length:] == tensor.data


def test_render_error_is_a_json_object():
    assert orjson.loads(render_error("bad \"thing\"")) == {"error": "bad \"thing\""}


# -- cross-check with the official tritonclient ----------------------------------

def _triton_input(name: str, datatype: str, binary: bool) -> triton.InferInput:
    tensor = triton.InferInput(name, list(SAMPLES[datatype].shape), datatype)
    return tensor.set_data_from_numpy(SAMPLES[datatype], binary_data=binary)


@pytest.mark.parametrize("binary", [True, False], ids=["binary", "json"])
def test_tritonclient_request_bodies_parse_to_the_original_arrays(binary):
    datatypes = list(SAMPLES) if binary else JSON_DATATYPES
    inputs = [_triton_input(f"IN_{d}", d, binary) for d in datatypes]
    body, json_size = triton.InferenceServerClient.generate_request_body(
        inputs, request_id="tc-1", parameters={"custom": "v"})
    parsed = parse_infer_request(body, json_size)
    assert parsed.id == "tc-1" and parsed.parameters == {"custom": "v"}
    assert parsed.binary_output_default is True  # tritonclient asks for binary when no outputs are named
    for datatype, tensor in zip(datatypes, parsed.inputs, strict=True):
        assert (tensor.name, tensor.datatype) == (f"IN_{datatype}", datatype)
        _as_equal(SAMPLES[datatype], decode_array(tensor.name, datatype, tensor.shape, tensor.data))


def test_tritonclient_mixed_request_with_requested_outputs():
    inputs = [_triton_input("A", "FP16", True), _triton_input("B", "BYTES", False),
              _triton_input("C", "BF16", True), _triton_input("D", "UINT64", False)]
    outputs = [triton.InferRequestedOutput("Y", binary_data=False), triton.InferRequestedOutput("Z")]
    body, json_size = triton.InferenceServerClient.generate_request_body(inputs, outputs=outputs)
    parsed = parse_infer_request(body, json_size)
    assert parsed.outputs == (RequestedOutput("Y", False), RequestedOutput("Z", True))
    assert parsed.binary_output_default is False
    for (name, datatype), tensor in zip([("A", "FP16"), ("B", "BYTES"), ("C", "BF16"), ("D", "UINT64")],
                                        parsed.inputs, strict=True):
        _as_equal(SAMPLES[datatype], decode_array(name, datatype, tensor.shape, tensor.data))


def test_tritonclient_json_nan_is_rejected_with_a_hint():
    tensor = triton.InferInput("F", [2], "FP32")
    tensor.set_data_from_numpy(np.array([np.nan, 1], dtype=np.float32), binary_data=False)
    body, json_size = triton.InferenceServerClient.generate_request_body([tensor])
    with pytest.raises(InvalidRequest, match="NaN and Infinity are not valid JSON"):
        parse_infer_request(body, json_size)


def test_full_loop_tritonclient_request_to_tritonclient_result():
    inputs = [_triton_input("A", "INT64", True), _triton_input("B", "BYTES", True)]
    outputs = [triton.InferRequestedOutput("B", binary_data=False), triton.InferRequestedOutput("A")]
    parsed = parse_infer_request(*triton.InferenceServerClient.generate_request_body(
        inputs, outputs=outputs, request_id="loop"))
    echoed = Response(id=parsed.id, model="echo", outputs=parsed.inputs)
    body, length = render_infer_response(echoed, parsed.outputs, parsed.binary_output_default)
    result = triton.InferResult.from_response_body(body, verbose=False, header_length=length)
    assert result.get_response()["id"] == "loop"
    _as_equal(SAMPLES["INT64"], result.as_numpy("A"))
    _as_equal(SAMPLES["BYTES"], result.as_numpy("B"))
