"""The response cache's parts: the key, the bounded local store, and ``--cache-config``."""

from __future__ import annotations

import dataclasses

import pytest

from broker.envelope import Request, WireTensor
from workers.cache.key import cache_key
from workers.cache.local import LocalCache
from workers.cache.settings import parse_cache_config
from workers.errors import ConfigError


def request(**changes: object) -> Request:
    base = Request(id="r1", model="m", reply_to="ferry.replies.g", outputs=("OUT",), parameters={"temperature": 1},
                   inputs=(WireTensor("A", "FP32", (1, 2), b"\x00" * 8), WireTensor("B", "BYTES", (1,), b"\x01\x00\x00\x00x")))
    return dataclasses.replace(base, **changes)


def test_the_key_covers_what_decides_the_answer_and_nothing_else() -> None:
    key = cache_key(request(), "m", 1)
    assert len(key) == 32
    same = [request(id="r2", reply_to="elsewhere", priority=3, timeout_us=5, created_ns=9,
                    parameters={"temperature": 1, "priority": 2, "timeout": 10}, trace={"traceparent": "x"}),
            request(inputs=tuple(reversed(request().inputs)))]
    assert all(cache_key(r, "m", 1) == key for r in same)
    different = [
        (request(), "m", 2),
        (request(), "n", 1),
        (request(inputs=(WireTensor("A", "FP32", (2, 1), b"\x00" * 8), request().inputs[1])), "m", 1),
        (request(inputs=(WireTensor("A", "FP32", (1, 2), b"\x00" * 7 + b"\x01"), request().inputs[1])), "m", 1),
        (request(inputs=(WireTensor("A", "INT32", (1, 2), b"\x00" * 8), request().inputs[1])), "m", 1),
        (request(inputs=request().inputs[:1]), "m", 1),
        (request(outputs=("OUT", "OTHER")), "m", 1),
        (request(parameters={"temperature": 2}), "m", 1),
        (request(parameters={}), "m", 1),
    ]
    keys = {cache_key(r, model, version) for r, model, version in different}
    assert len(keys) == len(different) and key not in keys
    # Parts cannot run into each other: a name's end moved into the next part is another key.
    split = request(inputs=(WireTensor("AB", "FP32", (1,), b"\x00" * 4),))
    joined = request(inputs=(WireTensor("A", "BFP32", (1,), b"\x00" * 4),))
    assert cache_key(split, "m", 1) != cache_key(joined, "m", 1)


async def test_the_local_cache_evicts_the_least_recently_used_past_its_size() -> None:
    cache = LocalCache(max_bytes=100)
    await cache.put(b"k1", b"a" * 38)  # 40 bytes with its key
    await cache.put(b"k2", b"b" * 38)
    assert await cache.get(b"k1") == b"a" * 38  # k1 is now the most recent
    await cache.put(b"k3", b"c" * 38)  # 120 > 100: k2, the least recent, goes
    assert await cache.get(b"k2") is None
    assert await cache.get(b"k1") is not None and await cache.get(b"k3") is not None
    assert (cache.size_bytes, cache.evictions, len(cache)) == (80, 1, 2)
    await cache.put(b"big", b"x" * 200)  # larger than the whole cache: not kept, nothing evicted
    assert await cache.get(b"big") is None and len(cache) == 2
    await cache.put(b"k1", b"z" * 8)  # replacing counts the new size only
    assert cache.size_bytes == 50 and await cache.get(b"k1") == b"z" * 8


def test_cache_config_reads_tritons_flags() -> None:
    assert parse_cache_config([]) is None
    local = parse_cache_config(["local,size=1048576"])
    assert local is not None and (local.kind, local.size_bytes) == ("local", 1048576)
    redis = parse_cache_config(["redis,host=cache.internal", "redis,port=6380,db=2", "redis,ttl_s=30"])
    assert redis is not None and (redis.kind, redis.url, redis.ttl_s) == ("redis", "redis://cache.internal:6380/2", 30)
    secret = parse_cache_config(["redis,host=h,user=u,password=p@ss,tls=true"])
    assert secret is not None and secret.url == "rediss://u:p%40ss@h:6379/0"
    url = parse_cache_config(["redis,url=redis+cluster://a:1,b:2"])
    assert url is not None and url.url == "redis+cluster://a:1,b:2"


@pytest.mark.parametrize(("flags", "words"), [
    (["memcached,host=h"], "unknown cache 'memcached'"),
    (["local"], "needs size=<bytes> above 0"),
    (["local,size=big"], "size='big' is not a whole number"),
    (["local,host=h"], "'host=h': expected one of size"),
    (["local,size=10", "redis,host=h"], "one cache at a time"),
    (["redis,port=1"], "needs host=<host>"),
])
def test_a_bad_cache_config_names_the_flag_and_the_fault(flags: list[str], words: str) -> None:
    with pytest.raises(ConfigError, match="--cache-config") as refused:
        parse_cache_config(flags)
    assert words in str(refused.value)
