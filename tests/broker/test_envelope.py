import dataclasses
import random

import msgpack
import pytest

from broker.envelope import (
    ErrorInfo, Limits, Request, Response, WireTensor, decode_request, decode_response,
    encode_request, encode_response, peek_reply_to,
)
from broker.errors import EnvelopeError


def sample_request(**overrides) -> Request:
    fields = dict(
        id="r1", model="add_sub", model_version="2", reply_to="ferry.replies.g1",
        inputs=(WireTensor("INPUT0", "FP32", (1, 4), b"\x00" * 16),
                WireTensor("TEXT", "BYTES", (1,), b"\x02\x00\x00\x00hi")),
        outputs=("OUTPUT0",), priority=1, timeout_us=5000, deadline_ns=123, sequence_id="s-9",
        sequence_start=True, parameters={"custom": 1.5, "flag": True}, trace={"traceparent": "00-ab-cd-01"},
        created_ns=42,
    )
    fields.update(overrides)
    return Request(**fields)


def test_request_round_trips():
    request = sample_request()
    assert decode_request(encode_request(request)) == request


def test_response_round_trips_with_and_without_error():
    ok = Response(id="r1", model="m", model_version="1", outputs=(WireTensor("Y", "INT8", (2,), b"\x01\x02"),))
    failed = Response(id="r2", model="m", error=ErrorInfo("invalid_argument", "bad"))
    assert decode_response(encode_response(ok)) == ok
    assert decode_response(encode_response(failed)) == failed


def _raw(body: dict) -> bytes:
    return msgpack.packb(body, use_bin_type=True)


def _valid_body() -> dict:
    return msgpack.unpackb(encode_request(sample_request()), raw=False)


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda b: b.pop("id"), "field 'id'"),
        (lambda b: b.update(id=7), "field 'id'"),
        (lambda b: b.update(v=99), "version"),
        (lambda b: b.update(kind="response"), "request envelope"),
        (lambda b: b.update(inputs=[["x", "FP32", [1], "text-not-bytes"]]), "data must be bytes"),
        (lambda b: b.update(inputs=[["x", "FP32", [-1], b""]]), "non-negative"),
        (lambda b: b.update(inputs=[["x", "FP32", [1] * 17, b""]]), "shape"),
        (lambda b: b.update(inputs=[["x", "FP32", [True], b""]]), "non-negative"),
        (lambda b: b.update(priority="high"), "field 'priority'"),
        (lambda b: b.update(sequence_start=1), "field 'sequence_start'"),
        (lambda b: b.update(parameters={"p": [1, 2]}), "parameter 'p'"),
        (lambda b: b.update(sequence_id=1.5), "field 'sequence_id'"),
    ],
)
def test_malformed_fields_raise_one_clear_error(mutate, message):
    body = _valid_body()
    mutate(body)
    with pytest.raises(EnvelopeError, match=message):
        decode_request(_raw(body))


def test_ext_types_are_refused():
    raw = msgpack.packb({"v": 1, "kind": "request", "id": msgpack.ExtType(1, b"x")}, use_bin_type=True)
    with pytest.raises(EnvelopeError, match="ext type"):
        decode_request(raw)


def test_size_limits_are_enforced():
    raw = encode_request(sample_request())
    with pytest.raises(EnvelopeError, match="exceeds"):
        decode_request(raw, Limits(max_message_bytes=len(raw) - 1))
    many = sample_request(inputs=tuple(WireTensor(f"t{i}", "INT8", (0,), b"") for i in range(300)))
    with pytest.raises(EnvelopeError):
        decode_request(encode_request(many))


def test_random_bytes_and_truncations_only_ever_raise_envelope_error():
    rng = random.Random(7)
    valid = encode_request(sample_request())
    candidates = [valid[:n] for n in range(0, len(valid), 3)]
    candidates += [bytes(rng.randrange(256) for _ in range(rng.randrange(1, 200))) for _ in range(300)]
    for raw in candidates:
        try:
            decode_request(raw)
        except EnvelopeError:
            pass


def test_peek_reply_to_reads_what_it_can_from_a_broken_request():
    body = _valid_body()
    body["inputs"] = "garbage"
    assert peek_reply_to(_raw(body)) == ("r1", "ferry.replies.g1")
    assert peek_reply_to(b"\xc1not msgpack") is None


def test_peek_reply_to_reads_a_request_over_the_count_limits_so_it_can_be_answered():
    for field, value in (("parameters", {f"p{i}": i for i in range(65)}), ("outputs", [f"o{i}" for i in range(1025)])):
        body = _valid_body()
        body[field] = value
        with pytest.raises(EnvelopeError):
            decode_request(_raw(body))
        assert peek_reply_to(_raw(body)) == ("r1", "ferry.replies.g1")


def test_a_timeout_past_the_limit_is_refused():
    body = _valid_body()
    body["timeout_us"] = Limits().max_timeout_us + 1
    with pytest.raises(EnvelopeError, match="timeout_us"):
        decode_request(_raw(body))


def test_with_id_changes_the_id_and_keeps_every_other_field() -> None:
    original = Response(id="r1", model="m", model_version="3", outputs=(WireTensor("Y", "INT8", (1,), b"\x01"),),
                        error=ErrorInfo("internal", "x"), parameters={"k": 1}, final=False)
    renamed = original.with_id("client-7")
    assert renamed.id == "client-7"
    for each in dataclasses.fields(Response):  # a field added later and left out of with_id fails here
        if each.name != "id":
            assert getattr(renamed, each.name) == getattr(original, each.name), each.name
