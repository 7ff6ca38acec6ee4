"""A throwaway real three-broker Kafka cluster (KRaft) on free loopback ports, for the tests
that kill a broker under load.

Each of the three JVMs is both broker and controller, the three controllers one quorum
(``controller.quorum.voters``), so any one may die and the others keep a majority. Internal
topics are replicated three times with ``min.insync.replicas`` 2, as in production. The
jars, JVM options and log layout are ``tests.kafka_server``'s; each node logs to
``node-<id>/broker.log`` under the cluster's directory.
"""

from __future__ import annotations

import signal
import subprocess
import tempfile
import time
from pathlib import Path
from types import TracebackType

from tests.kafka.fetch_jars import fetch_jars
from tests.kafka_server import (
    BROKER_PORTS, JVM_OPTIONS, READY_LINE, READY_TIMEOUT_S, STOP_TIMEOUT_S, TOOL_TIMEOUT_S, KafkaStartError,
    cluster_id, free_ports, java_executable, log4j2_properties,
)

NODES = 3


def node_properties(node_id: int, ports: list[int], controller_ports: list[int], log_dirs: Path,
                    num_partitions: int) -> str:
    index = node_id - 1
    voters = ",".join(f"{n + 1}@127.0.0.1:{port}" for n, port in enumerate(controller_ports))
    return "\n".join([
        "process.roles=broker,controller",
        f"node.id={node_id}",
        f"controller.quorum.voters={voters}",
        f"listeners=PLAINTEXT://127.0.0.1:{ports[index]},CONTROLLER://127.0.0.1:{controller_ports[index]}",
        f"advertised.listeners=PLAINTEXT://127.0.0.1:{ports[index]}",
        "controller.listener.names=CONTROLLER",
        "inter.broker.listener.name=PLAINTEXT",
        "listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
        f"log.dirs={log_dirs}",
        f"num.partitions={num_partitions}",
        "default.replication.factor=3",
        "min.insync.replicas=2",
        "auto.create.topics.enable=true",
        "offsets.topic.replication.factor=3",
        "offsets.topic.num.partitions=1",
        "transaction.state.log.replication.factor=3",
        "transaction.state.log.min.isr=2",
        "share.coordinator.state.topic.replication.factor=3",
        "share.coordinator.state.topic.min.isr=2",
        "group.initial.rebalance.delay.ms=0",
        # A dead broker is noticed within a few seconds, not the default 9 s of missed heartbeats.
        "broker.session.timeout.ms=3000",
        "broker.heartbeat.interval.ms=500",
        "",
    ])  # fmt: skip


class KafkaCluster:
    def __init__(self, java: str = "java", num_partitions: int = 4) -> None:
        self._java = java_executable(java)
        self._num_partitions = num_partitions
        self._dir: tempfile.TemporaryDirectory[str] | None = None
        self._processes: dict[int, subprocess.Popen[bytes]] = {}
        self.ports: list[int] = []

    @property
    def bootstrap(self) -> str:
        return ",".join(f"127.0.0.1:{port}" for port in self.ports)

    def __enter__(self) -> KafkaCluster:
        self.start()
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()

    def start(self) -> None:
        classpath = fetch_jars().classpath
        self._dir = tempfile.TemporaryDirectory(prefix="ferry-kafka-cluster-")
        try:
            ports = free_ports(2 * NODES)
            self.ports, controller_ports = ports[:NODES], ports[NODES:]
            BROKER_PORTS.update(self.ports)
            cluster = cluster_id()
            configs = {node: self._configure(node, controller_ports) for node in range(1, NODES + 1)}
            for node, config in configs.items():
                self._format(classpath, node, config, cluster)
            for node, config in configs.items():
                self._processes[node] = self._launch(classpath, node, config)
            for node in configs:
                self._wait_ready(node)
        except BaseException:
            self.stop()
            raise

    def pid(self, node: int) -> int:
        return self._processes[node].pid

    def running(self, node: int) -> bool:
        process = self._processes.get(node)
        return process is not None and process.poll() is None

    def kill(self, node: int) -> None:
        """SIGKILL one broker (1, 2 or 3), as a machine failing would."""
        process = self._processes.pop(node)
        process.send_signal(signal.SIGKILL)
        process.wait()

    def stop(self) -> None:
        for process in self._processes.values():
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
        for process in self._processes.values():
            try:
                process.wait(timeout=STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        self._processes.clear()
        if self._dir is not None:
            self._dir.cleanup()
            self._dir = None

    def log_tail(self, node: int) -> str:
        path = self._node_dir(node) / "broker.log"
        return path.read_text(errors="replace")[-3000:] if path.exists() else "(no log)"

    def _node_dir(self, node: int) -> Path:
        assert self._dir is not None, "the cluster is not started"
        return Path(self._dir.name) / f"node-{node}"

    def _configure(self, node: int, controller_ports: list[int]) -> Path:
        root = self._node_dir(node)
        root.mkdir(parents=True)
        (root / "log4j2.properties").write_text(log4j2_properties(root / "broker.log", "info"))
        config = root / "server.properties"
        config.write_text(node_properties(node, self.ports, controller_ports, root / "data", self._num_partitions))
        return config

    def _java_command(self, classpath: str, node: int) -> list[str]:
        config = self._node_dir(node) / "log4j2.properties"
        return [self._java, *JVM_OPTIONS, f"-Dlog4j2.configurationFile={config}", "-cp", classpath]

    def _format(self, classpath: str, node: int, config: Path, cluster: str) -> None:
        done = subprocess.run([*self._java_command(classpath, node), "kafka.tools.StorageTool", "format",
                               "-t", cluster, "-c", str(config)],
                              check=False, stdin=subprocess.DEVNULL, capture_output=True, text=True,
                              timeout=TOOL_TIMEOUT_S)
        if done.returncode != 0:
            raise KafkaStartError(f"formatting node {node} failed: {(done.stdout + done.stderr)[-2000:]}")

    def _launch(self, classpath: str, node: int, config: Path) -> subprocess.Popen[bytes]:
        with open(self._node_dir(node) / "console.log", "ab") as console:
            return subprocess.Popen([*self._java_command(classpath, node), "-Xms256m", "-Xmx512m", "kafka.Kafka",
                                     str(config)], stdin=subprocess.DEVNULL, stdout=console, stderr=subprocess.STDOUT)

    def _wait_ready(self, node: int) -> None:
        log = self._node_dir(node) / "broker.log"
        deadline = time.monotonic() + READY_TIMEOUT_S * 2
        while time.monotonic() < deadline:
            if self._processes[node].poll() is not None:
                break
            if log.exists() and READY_LINE in log.read_bytes():
                return
            time.sleep(0.1)
        raise KafkaStartError(f"Kafka node {node} did not start; its log ends:\n{self.log_tail(node)}")
