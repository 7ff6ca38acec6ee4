"""What each broker brings besides its channels: where heartbeats, async jobs
and sequence checkpoints live.

- ``memory://``: one process; the gateway asks its worker directly, and jobs
  live in that process.
- ``redis://``: heartbeats are expiring keys and jobs are hashes in the same
  Redis, so every gateway sees every worker and every job.
- ``kafka://``: heartbeats travel on the ``ferry.heartbeats`` topic. Jobs need
  a job store all gateways share: ``--job-store redis://…``. Redis, not a
  compacted topic, because a poll is a lookup by id with a TTL and a status
  change is a compare-and-set, which Redis does in one round trip; a compacted
  topic would make every gateway replay and hold every job to answer one
  poll. Without ``--job-store`` jobs stay in the gateway that took them.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from urllib.parse import urlsplit

from broker import channels
from broker.claims.check import ClaimCheck, Claims, ClaimSettings, NoClaims
from broker.claims.redis_store import RedisClaims
from broker.claims.shm_store import ShmClaims
from broker.redis_url import is_redis_url
from broker.transport import Transport
from gateway.jobs import DEFAULT_TTL_S, JobStore, RedisJobStore, open_job_store
from workers.cache.cached import AnswerCache
from workers.cache.local import LocalCache
from workers.cache.redis_cache import RedisCache
from workers.cache.settings import CacheSettings
from workers.heartbeat import HeartbeatStore, RedisHeartbeats
from workers.heartbeat_channel import ChannelHeartbeats
from workers.sequences.sessions import LocalSessions, SessionRouting
from workers.sequences.sessions_redis import RedisSessions


def scheme(url: str) -> str:
    return urlsplit(url).scheme


def open_heartbeats(broker_url: str, transport: Transport, reader_id: str = "",
                    prefix: str = channels.PREFIX) -> HeartbeatStore | None:
    """None on the in-memory broker, where there is no one else to tell."""
    if is_redis_url(broker_url):
        return RedisHeartbeats(broker_url, prefix)
    if scheme(broker_url) == "memory":
        return None
    return ChannelHeartbeats(transport, reader_id, prefix)


def open_sessions(broker_url: str, worker_id: str, heartbeats: HeartbeatStore | None,
                  session_store_url: str = "", prefix: str = channels.PREFIX) -> SessionRouting:
    """Sequences on a Redis broker are routed to their worker through Redis and
    checkpointed there. On Kafka the partition key routes them; a Redis
    ``--session-store`` adds checkpoints. Elsewhere state lives in memory."""
    url = session_store_url or (broker_url if is_redis_url(broker_url) else "")
    if heartbeats is None or not is_redis_url(url):
        return LocalSessions()

    async def live_workers() -> set[str]:
        return set(await heartbeats.live())

    return RedisSessions(url, worker_id, live_workers, prefix=prefix, forwarding=is_redis_url(broker_url))


def job_store_url(broker_url: str, configured: str = "") -> str:
    if configured:
        return configured
    return broker_url if is_redis_url(broker_url) else "memory://"


def open_jobs_store(broker_url: str, configured: str = "", ttl_s: float = DEFAULT_TTL_S,
                    prefix: str = channels.PREFIX) -> JobStore:
    return open_job_store(job_store_url(broker_url, configured), ttl_s, prefix)


def open_job_gate(broker_url: str, configured: str = "", prefix: str = channels.PREFIX) -> RedisJobStore | None:
    """A worker process's view of the job store; None when jobs live only in a
    gateway's memory, where a separate worker cannot see them."""
    url = job_store_url(broker_url, configured)
    return RedisJobStore(url, prefix=prefix) if is_redis_url(url) else None


def claim_store_url(broker_url: str, configured: str = "", job_store: str = "") -> str:
    """Where claim-checked tensors go: ``--claim-check-store``, else the broker's Redis, else (on
    Kafka) the job store's Redis; ``none`` (and the in-memory broker) sends every tensor inline."""
    if configured:
        return configured
    if is_redis_url(broker_url):
        return broker_url
    if scheme(broker_url) == "kafka" and is_redis_url(job_store):
        return job_store
    return "none"


def open_claims(url: str, settings: ClaimSettings, prefix: str = channels.PREFIX) -> Claims:
    if url == "none" or settings.threshold_bytes == 0:
        return NoClaims()
    if is_redis_url(url):
        return ClaimCheck(RedisClaims(url, prefix), settings)
    if url == "shm":
        return ClaimCheck(ShmClaims(ttl_s=settings.ttl_s), settings)
    raise ValueError(f"--claim-check-store: expected redis://HOST:PORT/DB, redis+cluster://HOST:PORT[,...], shm or none, "
                     f"got {url!r}")


def open_cache(settings: CacheSettings | None, prefix: str = channels.PREFIX) -> AnswerCache | None:
    """The response cache ``--cache-config`` names: this worker's memory, or a Redis the fleet shares."""
    if settings is None:
        return None
    if settings.kind == "local":
        return AnswerCache(LocalCache(settings.size_bytes))
    return AnswerCache(RedisCache(settings.url, settings.ttl_s, prefix))


def live_workers(heartbeats: HeartbeatStore | None, local_worker: str) -> Callable[[], Awaitable[set[str]]]:
    """Who must answer a control message: every live worker, or the one in this process."""

    async def live() -> set[str]:
        return {local_worker} if heartbeats is None else set(await heartbeats.live())

    return live
