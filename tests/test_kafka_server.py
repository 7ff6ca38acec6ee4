"""The Kafka test broker itself: it serves real clients, caches its jars and leaves nothing behind."""

from __future__ import annotations

import gc
import json
import re
import shutil
import socket
import subprocess
import threading
import time
import uuid
import warnings
from pathlib import Path

import pytest

from tests.kafka.fetch_jars import FetchError, Jars, fetch_jars
from tests.kafka_server import (
    BROKER_PORTS, JavaNotFoundError, KafkaServer, broker_properties, create_topic, left_client_sockets,
)


def kcat(*arguments: str, stdin: str = "") -> str:
    found = shutil.which("kcat")
    if found is None:
        pytest.fail("kcat is not installed: run `make system-packages`")
    done = subprocess.run([found, *arguments], check=False, input=stdin, capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr
    return done.stdout


def fresh_topic() -> str:
    return f"t-{uuid.uuid4().hex}"


def test_kcat_round_trips_keyed_messages_with_headers(kafka_bootstrap: str) -> None:
    topic = fresh_topic()
    kcat("-b", kafka_bootstrap, "-P", "-t", topic, "-K:", "-H", "h=v", stdin="k1:one\nk2:two\nk3:three\n")
    out = kcat("-b", kafka_bootstrap, "-C", "-t", topic, "-o", "beginning", "-e", "-f", "%k %s %h\\n")
    assert out.splitlines() == ["k1 one h=v", "k2 two h=v", "k3 three h=v"]


def test_create_topic_makes_the_requested_partitions(kafka_bootstrap: str) -> None:
    topic = fresh_topic()
    create_topic(kafka_bootstrap, topic, partitions=3)
    metadata = json.loads(kcat("-b", kafka_bootstrap, "-L", "-J", "-t", topic))
    assert [len(t["partitions"]) for t in metadata["topics"]] == [3]


def test_a_second_fetch_is_a_cache_hit_that_never_runs_mvn() -> None:
    fetch_jars()
    started = time.monotonic()
    jars = fetch_jars(mvn="no-such-mvn")  # would raise FetchError if it tried to download
    assert not jars.fetched
    assert time.monotonic() - started < 1.0
    assert list(jars.lib.glob("kafka_2.13-*.jar"))


def test_racing_fetches_download_once(tmp_path: Path) -> None:
    # mvn copies out of ~/.m2, which the first fetch above has filled, so this stays quick.
    results: list[Jars] = []
    racers = [threading.Thread(target=lambda: results.append(fetch_jars(cache=tmp_path))) for _ in range(2)]
    for racer in racers:
        racer.start()
    for racer in racers:
        racer.join()
    assert sorted(jars.fetched for jars in results) == [False, True]
    assert results[0].lib == results[1].lib
    assert [p.name for p in (tmp_path / results[0].lib.parent.name).iterdir() if p.name != ".lock"] == ["lib"]


def test_an_empty_cache_without_mvn_is_a_loud_error(tmp_path: Path) -> None:
    with pytest.raises(FetchError, match="no-such-mvn is not installed"):
        fetch_jars(cache=tmp_path, mvn="no-such-mvn")


def test_missing_java_is_the_error_the_fixture_reports() -> None:
    with pytest.raises(JavaNotFoundError):
        KafkaServer(java="no-such-java")


def test_stop_ends_the_broker_and_removes_its_files() -> None:
    server = KafkaServer()
    with server:
        log = server.log_path
        port = server.port
        assert b"Kafka Server started" in log.read_bytes()
    assert not log.parent.exists()
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", port), timeout=1).close()


def test_broker_listens_on_loopback_only(tmp_path: Path) -> None:
    properties = broker_properties(9092, 9093, tmp_path, num_partitions=1)
    listeners = [line for line in properties.splitlines() if "listeners=" in line]
    assert listeners and all("://" in line for line in listeners)
    assert all(address.split("://")[1].startswith("127.0.0.1:") for line in listeners
               for address in line.split("=", 1)[1].split(","))  # fmt: skip


def test_a_restarted_broker_keeps_its_port_and_its_topics(tmp_path):
    if shutil.which("kcat") is None:
        pytest.fail("kcat is not installed: run `make system-packages`")
    with KafkaServer() as server:
        port = server.port
        produce = ["kcat", "-b", server.bootstrap, "-P", "-t", "kept"]
        subprocess.run(produce, input=b"before\n", check=True, timeout=60)
        server.restart(down_s=0.5)
        assert server.port == port
        subprocess.run(produce, input=b"after\n", check=True, timeout=60)
        consumed = subprocess.run(["kcat", "-b", server.bootstrap, "-C", "-t", "kept", "-o", "beginning", "-e"],
                                  check=True, capture_output=True, timeout=60).stdout
    assert consumed.split() == [b"before", b"after"]


def test_only_a_socket_left_open_to_a_test_broker_is_let_go(kafka_bootstrap: str) -> None:
    """The collector's warning for a Kafka client's socket is let go, and for any other still fails."""
    broker_port = int(kafka_bootstrap.rpartition(":")[2])
    assert broker_port in BROKER_PORTS
    with socket.create_server(("127.0.0.1", 0)) as other:
        other_port = other.getsockname()[1]
        pattern = left_client_sockets()
        assert pattern is not None
        left = [socket.create_connection(("127.0.0.1", port)) for port in (broker_port, other_port)]
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            warnings.filterwarnings("ignore", message=pattern, category=ResourceWarning)
            del left
            gc.collect()
    [warned] = [str(each.message) for each in caught if each.category is ResourceWarning]
    assert re.search(rf"raddr=\('127\.0\.0\.1', {other_port}\)", warned)
