"""Real ``ferry gateway`` and ``ferry worker`` processes over Kafka, and kcat
as the outside producer and consumer.

    with KafkaFleet(bootstrap, repository, tmp_path) as fleet:
        worker = fleet.worker("w1")          # returns once its heartbeat is on the topic
        fleet.kcat.produce(fleet.topic("ferry.add_sub.requests"), body, key="r1",
                           headers={"content-type": "application/json", "reply-to": "my.replies"})
        [reply] = fleet.kcat.consume(fleet.topic("my.replies"), count=1)

Each fleet gets a namespace of its own (``kafka://…?namespace=``), so tests
sharing one broker never meet; ``topic`` gives a channel's name on the
cluster. The process classes and ``wait_for`` are the Redis fleet's.
"""

from __future__ import annotations

import json
import subprocess
import tempfile
import uuid
from collections.abc import Sequence
from functools import partial
from pathlib import Path
from typing import Any

import msgpack

from broker import channels
from tests.fleet.processes import START_TIMEOUT_S, FerryProcess, Gateway, ProcessFleet, Record, wait_for

__all__ = ["FerryProcess", "Gateway", "Kcat", "KafkaFleet", "Record", "wait_for"]

KCAT = "/usr/bin/kcat"
KCAT_TIMEOUT_S = 30.0


class Kcat:
    """kcat against one broker. Produces one message a call (a file is one
    message, so any bytes go through); consumes from the beginning."""

    def __init__(self, bootstrap: str) -> None:
        self.bootstrap = bootstrap

    def produce(self, topic: str, payload: bytes, key: str | None = None,
                headers: dict[str, str] | None = None) -> None:
        """Returns once the broker has acked the message (kcat exits 0 only then)."""
        arguments = [KCAT, "-b", self.bootstrap, "-P", "-t", topic, "-X", "acks=all"]
        if key is not None:
            arguments += ["-k", key]
        for name, value in (headers or {}).items():
            arguments += ["-H", f"{name}={value}"]
        with tempfile.NamedTemporaryFile(prefix="ferry-kcat-") as body:
            body.write(payload)
            body.flush()
            done = subprocess.run([*arguments, body.name], capture_output=True, timeout=KCAT_TIMEOUT_S, check=False)
        assert done.returncode == 0, f"kcat could not produce to {topic}: {done.stderr.decode(errors='replace')}"

    def read(self, topic: str) -> list[Record]:
        """Everything on ``topic`` now; [] when it does not exist yet."""
        records = []
        # For topics of text values: kcat puts binary ones raw into its JSON,
        # which then may not parse (use ``read_keys``/``read_values`` there).
        for line in self._consume(topic, "-J").decode().splitlines():
            if not line.strip():
                continue
            row = json.loads(line)
            pairs = row.get("headers") or []
            headers = dict(zip(pairs[0::2], pairs[1::2], strict=True))
            records.append(Record(row["partition"], row["offset"], row.get("key"), headers, row.get("payload") or ""))
        return records

    def produce_lines(self, topic: str, keyed: list[tuple[str, bytes]], headers: dict[str, str]) -> None:
        """Many messages in one kcat run, all with ``headers``; values must hold no newline or tab."""
        arguments = [KCAT, "-b", self.bootstrap, "-P", "-t", topic, "-X", "acks=all", "-K", "\t"]
        for name, value in headers.items():
            arguments += ["-H", f"{name}={value}"]
        lines = b"".join(key.encode() + b"\t" + value + b"\n" for key, value in keyed)
        done = subprocess.run(arguments, input=lines, capture_output=True, timeout=KCAT_TIMEOUT_S, check=False)
        assert done.returncode == 0, f"kcat could not produce to {topic}: {done.stderr.decode(errors='replace')}"

    def topics(self) -> list[str]:
        arguments = [KCAT, "-b", self.bootstrap, "-L", "-J"]
        done = subprocess.run(arguments, capture_output=True, timeout=KCAT_TIMEOUT_S, check=True)
        return sorted(found["topic"] for found in json.loads(done.stdout)["topics"])

    def partitions(self, topic: str) -> int:
        """How many partitions ``topic`` has (0 when it does not exist)."""
        arguments = [KCAT, "-b", self.bootstrap, "-L", "-t", topic, "-J"]
        done = subprocess.run(arguments, capture_output=True, timeout=KCAT_TIMEOUT_S, check=False)
        if done.returncode != 0:
            return 0
        [found] = json.loads(done.stdout)["topics"]
        return 0 if found.get("error") else len(found["partitions"])

    def read_headed(self, topic: str) -> list[Record]:
        """Every record on ``topic`` now without its value (so any bytes are fine);
        header values must not hold a comma."""
        records = []
        for line in self._consume(topic, "-f", "%p\t%o\t%k\t%h\n").decode(errors="replace").splitlines():
            partition, offset, key, headers = line.split("\t")
            pairs = (pair.partition("=") for pair in headers.split(",") if pair)
            records.append(Record(int(partition), int(offset), key, {name: value for name, _, value in pairs}, ""))
        return records

    def read_keys(self, topic: str) -> list[tuple[int, str]]:
        """(partition, key) of every record on ``topic`` now, whatever their values."""
        lines = self._consume(topic, "-f", "%p\t%k\n").decode(errors="replace").splitlines()
        return [(int(partition), key) for partition, _, key in (line.partition("\t") for line in lines) if partition]

    def read_values(self, topic: str) -> bytes:
        """The values on ``topic`` now, back to back, as they are (no delimiter)."""
        return self._consume(topic, "-f", "%s")

    def read_msgpack(self, topic: str) -> list[object]:
        """Every value on ``topic``, each a msgpack object (kcat writes them back to back)."""
        raw = self._consume(topic, "-f", "%s")
        unpacker = msgpack.Unpacker(raw=False)
        unpacker.feed(raw)
        return list(unpacker)

    def consume(self, topic: str, count: int, timeout_s: float = KCAT_TIMEOUT_S) -> list[Record]:
        """Poll until ``topic`` holds at least ``count`` records."""
        found: list[Record] = []

        def enough() -> bool:
            nonlocal found
            found = self.read(topic)
            return len(found) >= count

        wait_for(enough, timeout_s, f"{count} records on {topic}", interval_s=0.2)
        return found

    def _consume(self, topic: str, *form: str) -> bytes:
        arguments = [KCAT, "-b", self.bootstrap, "-C", "-t", topic, "-o", "beginning", "-e", "-q", *form]
        done = subprocess.run(arguments, capture_output=True, timeout=KCAT_TIMEOUT_S, check=False)
        return done.stdout if done.returncode == 0 else b""  # not 0: no such topic (yet)


class KafkaFleet(ProcessFleet):
    """Gateways and workers on ``repository`` over the broker at ``bootstrap``, in a
    namespace of their own; all stopped on exit."""

    def __init__(self, bootstrap: str, repository: Path, log_dir: Path, query: str = "") -> None:
        self.namespace = f"t{uuid.uuid4().hex[:8]}."
        extra = f"&{query}" if query else ""
        super().__init__(f"kafka://{bootstrap}?namespace={self.namespace}{extra}", repository, log_dir)
        self.bootstrap = bootstrap
        self.kcat = Kcat(bootstrap)

    def topic(self, channel: str) -> str:
        """A channel's topic on the cluster."""
        return self.namespace + channel

    def read_dead_letters(self) -> list[Any]:
        return self.kcat.read_msgpack(self.topic(channels.dead_letter_channel()))

    def produce_json(self, channel: str, body: bytes, request_id: str, reply_to: str, **headers: str) -> None:
        """A message kcat puts on ``channel``'s topic: a JSON body keyed by its request id."""
        self.kcat.produce(self.topic(channel), body, key=request_id,
                          headers={"content-type": "application/json", "reply-to": reply_to, **headers})

    def read_replies(self, channel: str, count: int, timeout_s: float = 30.0) -> list[Record]:
        """Poll until ``channel``'s topic holds at least ``count`` records."""
        return self.kcat.consume(self.topic(channel), count, timeout_s)

    def wait_assigned(self, workers: Sequence[FerryProcess], channel: str, timeout_s: float = START_TIMEOUT_S) -> None:
        """Until each worker holds partitions of ``channel``: the rebalance its
        joining started is over. A partition that moves takes what was handed
        out there and not yet acked to its next owner, which computes it
        again (at-least-once); a test that counts computations waits here."""
        for worker in workers:
            wait_for(partial(holds, worker, channel), timeout_s, f"{worker.name} to hold partitions of {channel}",
                     worker, interval_s=0.2)

    def wait_heartbeat(self, worker_id: str, worker: FerryProcess, timeout_s: float = START_TIMEOUT_S) -> None:
        """Until a heartbeat of ``worker_id`` is on the heartbeat topic (it beats once its models are loaded)."""
        topic = self.topic(channels.heartbeat_channel())
        wait_for(lambda: any(key == worker_id for _, key in self.kcat.read_keys(topic)), timeout_s,
                 f"a heartbeat of {worker_id} on {topic}", worker, interval_s=0.2)


def holds(worker: FerryProcess, channel: str) -> bool:
    """Whether ``worker`` has logged partitions of ``channel`` assigned to it."""
    return any(event.get("event") == "kafka.partitions_assigned"
               and any(name.rpartition("-")[0] == channel for name in event.get("partitions", ()))
               for event in worker.log_events())
