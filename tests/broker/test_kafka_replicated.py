"""ferry's Kafka transport on a real three-broker cluster: the topics it creates are
replicated three times with ``min.insync.replicas`` 2, and a broker SIGKILLed between two
rounds of publishing loses nothing either round acknowledged, nor writes anything twice.

The client runs in a process of its own, as a gateway or worker would: kafka-python (3.0)
leaves the sockets of connects to a dead broker that were in flight when it closed to the
garbage collector, and in this process they would fail whichever later test met them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.broker.test_kafka_transport import topic_settings
from tests.kafka_cluster import KafkaCluster

ROOT = Path(__file__).resolve().parents[2]
ROUND = 300
CLIENT = """
import asyncio, json, os, signal, sys
from broker.transports.kafka import KafkaTransport
from broker.transports.kafka_settings import KafkaSettings

bootstrap, victim, rounds = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])

async def main():
    settings = KafkaSettings.from_url(f"kafka://{bootstrap}", namespace="rep.", partitions=3)
    async with KafkaTransport(settings) as transport:
        for n in range(rounds):
            await transport.publish("c", f"m{n}".encode())
        os.kill(victim, signal.SIGKILL)
        for n in range(rounds, 2 * rounds):
            await transport.publish("c", f"m{n}".encode())  # acks=all: two in-sync replicas remain
        received = []
        while len(received) < 2 * rounds:
            batch = await transport.fetch("c", "readers", "r1", 100, 15.0)
            if not batch:
                break
            received += [delivery.payload.decode() for delivery in batch]
            for delivery in batch:
                await transport.ack(delivery)
    print(json.dumps(received))

asyncio.run(main())
"""


@pytest.fixture(scope="module")
def cluster() -> Iterator[KafkaCluster]:
    with KafkaCluster() as started:
        yield started


def test_a_broker_killed_between_two_rounds_loses_and_repeats_nothing_acknowledged(cluster: KafkaCluster):
    run = subprocess.run([sys.executable, "-c", CLIENT, cluster.bootstrap, str(cluster.pid(1)), str(ROUND)],
                         cwd=ROOT, capture_output=True, text=True, timeout=240,
                         env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert run.returncode == 0, run.stderr[-3000:]
    received = json.loads(run.stdout.splitlines()[-1])
    assert sorted(received) == sorted(f"m{n}" for n in range(2 * ROUND)), (
        f"{len(received)} received, {len(set(received))} distinct, of {2 * ROUND}")
    assert not cluster.running(1)
    live = ",".join(f"127.0.0.1:{port}" for port in cluster.ports[1:])  # this process never dials the dead one
    assert topic_settings(live, "rep.c") == (3, "2")
