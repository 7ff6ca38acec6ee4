"""Async inference jobs: submit with ``Prefer: respond-async``, then poll.

    service.py       JobService (submit, get, cancel) and build_jobs
    replies.py       JobReplyConsumer: the shared job-reply channel into the store
    store.py         the JobStore protocol
    memory_store.py  MemoryJobStore (embedded default, injectable clock)
    redis_store.py   RedisJobStore (ferry.job.<id> hashes with EXPIRE)
    job.py           Job, JobStatus, Rendering and their msgpack form
    prefer.py        the RFC 7240 Prefer header
"""


from broker import channels
from broker.redis_url import is_redis_url
from gateway.jobs.job import Job, JobStatus
from gateway.jobs.memory_store import MemoryJobStore
from gateway.jobs.redis_store import RedisJobStore
from gateway.jobs.service import JobService, JobSettings, build_jobs
from gateway.jobs.store import DEFAULT_TTL_S, JobStore


def open_job_store(broker_url: str, ttl_s: float = DEFAULT_TTL_S, prefix: str = channels.PREFIX) -> JobStore:
    """The store that fits a broker: in process for ``memory://``, shared in
    Redis for ``redis://`` (so every gateway on that broker sees every job)."""
    if is_redis_url(broker_url):
        return RedisJobStore(broker_url, ttl_s, prefix)
    return MemoryJobStore(ttl_s)

__all__ = ["DEFAULT_TTL_S", "Job", "JobService", "JobSettings", "JobStatus", "JobStore", "MemoryJobStore", "RedisJobStore",
           "build_jobs", "open_job_store"]
