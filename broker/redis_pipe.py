"""Commands that go out together: every command asked for while one write is on its way
to Redis leaves in the next single write (up to ``WRITE_BUDGET_BYTES`` of arguments), on one
connection, and their replies are read back in order (what some clients call auto-pipelining).

redis-py takes a pooled connection, packs, writes, reads and parses for each command
alone: about 37 µs of a client's CPU for an XADD, and a system call each way. Under a
gateway's or a worker's load many such commands are due in the same few microseconds
(a publish per request, a reply and an ack per answer); through a ``CommandPipe`` they
cost about a quarter of that, and Redis reads and answers them in one go.

Only commands that never block belong here (XADD, XACK, EVALSHA of a short script): a
blocking read would hold up every command queued behind it. The connection is the
client's own kind (``pool.make_connection``), so URL, credentials, TLS, database and
protocol are the client's, and it is checked before each write as the pool checks a
connection it hands out (one the server closed meanwhile is opened again). A connection
that fails is dropped, and what was not yet answered is sent again on a new one as the
connection's ``retry`` allows, as redis-py retries a command (so, as there, a command
whose reply was lost with the connection may run twice); an error reply fails only its
own command.

A store of large values (claim-checked tensors, jobs' results) asks for ``large_alone``: a
command past the write budget and under ``ALONE_BELOW_BYTES`` then goes out on a pooled
connection of its own, at once, instead of waiting in line (``CommandPipe._alone``; up to
``ALONE_AT_ONCE`` at a time, the next waiting for one of them), and so does a command asked for
with ``alone=True``, one whose reply may be large. Commands asked for at once are then not
ordered with respect to such a one; a caller that needs an order awaits each in turn. Scripts
run through ``run_script`` (EVALSHA, EVAL where the server does not know them).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from typing import Any

from redis.asyncio import ConnectionPool, Redis, RedisCluster
from redis.asyncio.connection import AbstractConnection
from redis.commands.core import AsyncScript
from redis.exceptions import (
    AskError, ClusterDownError, MasterDownError, NoScriptError, ReadOnlyError, RedisClusterException, ResponseError,
    SlotNotCoveredError,
)
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError
from redis.exceptions import TryAgainError

Command = tuple[Any, ...]
# What a cluster master's pipe answers when the command belongs elsewhere or the master is gone
# (MovedError is an AskError; READONLY from a master demoted to a replica).
_ELSEWHERE = (AskError, TryAgainError, ClusterDownError, MasterDownError, ReadOnlyError, RedisConnectionError,
              RedisTimeoutError)
_MOVED = (AskError, TryAgainError)  # a slot on its way to another master
_Waiting = tuple[Command, "asyncio.Future[Any]"]
# A write holds the commands due, up to about this many bytes of arguments: past it, a large
# command (a tensor inline) is cheaper written alone than in a long pipeline that the socket
# takes in pieces, the event loop keeping a copy of the rest meanwhile (measured, 300 KB each).
WRITE_BUDGET_BYTES = 64 * 1024
# An argument past this goes to the socket as its own buffer, not copied into the command's.
LARGE_ARGUMENT_BYTES = 16 * 1024
# With ``large_alone``, a command past the write budget and under this goes out on a connection of
# its own; a larger one waits its turn in the pipe. Measured with 16 tasks storing jobs' results
# on 2 cores (benchmarks/bench_job_store.py): 301 KB ones at once, 1.3-1.4x the jobs/s of one after
# another; 4 MB ones at once, 0.7-0.8x (Redis spent 40-75% more CPU on each, reading many at a time).
ALONE_BELOW_BYTES = 1024 * 1024
# At most this many commands of a pipe out alone at once, each on a pooled connection: the next
# waits for one of them to finish, so a burst opens no more connections than this. (8, with the
# next ones sent in the pipe instead, gave 16 tasks storing 301 KB results 0.75-0.8x the jobs/s.)
ALONE_AT_ONCE = 32


class CommandPipe:
    """Owned by one client's user (a transport, a store); ``aclose`` before the pool it was given is closed."""

    def __init__(self, pool: ConnectionPool, large_alone: bool = False) -> None:
        self._pool = pool
        self._large_alone = large_alone  # a command past the write budget on a pooled connection (``_alone``)
        self._alone_slots = asyncio.Semaphore(ALONE_AT_ONCE)  # commands out alone at once (``_alone``)
        self._connection: AbstractConnection | None = None
        self._queue: list[_Waiting] = []
        self._sizes: list[int] = []  # each queued command's argument bytes
        self._sender: asyncio.Task[None] | None = None
        self._closed = False
        self.round_trips = 0  # writes sent, each with every command queued by then

    async def call(self, *command: Any, alone: bool = False) -> Any:
        """The reply to ``command``; an error reply raises as redis-py raises it. ``alone``: on a
        connection of its own (``_alone``), for a command whose reply may be large (a GET of a
        tensor), which would hold up the replies behind it."""
        if self._closed:
            raise RedisConnectionError("the command pipe is closed")
        size = sum(_size(part) for part in command)
        if alone or (self._large_alone and WRITE_BUDGET_BYTES < size < ALONE_BELOW_BYTES):
            return await self._alone(command)
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._queue.append((command, future))
        self._sizes.append(size)
        if self._sender is None:
            self._sender = asyncio.create_task(self._send_all(), name="redis-pipe")
        return await future

    async def call_for(self, key: str, *command: Any, alone: bool = False) -> Any:
        """``call``; one server holds every key (as ``ClusterPipes.call_for`` takes it)."""
        return await self.call(*command, alone=alone)

    async def aclose(self) -> None:
        """Fail what waits, stop sending, and close the connection."""
        self._closed = True
        if self._sender is not None:
            self._sender.cancel()
            await asyncio.gather(self._sender, return_exceptions=True)
        _fail(self._queue, RedisConnectionError("the command pipe is closed"))
        self._queue, self._sizes = [], []
        if self._connection is not None:
            await self._connection.disconnect()
            self._connection = None

    async def _alone(self, command: Command) -> Any:
        """A command on a pooled connection of its own (a large one, or one asked for ``alone``), up to
        ``ALONE_AT_ONCE`` at a time: it neither waits for the pipe's round trips nor holds them up
        while the socket takes it or its reply, and several go out at once (so one is not ordered
        after another asked for earlier but not awaited). Packed as the pipe packs, its bytes
        uncopied. Where most commands are small and CPU is short, as in a transport's, this costs
        more than it saves (a pool's check and hand-over per command): measured, a 301 KB request
        over Redis took 5-8% more CPU of ferry's processes. Where large values wait on one another,
        a store's, it saves."""
        async with self._alone_slots:
            connection = await self._pool.get_connection()  # type: ignore[no-untyped-call]

            async def once() -> Any:
                await connection.send_packed_command(pack([command]), check_health=False)
                return await connection.read_response()

            async def dropped(_error: Exception) -> None:
                await connection.disconnect()

            try:
                return await connection.retry.call_with_retry(once, dropped)
            except (asyncio.CancelledError, RedisConnectionError, RedisTimeoutError):
                await connection.disconnect(nowait=True)  # a reply may still come: not for the next user
                raise
            finally:
                await self._pool.release(connection)

    async def _send_all(self) -> None:
        try:
            while self._queue:
                batch = self._next_batch()
                try:
                    await self._exchange(batch)
                except asyncio.CancelledError:
                    _fail(batch, RedisConnectionError("the command pipe is closed"))
                    raise
                except Exception as exc:  # the connection failed past its retries: each caller learns why
                    _fail(batch, exc)
        finally:
            self._sender = None

    def _next_batch(self) -> list[_Waiting]:
        """The queue's first commands, as many as fit the write budget (at least one)."""
        total, taken = 0, 0
        for size in self._sizes:
            if taken and total + size > WRITE_BUDGET_BYTES:
                break
            total += size
            taken += 1
        batch = self._queue[:taken]
        del self._queue[:taken], self._sizes[:taken]
        return batch

    async def _exchange(self, batch: list[_Waiting]) -> None:
        connection = self._connection
        if connection is None:
            connection = self._connection = self._pool.make_connection()  # type: ignore[no-untyped-call]
        answered = 0

        async def once() -> None:
            nonlocal answered
            # A caller that gave up still has its command sent: the order of the commands is that of the replies.
            waiting = batch[answered:]
            # As a pool checks what it hands out: (re)connected, and not closed by the server meanwhile.
            await self._pool.ensure_connection(connection)
            self.round_trips += 1
            # (typed for bytes only; a memoryview is written as it is, as redis-py's own packer passes one on)
            packed = pack([c for c, _ in waiting])
            await connection.send_packed_command(packed, check_health=False)  # type: ignore[arg-type]
            for _, future in waiting:
                try:
                    reply = await connection.read_response()
                except ResponseError as exc:
                    _settle(future, error=exc)
                else:
                    _settle(future, reply)
                answered += 1

        async def dropped(_error: Exception) -> None:
            await connection.disconnect()

        try:
            await connection.retry.call_with_retry(once, dropped)
        except BaseException:
            await connection.disconnect(nowait=True)
            raise


def pack(commands: Sequence[Command]) -> list[bytes | memoryview]:
    """RESP arrays of bulk strings, a large argument passed on as it is rather than copied (redis-py's
    hiredis packer copies it, at about 190 µs for 300 KB). Arguments: bytes, memoryview, str, int."""
    parts: list[bytes | memoryview] = []
    head = bytearray()
    for command in commands:
        head += b"*%d\r\n" % len(command)
        for argument in command:
            data = _encoded(argument)
            head += b"$%d\r\n" % len(data)
            if len(data) > LARGE_ARGUMENT_BYTES:
                parts += (bytes(head), data)
                head = bytearray(b"\r\n")
            else:
                head += data
                head += b"\r\n"
    parts.append(bytes(head))
    return parts


def _size(argument: Any) -> int:
    if isinstance(argument, memoryview):
        return argument.nbytes
    return len(argument) if isinstance(argument, (bytes, bytearray)) else 0


def _encoded(argument: Any) -> bytes | memoryview:
    if isinstance(argument, bytes):
        return argument
    if isinstance(argument, memoryview):  # as bytes: its length in bytes, not in items
        return argument.cast("B") if argument.c_contiguous else argument.tobytes()
    if isinstance(argument, str):
        return argument.encode()
    if isinstance(argument, int) and not isinstance(argument, bool):
        return b"%d" % argument
    if isinstance(argument, bytearray):
        return bytes(argument)
    raise TypeError(f"a Redis command's argument must be bytes, str or int, not {type(argument).__name__}")


def _settle(future: asyncio.Future[Any], reply: Any = None, error: BaseException | None = None) -> None:
    if future.done():
        return
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(reply)


def _fail(waiting: Sequence[_Waiting], error: BaseException) -> None:
    for _, future in waiting:
        _settle(future, error=error)


class ClusterPipes:
    """A ``CommandPipe`` for each master of a Redis Cluster, a command going to the master of
    its key's slot as the cluster client last mapped it. A redirection (MOVED, ASK, TRYAGAIN),
    a slot not mapped yet, a cluster down, a master demoted or a failed connection sends the
    command through the cluster client instead, which follows it and maps the slots again, so
    the next command for that slot goes to its new master. (A command whose connection failed
    after it was written may so run twice, as it may when the cluster client retries it.)
    ``on_master_lost`` is called each time a master fails so (not a slot's move): it may have
    been replaced by a replica lacking its last writes."""

    def __init__(self, cluster: RedisCluster, large_alone: bool = False,
                 on_master_lost: Callable[[], None] | None = None) -> None:
        self._cluster = cluster
        self._large_alone = large_alone
        self._on_master_lost = on_master_lost
        self._pipes: dict[str, tuple[CommandPipe, ConnectionPool]] = {}
        self._closed = False

    @property
    def round_trips(self) -> dict[str, int]:
        """Writes sent through each master's pipe (not through the cluster client), by "host:port"."""
        return {name: pipe.round_trips for name, (pipe, _) in self._pipes.items()}

    async def call_for(self, key: str, *command: Any, alone: bool = False) -> Any:
        """The reply to ``command``, which names ``key`` (and only keys on its slot); ``alone``: as
        ``CommandPipe.call`` takes it."""
        pipe = self._pipe_for(key)
        if pipe is not None:
            try:
                return await pipe.call(*command, alone=alone)
            except _MOVED:
                pass
            except _ELSEWHERE:
                if self._on_master_lost is not None:
                    self._on_master_lost()
        return await self._cluster.execute_command(*command)

    async def aclose(self) -> None:
        self._closed = True
        for pipe, pool in self._pipes.values():
            await pipe.aclose()
            await pool.aclose()
        self._pipes.clear()

    def _pipe_for(self, key: str) -> CommandPipe | None:
        """The pipe to ``key``'s master, or None while the client has no map of the slots."""
        if self._closed:
            return None
        try:
            node = self._cluster.get_node_from_key(key)
        except (SlotNotCoveredError, RedisClusterException):
            return None
        if node is None:
            return None
        held = self._pipes.get(node.name)
        if held is None:
            pool = ConnectionPool(connection_class=node.connection_class, **node.connection_kwargs)
            held = self._pipes[node.name] = (CommandPipe(pool, self._large_alone), pool)
        return held[0]


Pipes = CommandPipe | ClusterPipes


async def run_script(pipes: Pipes, script: AsyncScript, keys: Sequence[str], args: Sequence[Any]) -> Any:
    """What ``script`` returns, run by its SHA1 on the server of ``keys[0]`` (every key on one slot),
    and sent whole (EVAL, which caches it again) where that server does not know it: one restarted
    or flushed since."""
    try:
        return await pipes.call_for(keys[0], "EVALSHA", script.sha, len(keys), *keys, *args)
    except NoScriptError:
        return await pipes.call_for(keys[0], "EVAL", script.script, len(keys), *keys, *args)


def pipes_for(client: Redis | RedisCluster, large_alone: bool = False,
              on_master_lost: Callable[[], None] | None = None) -> Pipes:
    """The pipes for a client of ``broker.redis_url``: one, or one per master of a cluster;
    either takes ``call_for(key, *command)``. Close them before the client. ``large_alone``:
    see ``CommandPipe._alone``; ``on_master_lost``: see ``ClusterPipes``."""
    if isinstance(client, RedisCluster):
        return ClusterPipes(client, large_alone, on_master_lost)
    return CommandPipe(client.connection_pool, large_alone)
