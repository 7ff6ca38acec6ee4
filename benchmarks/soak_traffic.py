"""The soak's traffic: a seeded mix of good, bad and abandoned requests, and a tally of what came back.

Each client holds one keep-alive connection and, until its deadline or its request budget runs
out, picks the next kind of request by weight. Good requests are checked (status and values);
bad ones must get a 4xx; abandoned ones open a connection of their own and close it before the
body is sent or before the reply is read. A request unanswered after ``hang_s`` counts as a
hang (the client drops that connection and goes on), as does an async job that is not final
after ``job_timeout_s``. Only ``127.0.0.1`` is ever contacted.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
from collections import Counter
from dataclasses import dataclass, field
from time import monotonic

import numpy as np

from benchmarks.loadgen import HttpReply, TensorSpec, http_request, infer_request, read_response

BINARY, JSON_INFER, ASYNC_JOB, JOB_POLL = "binary-cnn", "json-add-sub", "async-job", "job-poll"
WRONG_SHAPE, UNKNOWN_MODEL, MALFORMED_JSON = "wrong-shape", "unknown-model", "malformed-json"
TOO_MANY_PARAMETERS = "too-many-parameters"
ABANDON_BODY, ABANDON_REPLY = "disconnect-mid-body", "disconnect-before-reply"

# Per 100 requests. Polls are not drawn: each async job makes as many as it needs.
WEIGHTS = {BINARY: 30, JSON_INFER: 30, ASYNC_JOB: 10, WRONG_SHAPE: 4, UNKNOWN_MODEL: 4, MALFORMED_JSON: 4,
           TOO_MANY_PARAMETERS: 4, ABANDON_BODY: 7, ABANDON_REPLY: 7}
KINDS = (BINARY, JSON_INFER, ASYNC_JOB, JOB_POLL, WRONG_SHAPE, UNKNOWN_MODEL, MALFORMED_JSON,
         TOO_MANY_PARAMETERS, ABANDON_BODY, ABANDON_REPLY)
ABANDONED = frozenset({ABANDON_BODY, ABANDON_REPLY})
BAD = frozenset({WRONG_SHAPE, UNKNOWN_MODEL, MALFORMED_JSON, TOO_MANY_PARAMETERS})

CNN_SHAPE, CNN_OUTPUT_BYTES = (1, 3, 128, 128), 10 * 4
ADD_SUB_WIDTH = 16
PARAMETER_COUNT = 100       # more than the envelope's 64 (broker.envelope.Limits.max_params)
POLL_INTERVAL_S = 0.02


@dataclass(slots=True)
class Tally:
    sent: int = 0
    answered: int = 0           # a whole response came back
    as_expected: int = 0        # ... and it was right for its kind
    wrong: int = 0              # ... and it was not (a 5xx, a 200 to a bad request, a wrong value)
    hangs: int = 0
    dropped: int = 0            # the connection failed before a response
    statuses: Counter[int] = field(default_factory=Counter)
    first_problem: str | None = None

    def problem(self, text: str) -> None:
        if self.first_problem is None:
            self.first_problem = text

    def wrong_answer(self, text: str) -> None:
        self.wrong += 1
        self.problem(text)

    def to_json(self) -> dict[str, object]:
        return {"sent": self.sent, "answered": self.answered, "as_expected": self.as_expected,
                "wrong": self.wrong, "hangs": self.hangs, "dropped": self.dropped,
                "statuses": {str(k): v for k, v in sorted(self.statuses.items())},
                "first_problem": self.first_problem}


def new_tallies() -> dict[str, Tally]:
    return {kind: Tally() for kind in KINDS}


@dataclass(frozen=True, slots=True)
class ClientPlan:
    deadline: float             # monotonic: no request starts after it
    max_requests: int
    hang_s: float
    job_timeout_s: float
    weights: dict[str, int]     # WEIGHTS, or some of them


@dataclass(frozen=True, slots=True)
class Traffic:
    """Every request the soak sends, built once (but the unknown model's name and the polls)."""

    host: str
    port: int
    binary: bytes
    json_body: bytes
    expected_sum: tuple[float, ...]

    @classmethod
    def build(cls, host: str, port: int) -> Traffic:
        image = np.random.default_rng(1).random(CNN_SHAPE, dtype=np.float32)
        binary = infer_request(host, port, "cnn", TensorSpec("IMAGE", "FP32", CNN_SHAPE, image.tobytes()))
        left = [i / 8 for i in range(ADD_SUB_WIDTH)]
        right = [1.5] * ADD_SUB_WIDTH
        body = _add_sub_body(left, right, ADD_SUB_WIDTH)
        return cls(host, port, binary, body, tuple(a + b for a, b in zip(left, right)))

    def post(self, path: str, body: bytes, **headers: str) -> bytes:
        return http_request(self.host, self.port, "POST", path, body, {"Content-Type": "application/json", **headers})

    def request(self, kind: str, serial: int) -> bytes:
        infer = "/v2/models/add_sub/infer"
        if kind == JSON_INFER:
            return self.post(infer, self.json_body)
        if kind == ASYNC_JOB:
            return self.post(infer, self.json_body, Prefer="respond-async")
        if kind == WRONG_SHAPE:
            return self.post(infer, _add_sub_body([1.0] * 15, [1.0] * 15, 15))
        if kind == UNKNOWN_MODEL:  # a new name each time, as a hostile client would send
            return self.post(f"/v2/models/no_such_model_{serial}/infer", self.json_body)
        if kind == MALFORMED_JSON:
            return self.post(infer, self.json_body[: len(self.json_body) // 2])
        if kind == TOO_MANY_PARAMETERS:
            header = json.loads(self.json_body)
            header["parameters"] = {f"p{i}": i for i in range(PARAMETER_COUNT)}
            return self.post(infer, json.dumps(header).encode())
        return self.binary

    def poll(self, job_id: str) -> bytes:
        return http_request(self.host, self.port, "GET", f"/v2/jobs/{job_id}")


def _add_sub_body(left: list[float], right: list[float], width: int) -> bytes:
    inputs = [{"name": name, "datatype": "FP32", "shape": [1, width], "data": data}
              for name, data in (("INPUT0", left), ("INPUT1", right))]
    return json.dumps({"inputs": inputs}, separators=(",", ":")).encode()


class Client:
    """One simulated user: a keep-alive connection and a seeded choice of what to send next."""

    def __init__(self, traffic: Traffic, plan: ClientPlan, tallies: dict[str, Tally], seed: int) -> None:
        self._traffic = traffic
        self._plan = plan
        self._tallies = tallies
        self._rng = random.Random(seed)
        self._seed = seed
        self._connection: tuple[asyncio.StreamReader, asyncio.StreamWriter] | None = None

    async def run(self) -> None:
        kinds, weights = list(self._plan.weights), list(self._plan.weights.values())
        try:
            for serial in range(self._plan.max_requests):
                if monotonic() >= self._plan.deadline:
                    return
                kind = self._rng.choices(kinds, weights)[0]
                await self._send(kind, self._seed * 10_000_000 + serial)
        finally:
            self._disconnect()

    async def _send(self, kind: str, serial: int) -> None:
        tally = self._tallies[kind]
        tally.sent += 1
        if kind in ABANDONED:
            await self._abandon(kind)
            return
        reply = await self._exchange(self._traffic.request(kind, serial), tally)
        if reply is None:
            return
        if kind == ASYNC_JOB:
            await self._follow_job(reply, tally)
            return
        problem = self._check(kind, reply)
        if problem is None:
            tally.as_expected += 1
        else:
            tally.wrong_answer(problem)

    def _check(self, kind: str, reply: HttpReply) -> str | None:
        if kind in BAD:
            return None if 400 <= reply.status < 500 else _describe(reply, "a 4xx")
        if reply.status != 200:
            return _describe(reply, "200")
        if kind == BINARY:
            if reply.header_length is None or len(reply.body) - reply.header_length != CNN_OUTPUT_BYTES:
                return f"binary outputs of the wrong size: {reply.body[:200]!r}"
            return None
        return self._check_sum(reply.body)

    def _check_sum(self, body: bytes) -> str | None:
        try:
            outputs = {output["name"]: output["data"] for output in json.loads(body)["outputs"]}
            close = np.allclose(outputs["OUTPUT0"], self._traffic.expected_sum)
        except (ValueError, KeyError, TypeError) as exc:
            return f"unreadable outputs ({exc!r}): {body[:200]!r}"
        return None if close else f"wrong OUTPUT0: {outputs['OUTPUT0']}"

    async def _follow_job(self, submitted: HttpReply, tally: Tally) -> None:
        if submitted.status != 202:
            tally.wrong_answer(_describe(submitted, "202"))
            return
        job_id = _json_field(submitted.body, "job_id")
        if not isinstance(job_id, str):
            tally.wrong_answer(f"a 202 without a job id: {submitted.body[:200]!r}")
            return
        polls = self._tallies[JOB_POLL]
        give_up = monotonic() + self._plan.job_timeout_s
        while monotonic() < give_up:
            polls.sent += 1
            reply = await self._exchange(self._traffic.poll(job_id), polls)
            if reply is None:
                return
            if reply.status != 200:   # the poll was answered wrongly, not (yet) the job
                polls.wrong_answer(f"job {job_id}: {_describe(reply, '200')}")
                return
            polls.as_expected += 1
            if _json_field(reply.body, "status") in ("queued", "running"):
                await asyncio.sleep(POLL_INTERVAL_S)
                continue
            problem = self._check_sum(reply.body)
            if problem is None:
                tally.as_expected += 1
            else:
                tally.wrong_answer(f"job {job_id}: {problem}")
            return
        tally.hangs += 1
        tally.problem(f"job {job_id} not final after {self._plan.job_timeout_s:.0f} s")

    async def _exchange(self, request: bytes, tally: Tally) -> HttpReply | None:
        """Send on the keep-alive connection; None when the request hung or the connection failed."""
        try:
            reply = await asyncio.wait_for(self._round_trip(request), self._plan.hang_s)
        except TimeoutError:
            tally.hangs += 1
            tally.problem(f"no response after {self._plan.hang_s:.0f} s: {request[:120]!r}")
            self._disconnect()
            return None
        except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError) as exc:
            tally.dropped += 1
            tally.problem(f"connection failed: {exc!r}")
            self._disconnect()
            return None
        tally.answered += 1
        tally.statuses[reply.status] += 1
        if reply.closing:
            self._disconnect()
        return reply

    async def _round_trip(self, request: bytes) -> HttpReply:
        reader, writer = await self._connect()
        writer.write(request)
        await writer.drain()
        return await read_response(reader)

    async def _abandon(self, kind: str) -> None:
        """A connection of its own, closed halfway through the body or before the reply is read."""
        request = self._traffic.binary
        data = request[: len(request) // 2] if kind == ABANDON_BODY else request
        try:
            await asyncio.wait_for(_send_and_close(self._traffic, data), self._plan.hang_s)
        except TimeoutError:
            self._tallies[kind].hangs += 1
            self._tallies[kind].problem(f"could not connect and send within {self._plan.hang_s:.0f} s")
        except OSError as exc:
            self._tallies[kind].dropped += 1
            self._tallies[kind].problem(f"connection failed: {exc!r}")

    async def _connect(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        if self._connection is None:
            self._connection = await asyncio.open_connection(self._traffic.host, self._traffic.port)
        return self._connection

    def _disconnect(self) -> None:
        if self._connection is not None:
            with contextlib.suppress(OSError):
                self._connection[1].close()
            self._connection = None


async def _send_and_close(traffic: Traffic, data: bytes) -> None:
    _, writer = await asyncio.open_connection(traffic.host, traffic.port)
    try:
        writer.write(data)
        await writer.drain()
        await asyncio.sleep(0.002)  # let the server start on it
    finally:
        writer.close()


def _json_field(body: bytes, key: str) -> object:
    try:
        document = json.loads(body)
    except ValueError:
        return None
    return document.get(key) if isinstance(document, dict) else None


def _describe(reply: HttpReply, wanted: str) -> str:
    return f"HTTP {reply.status}, expected {wanted}: {reply.body[:200]!r}"
