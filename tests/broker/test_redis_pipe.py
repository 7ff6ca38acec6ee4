"""broker.redis_pipe on a real redis-server: commands asked for together go out in
one write and each caller gets its own reply; an error reply is its command's alone; a server
restarted between writes is reconnected to, and one gone for good fails its callers at once;
a script the server does not know (yet, or since a flush) is sent whole and so cached again."""

from __future__ import annotations

import array
import asyncio
import uuid
from collections.abc import Iterator

import pytest
import redis.asyncio as aioredis
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import ResponseError

from broker.redis_pipe import (
    ALONE_AT_ONCE, ALONE_BELOW_BYTES, LARGE_ARGUMENT_BYTES, WRITE_BUDGET_BYTES, CommandPipe, pack, run_script,
)
from tests.redis_server import RedisServer


@pytest.fixture
def own_server() -> Iterator[RedisServer]:
    """A server of this test's own, to kill."""
    with RedisServer() as server:
        yield server


def pool_for(url: str) -> aioredis.ConnectionPool:
    return aioredis.BlockingConnectionPool.from_url(url, protocol=2, socket_timeout=None)


def test_commands_asked_for_together_go_out_in_one_write_each_with_its_own_reply(redis_url: str) -> None:
    stream = f"ferry.test.pipe.{uuid.uuid4().hex}"

    async def scenario() -> tuple[list[bytes], list[bytes], int]:
        pool = pool_for(redis_url)
        pipe = CommandPipe(pool)
        try:
            ids = await asyncio.gather(*(pipe.call("XADD", stream, "*", "n", str(n)) for n in range(50)))
            entries = await pipe.call("XRANGE", stream, "-", "+")
            await pipe.call("DEL", stream)
            return list(ids), [(entry_id, fields[1]) for entry_id, fields in entries], pipe.round_trips
        finally:
            await pipe.aclose()
            await pool.aclose()

    ids, entries, round_trips = asyncio.run(scenario())
    # Each caller got the id of its own entry: the entries hold 0..49 in the callers' order.
    assert entries == [(entry_id, str(n).encode()) for n, entry_id in enumerate(ids)]
    assert len(set(ids)) == 50
    assert round_trips == 3  # the 50 XADDs in one write, then XRANGE, then DEL


def test_an_error_reply_fails_its_own_command_and_no_other(redis_url: str) -> None:
    key = f"ferry.test.pipe.{uuid.uuid4().hex}"

    async def scenario() -> list[object]:
        pool = pool_for(redis_url)
        pipe = CommandPipe(pool)
        try:
            return list(await asyncio.gather(pipe.call("SET", key, "text"), pipe.call("INCR", key),
                                             pipe.call("GET", key), pipe.call("DEL", key), return_exceptions=True))
        finally:
            await pipe.aclose()
            await pool.aclose()

    set_reply, incr, get, deleted = asyncio.run(scenario())
    assert set_reply is True or set_reply == b"OK"
    assert isinstance(incr, ResponseError) and "not an integer" in str(incr)
    assert get == b"text" and deleted == 1


def test_a_server_restarted_between_writes_is_connected_to_again(own_server: RedisServer) -> None:
    async def scenario() -> object:
        pool = pool_for(own_server.url)
        pipe = CommandPipe(pool)
        try:
            assert await pipe.call("PING") in (True, b"PONG")
            own_server.crash()
            own_server.restart()
            await asyncio.sleep(0.2)  # the old connection's end has arrived
            return await pipe.call("ECHO", "again")
        finally:
            await pipe.aclose()
            await pool.aclose()

    assert asyncio.run(scenario()) == b"again"


def test_a_server_gone_fails_the_callers_waiting_and_a_closed_pipe_refuses(own_server: RedisServer) -> None:
    async def scenario() -> tuple[list[object], BaseException | None]:
        pool = pool_for(own_server.url)
        pipe = CommandPipe(pool)
        try:
            await pipe.call("PING")
            own_server.crash()
            results = await asyncio.wait_for(
                asyncio.gather(*(pipe.call("ECHO", str(n)) for n in range(5)), return_exceptions=True), 10)
        finally:
            await pipe.aclose()
            await pool.aclose()
        try:
            await pipe.call("PING")
        except RedisConnectionError as exc:
            return list(results), exc
        return list(results), None

    results, refused = asyncio.run(scenario())
    assert all(isinstance(result, RedisConnectionError) for result in results), results
    assert refused is not None and "closed" in str(refused)


def test_closing_fails_a_caller_still_waiting(redis_url: str) -> None:
    key = f"ferry.test.pipe.{uuid.uuid4().hex}"

    async def scenario() -> BaseException:
        pool = pool_for(redis_url)
        pipe = CommandPipe(pool)
        try:
            # BLPOP blocks the pipe's connection (which is why blocking reads do not belong there).
            waiting = asyncio.ensure_future(pipe.call("BLPOP", key, 5))
            await asyncio.sleep(0.2)
            await pipe.aclose()
            try:
                await asyncio.wait_for(waiting, 2)
            except RedisConnectionError as exc:
                return exc
            raise AssertionError("the caller was answered after closing")
        finally:
            await pool.aclose()

    assert "closed" in str(asyncio.run(scenario()))


def test_large_arguments_are_sent_as_they_are_and_arrive_whole(redis_url: str) -> None:
    key = f"ferry.test.pipe.{uuid.uuid4().hex}"
    tensor = bytes(range(256)) * 1200  # 300 KB
    view = memoryview(tensor)[1000:]

    parts = pack([("SET", key, tensor), ("APPEND", key, view)])
    # not copied: the tensor itself, and a view on its memory
    assert any(part is tensor for part in parts)
    assert any(isinstance(part, memoryview) and part.obj is tensor and part.nbytes == len(view) for part in parts)
    assert sum(len(part) for part in parts) < 2 * len(tensor) + 200

    async def scenario() -> tuple[object, object]:
        pool = pool_for(redis_url)
        pipe = CommandPipe(pool)
        try:
            await asyncio.gather(pipe.call("SET", key, tensor), pipe.call("APPEND", key, view),
                                 pipe.call("SET", key + ".small", "é", "EX", 60))
            return await pipe.call("GET", key), await pipe.call("GET", key + ".small")
        finally:
            await pipe.call("DEL", key, key + ".small")
            await pipe.aclose()
            await pool.aclose()

    stored, small = asyncio.run(scenario())
    assert stored == tensor + bytes(view) and small == "é".encode()
    assert len(tensor) > LARGE_ARGUMENT_BYTES


def test_large_commands_alone_go_out_at_once_beside_the_pipe_and_fail_alone_the_largest_in_it(redis_url: str) -> None:
    key = f"ferry.test.pipe.{uuid.uuid4().hex}"
    tensors = [bytes([n]) * (WRITE_BUDGET_BYTES + 1) for n in range(4)]

    async def scenario() -> tuple[list[object], object, int, int]:
        pool = pool_for(redis_url)
        pipe = CommandPipe(pool, large_alone=True)
        try:
            await pipe.call("HSET", key + ".hash", "f", "v")
            await pipe.call("SET", key + ".huge", b"h" * ALONE_BELOW_BYTES)  # too large to go alone: in the pipe
            wrote = await asyncio.gather(*(pipe.call("SET", f"{key}.{n}", t) for n, t in enumerate(tensors)),
                                         pipe.call("SET", key, "small"),
                                         pipe.call("APPEND", key + ".hash", tensors[0]), return_exceptions=True)
            stored = [await pipe.call("GET", f"{key}.{n}") for n in range(len(tensors))]
            small = await pipe.call("GET", key, alone=True)  # asked to go alone: beside the pipe too
            return [*wrote, stored], small, pipe.round_trips, len(pool._available_connections)
        finally:
            await pipe.call("DEL", key, key + ".hash", key + ".huge", *(f"{key}.{n}" for n in range(len(tensors))))
            await pipe.aclose()
            await pool.aclose()

    results, small, round_trips, pooled = asyncio.run(scenario())
    *wrote, wrong_type, stored = results
    assert wrote == [b"OK"] * 5 and small == b"small" and stored == tensors
    assert isinstance(wrong_type, ResponseError) and "WRONGTYPE" in str(wrong_type)  # its own error, no other's
    assert round_trips == 7  # HSET, the 1 MB SET, the small SET, 4 GETs: the large commands went beside the pipe
    assert pooled >= 2  # on connections of their own, at once


def test_no_more_large_commands_go_alone_at_once_than_the_bound(redis_url: str) -> None:
    key = f"ferry.test.pipe.{uuid.uuid4().hex}"
    tensors = [bytes([n]) * (WRITE_BUDGET_BYTES + 1) for n in range(3 * ALONE_AT_ONCE)]

    async def scenario() -> tuple[list[object], int, int]:
        pool = pool_for(redis_url)
        pipe = CommandPipe(pool, large_alone=True)
        try:
            await asyncio.gather(*(pipe.call("SET", f"{key}.{n}", t) for n, t in enumerate(tensors)))
            pooled, sent = len(pool._available_connections), pipe.round_trips
            return await pipe.call("MGET", *(f"{key}.{n}" for n in range(len(tensors)))), pooled, sent
        finally:
            await pipe.call("DEL", *(f"{key}.{n}" for n in range(len(tensors))))
            await pipe.aclose()
            await pool.aclose()

    stored, pooled, round_trips = asyncio.run(scenario())
    assert stored == tensors
    assert pooled == ALONE_AT_ONCE  # the later ones waited for a connection of the first ones
    assert round_trips == 0  # and none went through the pipe


def test_a_memoryview_of_wider_items_is_sent_as_its_bytes(redis_url: str) -> None:
    key = f"ferry.test.pipe.{uuid.uuid4().hex}"
    values = array.array("i", range(10_000))  # 40,000 bytes, 10,000 items
    wide = memoryview(values)
    strided = memoryview(bytes(range(200)))[::2]  # not contiguous

    async def scenario() -> list[object]:
        pool = pool_for(redis_url)
        pipe = CommandPipe(pool)
        try:
            await pipe.call("SET", key, wide)
            await pipe.call("SET", key + ".strided", strided)
            return [await pipe.call("GET", key), await pipe.call("GET", key + ".strided")]
        finally:
            await pipe.call("DEL", key, key + ".strided")
            await pipe.aclose()
            await pool.aclose()

    assert asyncio.run(scenario()) == [values.tobytes(), strided.tobytes()]


def test_an_argument_redis_cannot_take_is_refused_by_its_type() -> None:
    with pytest.raises(TypeError, match="float"):
        pack([("INCRBYFLOAT", "k", 1.5)])


def test_a_script_the_server_does_not_know_is_sent_whole_and_then_known(own_server: RedisServer) -> None:
    key = f"ferry.test.pipe.{uuid.uuid4().hex}"

    async def scenario() -> list[object]:
        client = aioredis.Redis.from_url(own_server.url, protocol=2)
        pipe = CommandPipe(client.connection_pool)
        script = client.register_script("return redis.call('INCRBY', KEYS[1], ARGV[1])")
        try:
            seen: list[object] = [await client.script_exists(script.sha)]
            seen.append(await run_script(pipe, script, (key,), (5,)))  # a server never told it
            seen.append(await client.script_exists(script.sha))
            await client.script_flush()
            seen.append(await run_script(pipe, script, (key,), (2,)))  # one that forgot it
            seen.append(await run_script(pipe, script, (key,), (1,)))  # and knows it again
            seen.append(await client.script_exists(script.sha))
            return seen
        finally:
            await pipe.aclose()
            await client.aclose()

    assert asyncio.run(scenario()) == [[False], 5, [True], 7, 8, [True]]
