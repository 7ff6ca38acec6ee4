"""Claim-check tensors against a real redis-server: what is stashed, redeemed, deleted and expired."""

from __future__ import annotations

import asyncio

import pytest
import redis.asyncio as aioredis

from broker.claims.check import ClaimCheck, ClaimSettings, NoClaims
from broker.claims.redis_store import RedisClaims
from broker.claims.store import process_tag
from broker.envelope import Request, Response, WireTensor, decode_request, decode_response, encode_request, \
    encode_response
from broker.errors import ClaimMissing, EnvelopeError
from tests.redis_server import flushdb

SMALL = WireTensor("SMALL", "UINT8", (8,), bytes(range(8)))
LARGE = WireTensor("LARGE", "UINT8", (4096,), bytes(i % 251 for i in range(4096)))


def request(*inputs: WireTensor, reply_to: str = "ferry.replies.g1") -> Request:
    return Request(id="r1", model="m", inputs=inputs, reply_to=reply_to)


@pytest.fixture
async def claims(redis_url: str):
    flushdb(redis_url)
    check = ClaimCheck(RedisClaims(redis_url), ClaimSettings(threshold_bytes=1024, ttl_s=60))
    yield check
    await check.aclose()


async def claim_keys(redis_url: str) -> list[bytes]:
    client = aioredis.Redis.from_url(redis_url)
    try:
        return [key async for key in client.scan_iter("ferry.claim.*")]
    finally:
        await client.aclose()


def test_a_claimed_tensor_crosses_the_envelope_without_its_bytes():
    claimed = WireTensor("LARGE", "UINT8", (4096,), b"", claim="redis:abc")
    wire = encode_request(Request(id="r", model="m", inputs=(claimed, SMALL), reply_to="x", claim_owner="12.345"))
    assert len(wire) < 400  # not the 4,096 bytes
    decoded = decode_request(wire)
    assert decoded.inputs == (claimed, SMALL) and decoded.claim_owner == "12.345"
    assert decode_response(encode_response(Response(id="r", model="m", outputs=(claimed,)))).outputs == (claimed,)


@pytest.mark.parametrize(("entry", "message"), [
    (["X", "UINT8", [1], b"\x01", "redis:abc"], "with empty data"),
    (["X", "UINT8", [1], b"", 7], "claim must be a non-empty string"),
    (["X", "UINT8", [1], b"", ""], "claim must be a non-empty string"),
    (["X", "UINT8", [1], b"", "c" * 300], "at most 256 characters"),
])
def test_a_malformed_claim_is_refused_by_the_envelope(entry, message):
    import msgpack

    body = msgpack.unpackb(encode_request(request(SMALL)))
    body["inputs"] = [entry]
    with pytest.raises(EnvelopeError, match=message):
        decode_request(msgpack.packb(body, use_bin_type=True))


async def test_only_tensors_at_the_threshold_are_stashed_and_they_come_back_whole(claims, redis_url):
    stashed = await claims.stash_request(request(SMALL, LARGE), claim_outputs=True)
    assert stashed.inputs[0] == SMALL
    assert stashed.inputs[1].data == b"" and stashed.inputs[1].claim.startswith("redis:")
    assert stashed.claim_owner == process_tag()
    assert len(await claim_keys(redis_url)) == 1
    # A worker reads them as often as it is redelivered, until it releases them.
    assert [t.data for t in (await claims.redeem_request(stashed)).inputs] == [SMALL.data, LARGE.data]
    redeemed = await claims.redeem_request(stashed)
    assert redeemed.inputs[1].claim == stashed.inputs[1].claim  # kept, for the release
    # Sent on (an ensemble's step), a redeemed tensor goes inline: its bytes, not its claim.
    assert decode_request(encode_request(redeemed)).inputs == (SMALL, LARGE)
    await claims.release(redeemed)
    assert await claim_keys(redis_url) == []


async def test_nothing_to_stash_leaves_the_request_as_it_is(claims):
    plain = request(SMALL)
    assert await claims.stash_request(plain, claim_outputs=False) is plain
    assert await claims.redeem_request(plain) is plain


async def test_outputs_are_claimed_only_for_a_sender_that_asked_and_deleted_once_read(claims, redis_url):
    response = Response(id="r1", model="m", outputs=(LARGE, SMALL))
    job = request(SMALL, reply_to="ferry.jobs.replies")
    assert await claims.stash_response(response, job) is response  # a job result is kept whole
    assert await claims.stash_response(response, None) is response  # an undecodable request's answer
    asked = await claims.stash_request(request(SMALL), claim_outputs=True)
    stashed = await claims.stash_response(response, asked)
    assert stashed.outputs[0].claim and stashed.outputs[1] == SMALL
    assert (await claims.redeem_response(stashed)).outputs == (LARGE, SMALL)
    assert await claim_keys(redis_url) == []
    with pytest.raises(ClaimMissing, match="output 'LARGE'"):
        await claims.redeem_response(stashed)


async def test_a_claim_left_behind_expires_after_its_ttl(redis_url):
    flushdb(redis_url)
    check = ClaimCheck(RedisClaims(redis_url), ClaimSettings(threshold_bytes=1024, ttl_s=0.3))
    try:
        stashed = await check.stash_request(request(LARGE), claim_outputs=False)
        assert len(await claim_keys(redis_url)) == 1
        await asyncio.sleep(0.6)
        assert await claim_keys(redis_url) == []
        with pytest.raises(ClaimMissing, match="input 'LARGE'.*gone from Redis"):
            await check.redeem_request(stashed)
    finally:
        await check.aclose()


async def test_a_claim_of_another_store_or_none_at_all_is_a_clear_error(claims):
    foreign = request(WireTensor("X", "UINT8", (1,), b"", claim="shm:ferry-1-2"))
    with pytest.raises(ClaimMissing, match="input 'X'.*not a 'redis' claim"):
        await claims.redeem_request(foreign)
    with pytest.raises(ClaimMissing, match="input 'X' is claim-checked.*--claim-check-store"):
        await NoClaims().redeem_request(foreign)


def test_settings_refuse_a_negative_threshold_and_a_ttl_of_zero():
    with pytest.raises(ValueError, match="threshold"):
        ClaimSettings(threshold_bytes=-1)
    with pytest.raises(ValueError, match="TTL"):
        ClaimSettings(ttl_s=0)
