"""Where a Redis URL points, and a client for it: one server or a Redis Cluster.

    redis://[user:password@]host:port[/db]          one server (rediss:// with TLS)
    redis+cluster://[user:password@]host:port[,host:port...]
                                                    a Redis Cluster, from any of its nodes
                                                    (rediss+cluster:// with TLS)

A cluster client learns the rest of the cluster from the nodes given, follows
MOVED and ASK redirections, and maps the slots again after a failover; a
cluster has only database 0. Every ferry component that talks to Redis (the
transport, the job, session, claim-check and heartbeat stores, ``ferry lag``)
takes either kind of URL and gets its client here.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote, urlsplit

import redis
import redis.asyncio as aioredis
from redis.asyncio.cluster import ClusterNode
from redis.cluster import ClusterNode as SyncClusterNode
from redis.exceptions import ClusterError, RedisClusterException, RedisError

from broker.errors import BrokerError

SINGLE_SCHEMES = ("redis", "rediss")
CLUSTER_SCHEMES = ("redis+cluster", "rediss+cluster")
DEFAULT_PORT = 6379
# What a Redis client raises: RedisClusterException (no slot map, too many redirections) is
# not a RedisError.
REDIS_ERRORS: tuple[type[Exception], ...] = (RedisError, RedisClusterException)

AsyncRedis = aioredis.Redis | aioredis.RedisCluster
SyncRedis = redis.Redis | redis.RedisCluster
# How long a cluster command is tried again while its slot is being moved (see SlotMoveTolerantCluster).
SLOT_MOVE_WAIT_S = 10.0
SLOT_MOVE_FIRST_PAUSE_S = 0.005
SLOT_MOVE_LONGEST_PAUSE_S = 0.2


class RedisUrlError(BrokerError):
    """A Redis URL ferry cannot use; the message names the URL."""


@dataclass(frozen=True, slots=True)
class RedisTarget:
    url: str
    cluster: bool
    nodes: tuple[tuple[str, int], ...]   # the cluster's startup nodes; the one server otherwise
    username: str | None = None
    password: str | None = None
    tls: bool = False


def is_redis_url(url: str) -> bool:
    return urlsplit(url).scheme in SINGLE_SCHEMES + CLUSTER_SCHEMES


def parse_redis_url(url: str) -> RedisTarget:
    parts = urlsplit(url)
    if parts.scheme in SINGLE_SCHEMES:
        try:
            port = parts.port or DEFAULT_PORT
        except ValueError:
            raise RedisUrlError(f"Redis URL '{url}': the port is not a number") from None
        return RedisTarget(url, False, ((parts.hostname or "127.0.0.1", port),),
                           _unquoted(parts.username), _unquoted(parts.password), parts.scheme == "rediss")
    if parts.scheme not in CLUSTER_SCHEMES:
        raise RedisUrlError(f"Redis URL '{url}': expected redis://, rediss://, redis+cluster:// or "
                            "rediss+cluster://")
    credentials, _, hosts = parts.netloc.rpartition("@")
    username, _, password = credentials.partition(":")
    if parts.path.strip("/") not in ("", "0"):
        raise RedisUrlError(f"Redis URL '{url}': a Redis Cluster has only database 0")
    nodes = tuple(_node(url, node) for node in hosts.split(",") if node)
    if not nodes:
        raise RedisUrlError(f"Redis URL '{url}': name at least one node, host:port")
    return RedisTarget(url, True, nodes, _unquoted(username or None), _unquoted(password or None),
                       parts.scheme == "rediss+cluster")


def _node(url: str, text: str) -> tuple[str, int]:
    """``host:port``, ``host`` (port 6379) or ``[v6 address]:port``."""
    if text.startswith("["):
        host, _, rest = text[1:].partition("]")
        port = rest.removeprefix(":")
    else:
        host, _, port = text.partition(":")
    if not port:
        return host, DEFAULT_PORT
    if not (port.isascii() and port.isdigit()) or not host:
        raise RedisUrlError(f"Redis URL '{url}': node '{text}' is not host:port")
    return host, int(port)


def _unquoted(value: str | None) -> str | None:
    return unquote(value) if value else None


def async_client(url: str, *, max_connections: int | None = None, pool_timeout_s: float | None = None,
                 **options: Any) -> AsyncRedis:
    """An asyncio client speaking RESP2 (the reply shapes ferry parses). On one server with
    ``max_connections``, a blocking pool: past the limit a command waits ``pool_timeout_s``
    for a free connection. A cluster client keeps up to ``max_connections`` per node."""
    target = parse_redis_url(url)
    if not target.cluster:
        if max_connections is None:
            return aioredis.Redis.from_url(url, protocol=2, **options)
        pool = aioredis.BlockingConnectionPool.from_url(
            url, protocol=2, max_connections=max_connections, timeout=pool_timeout_s, **options)
        return aioredis.Redis.from_pool(pool)  # closing the client closes the pool
    extra: dict[str, Any] = {"max_connections": max_connections} if max_connections is not None else {}
    return SlotMoveTolerantCluster(
        startup_nodes=[ClusterNode(host, port) for host, port in target.nodes], protocol=2,
        username=target.username, password=target.password, ssl=target.tls, **extra, **options)


def sync_client(url: str, **options: Any) -> SyncRedis:
    """A blocking client (``ferry lag``, tests), RESP2 like the asyncio ones."""
    target = parse_redis_url(url)
    if not target.cluster:
        return redis.Redis.from_url(url, protocol=2, **options)
    return redis.RedisCluster(
        startup_nodes=[SyncClusterNode(host, port) for host, port in target.nodes],  # type: ignore[no-untyped-call]
        protocol=2,
        username=target.username, password=target.password, ssl=target.tls, **options)


class SlotMoveTolerantCluster(aioredis.RedisCluster):
    """An asyncio cluster client whose commands outlast a slot's move between masters.

    While a slot migrates, its old master answers ASK for the keys already moved. redis-py's
    asyncio client sends the ASKING that allows the command on the new master as a command of
    its own, on one pooled connection, and the command itself on the next free one: with more
    than one connection open to the new master, the command meets MOVED (back to the old one),
    and the redirections use up its TTL within a millisecond (``ClusterError``) until the move
    ends. Every attempt was refused unrun, so such a command is sent again, paced, for up to
    ``SLOT_MOVE_WAIT_S``; a moved slot's owner then answers it."""

    async def execute_command(self, *args: Any, **kwargs: Any) -> Any:
        pause, deadline = SLOT_MOVE_FIRST_PAUSE_S, 0.0
        while True:
            try:
                return await super().execute_command(*args, **kwargs)
            except ClusterError:
                now = time.monotonic()
                deadline = deadline or now + SLOT_MOVE_WAIT_S
                if now >= deadline:
                    raise
                await asyncio.sleep(pause)
                pause = min(2 * pause, SLOT_MOVE_LONGEST_PAUSE_S)
