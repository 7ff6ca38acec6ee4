"""Real ``ferry gateway`` and ``ferry worker`` processes for fleet tests.

    with Fleet(redis_url, repository, tmp_path) as fleet:
        gateway = fleet.gateway()
        worker = fleet.worker("w1", "--claim-idle-s", "1")
        fleet.wait_model_ready(gateway, "add_sub")

Every process a ``Fleet`` starts is stopped when the ``with`` block ends,
whatever happened inside it. Each process logs JSON lines to its own file
under the directory given, so a failing test can show what each one said.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any, Self

import msgpack

from broker import channels
from broker.channels import redis_key
from broker.redis_url import sync_client
from broker.transports.redis import PAYLOAD_FIELD
from tests.servers import free_port

REPO_ROOT = Path(__file__).resolve().parent.parent.parent
# Model load on a busy 2-core machine can take several seconds.
START_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 15.0


@dataclass(frozen=True)
class Record:
    """A message as a raw consumer sees it: a Kafka record, or a Redis stream entry."""

    partition: int
    offset: int
    key: str | None
    headers: dict[str, str]
    payload: str

    def json(self) -> object:
        return json.loads(self.payload)


class FerryProcess:
    def __init__(self, name: str, command: list[str], log_path: Path, dumps_tasks: bool = False) -> None:
        self.name = name
        self.log_path = log_path
        self.dumps_tasks = dumps_tasks  # logs what its tasks wait on at SIGUSR2 (ferry worker)
        self._log = open(log_path, "wb")
        self.process = subprocess.Popen(
            command, cwd=REPO_ROOT, stdout=self._log, stderr=subprocess.STDOUT,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )

    @property
    def pid(self) -> int:
        return self.process.pid

    def running(self) -> bool:
        return self.process.poll() is None

    def send(self, sig: signal.Signals) -> None:
        if self.running():
            os.kill(self.pid, sig)

    def kill(self) -> None:
        """SIGKILL, and reap it, so nothing of it is left running."""
        self.send(signal.SIGKILL)
        self.process.wait()

    def wait(self, timeout_s: float) -> int | None:
        """The exit code, or None if it is still running after ``timeout_s``."""
        try:
            return self.process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            return None

    def stop(self) -> None:
        """SIGTERM, then SIGKILL if it outlives ``STOP_TIMEOUT_S``."""
        if self.running():
            self.send(signal.SIGTERM)
            if self.wait(STOP_TIMEOUT_S) is None:
                self.kill()
        self._log.close()

    def log_text(self) -> str:
        self._log.flush()
        return self.log_path.read_text(encoding="utf-8", errors="replace")

    def log_events(self) -> list[dict[str, Any]]:
        """The JSON log lines; lines that are not JSON (tracebacks) are kept as ``{"raw": line}``."""
        events = []
        for line in self.log_text().splitlines():
            try:
                event = json.loads(line)
            except ValueError:
                event = {"raw": line}
            events.append(event if isinstance(event, dict) else {"raw": line})
        return events

    def errors(self) -> list[str]:
        """Log lines at error level or above, and anything that is not a JSON log line."""
        bad = []
        for event in self.log_events():
            if "raw" in event:
                if event["raw"].strip():
                    bad.append(event["raw"])
            elif event.get("level") in ("error", "critical", "exception"):
                bad.append(json.dumps(event))
        return bad

    def describe(self) -> str:
        """For assertion messages: who it is, whether it runs, and the tail of its log; a
        worker still running is first asked what its tasks wait on, should it be stuck."""
        state = "running" if self.running() else f"exited {self.process.returncode}"
        lines = 40
        if self.dumps_tasks and self.running():
            self.send(signal.SIGUSR2)
            time.sleep(1.0)
            lines = 200
        tail = "\n".join(self.log_text().splitlines()[-lines:])
        return f"--- {self.name} (pid {self.pid}, {state}), {self.log_path} ---\n{tail}"


class Gateway(FerryProcess):
    def __init__(self, name: str, command: list[str], log_path: Path, port: int) -> None:
        super().__init__(name, command, log_path)
        self.port = port

    @property
    def url(self) -> str:
        """host:port, as tritonclient takes it."""
        return f"127.0.0.1:{self.port}"

    def status(self, path: str) -> int:
        """The HTTP status of ``GET path``; 0 when nothing answers."""
        try:
            with urllib.request.urlopen(f"http://{self.url}{path}", timeout=2) as response:
                return int(response.status)
        except urllib.error.HTTPError as exc:
            return int(exc.code)
        except OSError:
            return 0


class ProcessFleet:
    """Starts gateways and workers on ``repository`` over ``broker_url``; stops them all on exit.
    Subclasses say how to see a worker's heartbeat on their broker, and how an
    outside producer and consumer and the dead letters look there."""

    def __init__(self, broker_url: str, repository: Path, log_dir: Path) -> None:
        self.broker_url = broker_url
        self.repository = repository
        self.log_dir = log_dir
        self.processes: list[FerryProcess] = []

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def close(self) -> None:
        failures = []
        for process in self.processes:
            try:
                process.stop()
            except Exception as exc:  # keep stopping the others
                failures.append(exc)
        if failures:
            raise failures[0]

    def gateway(self, *extra: str) -> Gateway:
        """Start a gateway and wait until it answers ``/v2/health/live``."""
        port = free_port()
        name = f"gateway-{len(self.processes)}"
        gateway = Gateway(name, self._command("gateway", "--http-port", str(port), "--host", "127.0.0.1",
                                              "--grpc-port", "0", *extra), self.log_dir / f"{name}.log", port)
        self.processes.append(gateway)
        wait_for(lambda: gateway.status("/v2/health/live") == 200, START_TIMEOUT_S,
                 f"gateway on port {port} to go live", gateway)
        return gateway

    def worker(self, worker_id: str, *extra: str, wait: bool = True) -> FerryProcess:
        """Start a worker; with ``wait``, return once its heartbeat is seen
        (it heartbeats only after its models are loaded)."""
        name = f"worker-{worker_id}-{len(self.processes)}"
        if "--metrics-port" not in extra:
            extra = ("--metrics-port", "0", *extra)  # many workers on one host: no fixed port 8002
        worker = FerryProcess(name, self._command("worker", "--worker-id", worker_id, *extra),
                              self.log_dir / f"{name}.log", dumps_tasks=True)
        self.processes.append(worker)
        if wait:
            self.wait_heartbeat(worker_id, worker)
        return worker

    def wait_heartbeat(self, worker_id: str, worker: FerryProcess) -> None:
        raise NotImplementedError

    def read_dead_letters(self) -> list[Any]:
        raise NotImplementedError

    def produce_json(self, channel: str, body: bytes, request_id: str, reply_to: str, **headers: str) -> None:
        """Put a JSON request on ``channel`` as a producer outside ferry would."""
        raise NotImplementedError

    def read_replies(self, channel: str, count: int, timeout_s: float = 30.0) -> list[Record]:
        """The replies on ``channel``, once there are at least ``count``."""
        raise NotImplementedError

    def wait_model_ready(self, gateway: Gateway, model: str, timeout_s: float = START_TIMEOUT_S) -> None:
        wait_for(lambda: gateway.status(f"/v2/models/{model}/ready") == 200, timeout_s,
                 f"model {model} ready on {gateway.url}", gateway)

    def describe(self) -> str:
        return "\n".join(process.describe() for process in self.processes)

    def _command(self, role: str, *extra: str) -> list[str]:
        return [sys.executable, "-m", "ferry.cli.main", role, "--broker", self.broker_url,
                "--model-repository", str(self.repository), "--log-format", "json", *extra]


class Fleet(ProcessFleet):
    """A fleet over Redis (one server or a Redis Cluster), and what it left there. Streams are
    named by channel; ``redis_key`` gives the key a channel is kept at."""

    def __init__(self, broker_url: str, repository: Path, log_dir: Path) -> None:
        super().__init__(broker_url, repository, log_dir)
        self.redis = sync_client(broker_url)

    def close(self) -> None:
        try:
            super().close()
        finally:
            self.redis.close()

    def wait_heartbeat(self, worker_id: str, worker: FerryProcess) -> None:
        key = channels.heartbeat_key(worker_id)
        wait_for(lambda: bool(self.redis.exists(key)), START_TIMEOUT_S, f"heartbeat {key}", worker)

    # --- what the fleet left in Redis -----------------------------------

    def pending(self, model: str, consumer: str | None = None) -> int:
        """Deliveries of ``model``'s worker group not acked yet (all consumers, or one)."""
        stream, group = channels.request_channel(model), channels.worker_group(model)
        if not self.redis.exists(stream):
            return 0
        if consumer is None:
            return int(self.redis.xpending(stream, group)["pending"])
        return len(self.pending_ids(model, consumer))

    def pending_ids(self, model: str, consumer: str) -> list[str]:
        stream, group = channels.request_channel(model), channels.worker_group(model)
        rows = self.redis.xpending_range(stream, group, min="-", max="+", count=1_000_000,
                                         consumername=consumer)
        return [_text(row["message_id"]) for row in rows]

    def entries_added(self, stream: str) -> int:
        """How many entries were ever added to ``stream``; unlike its length,
        trimming does not lower it."""
        key = redis_key(stream)
        if not self.redis.exists(key):
            return 0
        return int(self.redis.xinfo_stream(key)["entries-added"])

    def dead_letters(self) -> int:
        return int(self.redis.xlen(channels.dead_letter_channel()))

    def reply_streams(self) -> list[str]:
        return sorted(_text(key) for key in self.redis.scan_iter(match=channels.reply_channel("*")))

    def read_dead_letters(self) -> list[Any]:
        return [msgpack.unpackb(fields[PAYLOAD_FIELD], raw=False)
                for _, fields in self.redis.xrange(channels.dead_letter_channel())]

    # --- a raw producer and consumer ------------------------------------

    def produce_json(self, channel: str, body: bytes, request_id: str, reply_to: str, **headers: str) -> None:
        """An entry XADDed by hand: a JSON body, and each header an ``h.`` field."""
        named = {"content-type": "application/json", "reply-to": reply_to, "request-id": request_id, **headers}
        self.redis.xadd(redis_key(channel), {PAYLOAD_FIELD: body, **{f"h.{name}": value for name, value in named.items()}})

    def read_replies(self, stream: str, count: int, timeout_s: float = 30.0) -> list[Record]:
        """Poll until ``stream`` holds at least ``count`` entries; the key is the request id."""
        wait_for(lambda: self.redis.xlen(stream) >= count, timeout_s, f"{count} replies on {stream}")
        return [_record(offset, fields) for offset, (_, fields) in enumerate(self.redis.xrange(stream))]


def wait_for(condition: Callable[[], bool], timeout_s: float, what: str,
             process: FerryProcess | None = None, interval_s: float = 0.05) -> float:
    """Poll until ``condition()``; return the seconds it took. Fails early if
    ``process`` exits, and shows its log either way."""
    start = time.monotonic()
    while time.monotonic() - start < timeout_s:
        if condition():
            return time.monotonic() - start
        if process is not None and not process.running():
            raise AssertionError(f"{process.name} exited while waiting for {what}\n{process.describe()}")
        time.sleep(interval_s)
    detail = f"\n{process.describe()}" if process is not None else ""
    raise AssertionError(f"timed out after {timeout_s} s waiting for {what}{detail}")


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


def _record(offset: int, fields: dict[bytes, bytes]) -> Record:
    headers = {_text(name)[2:]: _text(value) for name, value in fields.items() if _text(name).startswith("h.")}
    return Record(0, offset, headers.get("request-id"), headers, _text(fields[PAYLOAD_FIELD]))
