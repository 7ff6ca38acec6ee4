"""The Redis job store: one hash per job at ``ferry.job.<id>``.

Fields: ``status``, ``meta`` (msgpack, see ``gateway.jobs.job``) and
``result`` (an encoded envelope Response). The key's EXPIRE is the TTL, so
Redis itself forgets a job when it expires: here an expired job reads as
unknown. Each transition is one Lua script that checks the current status,
so a cancel, a worker's ``begin`` and a reply racing from different processes
cannot both win; a job is created by one too (its fields and its TTL at once).
Redis errors leave as ``broker.errors.TransportError``.

The commands go out with those due at the same time (``broker.redis_pipe``), a
result's bytes written uncopied (one under 1 MB on a connection of its own):
redis-py's own packer copies a 4 MB result for about 4.5 ms of CPU. A job is
read by one script that returns its result too where that is small (up to
``SMALL_RESULT_BYTES``: most polls find a job unfinished, or a small answer);
a larger result is then read on a connection of its own, so that it holds up
no other reply.
"""

from __future__ import annotations

from broker import channels
from broker.errors import translated
from broker.redis_pipe import WRITE_BUDGET_BYTES, pipes_for, run_script
from broker.redis_url import REDIS_ERRORS, async_client
from gateway.jobs.job import Job, JobStatus, decode_meta, encode_meta
from gateway.jobs.store import DEFAULT_TTL_S

# HSET keeps the key's TTL, so a finished job expires when it would have.
# ARGV: new status, result, then the statuses it may move from.
_MOVE = """
local status = redis.call('HGET', KEYS[1], 'status')
if not status then return 0 end
for i = 3, #ARGV do
  if status == ARGV[i] then
    redis.call('HSET', KEYS[1], 'status', ARGV[1], 'result', ARGV[2])
    return 1
  end
end
return 0
"""
# ARGV: status, meta, result, TTL in ms.
_CREATE = """
redis.call('HSET', KEYS[1], 'status', ARGV[1], 'meta', ARGV[2], 'result', ARGV[3])
redis.call('PEXPIRE', KEYS[1], ARGV[4])
return 1
"""
# ARGV: the largest result returned with the status. Returns {} for an unknown job, else
# {status, meta, result} or, for a larger result, {status, meta}.
_GET = """
local fields = redis.call('HMGET', KEYS[1], 'status', 'meta')
if not fields[2] then return {} end
if redis.call('HSTRLEN', KEYS[1], 'result') <= tonumber(ARGV[1]) then
  return {fields[1], fields[2], redis.call('HGET', KEYS[1], 'result') or ''}
end
return {fields[1], fields[2]}
"""
# A result up to the size the pipe still sends with other commands comes back with its status, in the pipe.
SMALL_RESULT_BYTES = WRITE_BUDGET_BYTES
_QUEUED = (JobStatus.QUEUED.value,)
_UNFINISHED = (JobStatus.QUEUED.value, JobStatus.RUNNING.value)


class RedisJobStore:
    def __init__(self, url: str, ttl_s: float = DEFAULT_TTL_S, prefix: str = channels.PREFIX) -> None:
        self._redis = async_client(url)
        self._ttl_ms = max(1, round(ttl_s * 1000))
        self._prefix = prefix
        self._pipes = pipes_for(self._redis, large_alone=True)  # results wait on no other
        self._move_script = self._redis.register_script(_MOVE)
        self._create_script = self._redis.register_script(_CREATE)
        self._get_script = self._redis.register_script(_GET)

    async def __aenter__(self) -> RedisJobStore:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def create(self, job: Job) -> None:
        key = channels.job_key(job.id, self._prefix)
        with translated(REDIS_ERRORS, "redis"):
            await run_script(self._pipes, self._create_script, (key,),
                             (job.status.value, encode_meta(job), job.result, self._ttl_ms))

    async def get(self, job_id: str) -> Job | None:
        key = channels.job_key(job_id, self._prefix)
        with translated(REDIS_ERRORS, "redis"):
            reply = await run_script(self._pipes, self._get_script, (key,), (SMALL_RESULT_BYTES,))
            if not reply:
                return None
            if len(reply) == 3:
                result = reply[2]
            else:  # a large one, read alone
                result = await self._pipes.call_for(key, "HGET", key, "result", alone=True)
                if result is None:  # expired since
                    return None
        return decode_meta(reply[1], JobStatus(reply[0].decode()), bytes(result))

    async def begin(self, job_id: str) -> bool:
        return await self._move(job_id, JobStatus.RUNNING, b"", _UNFINISHED)

    async def finish(self, job_id: str, status: JobStatus, result: bytes) -> bool:
        return await self._move(job_id, status, result, _UNFINISHED)

    async def cancel(self, job_id: str) -> Job | None:
        await self._move(job_id, JobStatus.CANCELLED, b"", _QUEUED)
        return await self.get(job_id)

    async def discard(self, job_id: str) -> None:
        key = channels.job_key(job_id, self._prefix)
        with translated(REDIS_ERRORS, "redis"):
            await self._pipes.call_for(key, "DEL", key)

    async def aclose(self) -> None:
        await self._pipes.aclose()
        await self._redis.aclose()

    async def _move(self, job_id: str, status: JobStatus, result: bytes, sources: tuple[str, ...]) -> bool:
        key = channels.job_key(job_id, self._prefix)
        with translated(REDIS_ERRORS, "redis"):
            return bool(await run_script(self._pipes, self._move_script, (key,), (status.value, result, *sources)))
