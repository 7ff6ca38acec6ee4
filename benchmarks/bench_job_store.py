"""The Redis job store's CPU per job, against the same commands sent through redis-py, in one run.

An async job's life in the store (``gateway.jobs.redis_store``) is five commands: create
(the hash and its TTL), begin, finish (the result written), get (the poll that finds it done)
and discard. ``RedisJobStore`` sends them through ``broker.redis_pipe``; the baseline,
``redis-py``, sends the same commands through redis-py's client, as the store did before (a
MULTI/EXEC pipeline to create, a registered script to move, HGETALL, DEL). Each row runs jobs
from ``--concurrency`` tasks for ``--duration`` seconds after a warm-up, on one real
``redis-server`` on 127.0.0.1, and reports the client's CPU (this process, the only one
sending) and the server's, per job.

    python benchmarks/bench_job_store.py            # small, 301 KB and 4 MB results, about 40 s
    python benchmarks/bench_job_store.py --quick    # a smoke run
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
import uuid
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parent.parent
if str(REPO_ROOT) not in sys.path:  # run as a script, benchmarks/ is on the path but not the repository
    sys.path.insert(0, str(REPO_ROOT))

import redis.asyncio as aioredis  # noqa: E402

from benchmarks.cpu import process_cpu_s  # noqa: E402
from benchmarks.fleet_procs import redis_server  # noqa: E402
from benchmarks.table import Column, print_table  # noqa: E402
from benchmarks.window import Window, WindowOptions  # noqa: E402
from broker import channels  # noqa: E402
from gateway.jobs import Job, JobStatus, RedisJobStore  # noqa: E402
from gateway.jobs.job import Rendering, encode_meta  # noqa: E402
from gateway.jobs.redis_store import _MOVE, _UNFINISHED  # noqa: E402
from gateway.v2_codec import RequestedOutput  # noqa: E402

WINDOWS = WindowOptions(full=Window(duration_s=4.0, warmup_s=1.0), quick=Window(duration_s=1.0, warmup_s=0.3))
SIZES = {"small": 64, "large": 3 * 224 * 224 * 2, "huge": 4 << 20}
TTL_MS = 60_000


class RedisPyJobs:
    """The baseline: the store's commands through redis-py's own client."""

    def __init__(self, url: str) -> None:
        self._redis = aioredis.Redis.from_url(url)
        self._move = self._redis.register_script(_MOVE)

    async def create(self, job: Job) -> None:
        key = channels.job_key(job.id)
        async with self._redis.pipeline(transaction=True) as pipe:
            pipe.hset(key, mapping={"status": job.status.value, "meta": encode_meta(job), "result": job.result})
            pipe.pexpire(key, TTL_MS)
            await pipe.execute()

    async def begin(self, job_id: str) -> bool:
        return bool(await self._move(keys=[channels.job_key(job_id)], args=[JobStatus.RUNNING.value, b"",
                                                                              *_UNFINISHED]))

    async def finish(self, job_id: str, status: JobStatus, result: bytes) -> bool:
        return bool(await self._move(keys=[channels.job_key(job_id)], args=[status.value, result, *_UNFINISHED]))

    async def get(self, job_id: str) -> Any:
        return await self._redis.hgetall(channels.job_key(job_id))

    async def discard(self, job_id: str) -> None:
        await self._redis.delete(channels.job_key(job_id))

    async def aclose(self) -> None:
        await self._redis.aclose()


@dataclass(frozen=True, slots=True)
class Row:
    store: str
    size: str
    result_bytes: int
    jobs: int
    jobs_per_s: float
    client_us_per_job: float
    server_us_per_job: float | None
    x_redis_py: float | None = None  # client CPU per job over the baseline's, same size


async def run_jobs(store: Any, result: bytes, concurrency: int, window: Window,
                   server_pid: int) -> tuple[int, float, float, float | None]:
    rendering = Rendering("req-1", (RequestedOutput("OUTPUT0", True),), binary_default=True)
    counted = False
    done = 0

    async def one() -> None:
        nonlocal done
        job = Job(uuid.uuid4().hex, "identity", "1", created_ns=time.time_ns(), rendering=rendering)
        await store.create(job)
        await store.begin(job.id)
        await store.finish(job.id, JobStatus.SUCCEEDED, result)
        if not await store.get(job.id):
            raise RuntimeError(f"job {job.id} not found after it finished")
        await store.discard(job.id)
        if counted:
            done += 1

    async def loop(until: float) -> None:
        while time.perf_counter() < until:
            await one()

    async def phase(seconds: float) -> None:
        until = time.perf_counter() + seconds
        await asyncio.gather(*(loop(until) for _ in range(concurrency)))

    await phase(window.warmup_s)
    counted = True
    cpu, server, wall = time.process_time(), process_cpu_s(server_pid), time.perf_counter()
    await phase(window.duration_s)
    cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    server_after = process_cpu_s(server_pid)
    server_s = server_after - server if server is not None and server_after is not None else None
    return done, wall, cpu, server_s


async def measure(kind: str, url: str, size: str, concurrency: int, window: Window, server_pid: int) -> Row:
    store: RedisJobStore | RedisPyJobs = RedisJobStore(url, ttl_s=TTL_MS / 1000) if kind == "ferry" \
        else RedisPyJobs(url)
    try:
        result = bytes(range(256)) * (SIZES[size] // 256) + b"x" * (SIZES[size] % 256)
        jobs, wall, cpu, server_s = await run_jobs(store, result, concurrency, window, server_pid)
    finally:
        await store.aclose()
    per = 1e6 / max(jobs, 1)
    return Row(kind if kind == "ferry" else "redis-py", size, SIZES[size], jobs, jobs / wall, cpu * per,
               server_s * per if server_s is not None else None)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    WINDOWS.add_to(parser)
    parser.add_argument("--sizes", default="small,large,huge", help="results to store: " + ", ".join(SIZES))
    parser.add_argument("--concurrency", type=int, default=16, help="tasks running jobs at once (default 16)")
    parser.add_argument("--out", type=Path, default=REPO_ROOT / "benchmarks" / "results" / "job_store.json")
    args = parser.parse_args()
    window = WINDOWS.chosen(args)
    sizes = [s for s in args.sizes.split(",") if s]
    unknown = [s for s in sizes if s not in SIZES]
    if unknown:
        parser.error(f"--sizes: unknown size {unknown[0]!r} (choose from {', '.join(SIZES)})")
    rows: list[Row] = []
    with redis_server() as broker:
        for size in sizes:
            base = asyncio.run(measure("redis-py", broker.url, size, args.concurrency, window, broker.pid))
            ours = asyncio.run(measure("ferry", broker.url, size, args.concurrency, window, broker.pid))
            rows += [base, Row(**{**asdict(ours), "x_redis_py": ours.client_us_per_job / base.client_us_per_job})]
    columns = [Column("store", 9, align="<"), Column("result", 7, align="<"), Column("bytes", 9), Column("jobs", 7),
               Column("jobs/s", 8, ".0f"), Column("client µs/job", 14, ".0f"), Column("server µs/job", 14, ".0f"),
               Column("x redis-py", 11, ".2f")]
    print_table(columns, [(r.store, r.size, r.result_bytes, r.jobs, r.jobs_per_s, r.client_us_per_job,
                           r.server_us_per_job, r.x_redis_py) for r in rows])
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"settings": {**asdict(window), "concurrency": args.concurrency},
                                    "rows": [asdict(r) for r in rows]}, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
