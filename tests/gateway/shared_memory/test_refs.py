"""Shared memory parameters in a V2 body, as ``gateway.v2_codec`` parses them."""

from __future__ import annotations

import orjson
import pytest

from broker.envelope import Response, WireTensor
from gateway.errors import InvalidRequest
from gateway.shared_memory.refs import RegionInput, RegionSlice
from gateway.v2_codec import RequestedOutput, parse_infer_request, render_infer_response


def _input(**parameters) -> dict:
    return {"name": "X", "shape": [2], "datatype": "INT32", "parameters": parameters}


def _request(*inputs: dict, outputs: list | None = None) -> bytes:
    return orjson.dumps({"inputs": list(inputs), **({"outputs": outputs} if outputs is not None else {})})


def test_an_input_in_shared_memory_parses_to_a_region_input():
    body = _request(_input(shared_memory_region="in", shared_memory_byte_size=8, shared_memory_offset=16),
                    {"name": "J", "shape": [1], "datatype": "INT32", "data": [1]})
    region_input, plain = parse_infer_request(body, None).inputs
    assert region_input == RegionInput("X", "INT32", (2,), RegionSlice("in", 8, 16))
    assert isinstance(plain, WireTensor) and plain.name == "J"


def test_a_bytes_input_takes_any_byte_size_and_the_offset_defaults_to_zero():
    body = _request({"name": "S", "shape": [3], "datatype": "BYTES",
                     "parameters": {"shared_memory_region": "in", "shared_memory_byte_size": 5}})
    assert parse_infer_request(body, None).inputs == (RegionInput("S", "BYTES", (3,), RegionSlice("in", 5)),)


def test_an_output_in_shared_memory_is_never_binary_even_when_binary_is_the_default():
    body = orjson.dumps({"inputs": [], "parameters": {"binary_data_output": True}, "outputs": [
        {"name": "Y", "parameters": {"shared_memory_region": "out", "shared_memory_byte_size": 8}},
        {"name": "Z"}]})
    assert parse_infer_request(body, None).outputs == (
        RequestedOutput("Y", False, RegionSlice("out", 8)), RequestedOutput("Z", True))


def test_an_output_in_shared_memory_is_rendered_as_metadata_and_its_parameters_without_data():
    reply = Response(id="", model="m", model_version="1",
                     outputs=(WireTensor("Y", "INT32", (2,), bytes(8)), WireTensor("Z", "INT32", (1,), bytes(4))))
    requested = (RequestedOutput("Y", False, RegionSlice("out", 8, 4)), RequestedOutput("Z", True))
    payload, header_length = render_infer_response(reply, requested, binary_default=False)
    header = orjson.loads(payload[:header_length])
    assert header["outputs"][0] == {"name": "Y", "datatype": "INT32", "shape": [2], "parameters": {
        "shared_memory_region": "out", "shared_memory_byte_size": 8, "shared_memory_offset": 4}}
    assert header["outputs"][1]["parameters"] == {"binary_data_size": 4}
    assert len(payload) == header_length + 4  # Z's bytes alone follow the header


SHM = {"shared_memory_region": "r", "shared_memory_byte_size": 8}
BAD = [
    ("data as well", _request({**_input(**SHM), "data": [1, 2]}),
     "input 'X' has both 'data' and 'parameters.shared_memory_region'"),
    ("binary data as well", _request(_input(**SHM, binary_data_size=8)),
     "input 'X' has both 'parameters.binary_data_size' and 'parameters.shared_memory_region'"),
    ("no byte size", _request(_input(shared_memory_region="r")),
     "input 'X': 'shared_memory_byte_size' must be specified along with 'shared_memory_region'"),
    ("offset without region", _request({**_input(shared_memory_offset=0), "data": [1, 2]}),
     "input 'X': 'shared_memory_offset' can not be specified without 'shared_memory_region'"),
    ("byte size without region", _request({**_input(shared_memory_byte_size=8), "data": [1, 2]}),
     "input 'X': 'shared_memory_byte_size' can not be specified without 'shared_memory_region'"),
    ("region not a string", _request(_input(shared_memory_region=3, shared_memory_byte_size=8)),
     "input 'X': invalid value for 'shared_memory_region', expected the name of a region"),
    ("region empty", _request(_input(shared_memory_region="", shared_memory_byte_size=8)),
     "expected the name of a region"),
    ("byte size negative", _request(_input(shared_memory_region="r", shared_memory_byte_size=-8)),
     "input 'X': invalid value -8 for 'shared_memory_byte_size', expected a non-negative integer"),
    ("offset a string", _request(_input(**SHM, shared_memory_offset="0")),
     "invalid value '0' for 'shared_memory_offset'"),
    ("offset a bool", _request(_input(**SHM, shared_memory_offset=True)),
     "invalid value True for 'shared_memory_offset'"),
    ("byte size vs shape", _request(_input(shared_memory_region="r", shared_memory_byte_size=4)),
     "input 'X': shared_memory_byte_size 4 does not match shape [2] of INT32 (8 bytes expected)"),
    ("output binary as well", _request(outputs=[{"name": "Y", "parameters": {**SHM, "binary_data": True}}]),
     "requested output 'Y' can't set both 'shared_memory_region' and 'binary_data'"),
    ("output without byte size", _request(outputs=[{"name": "Y", "parameters": {"shared_memory_region": "r"}}]),
     "requested output 'Y': 'shared_memory_byte_size' must be specified along with 'shared_memory_region'"),
]


@pytest.mark.parametrize("body, fragment", [case[1:] for case in BAD], ids=[case[0] for case in BAD])
def test_bad_shared_memory_parameters_are_refused_naming_the_tensor(body, fragment):
    with pytest.raises(InvalidRequest) as caught:
        parse_infer_request(body, None)
    assert fragment in str(caught.value)
