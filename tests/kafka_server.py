"""A throwaway real Kafka broker (KRaft, one node) on free loopback ports, for integration tests.

One JVM plays both broker and controller, so no ZooKeeper and no second
process. Each start formats a fresh data folder in a temporary directory, and
``stop`` removes it, so runs never see each other's topics. The broker's log
goes to ``broker.log`` in that directory (see ``log_path``), never to pytest's
output; readiness is the line ``Kafka Server started`` in that log.

Topics are created on first use (``auto.create.topics.enable``) with
``num_partitions`` partitions; ``create_topic`` makes one with another count,
through Kafka's own ``TopicCommand`` (a second JVM: about 1.5 s).

Errors: ``JavaNotFoundError`` (a ``FileNotFoundError``) when there is no
``java``, so callers may skip; ``FetchError`` when the jars cannot be fetched
and ``KafkaStartError`` when the broker will not start, which should fail.
"""

from __future__ import annotations

import base64
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import uuid
from contextlib import ExitStack
from pathlib import Path
from types import TracebackType

from tests.kafka.fetch_jars import FetchError, fetch_jars

__all__ = ["FetchError", "JavaNotFoundError", "KafkaServer", "KafkaStartError", "create_topic"]

READY_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 15.0
TOOL_TIMEOUT_S = 60.0
READY_LINE = b"Kafka Server started"
# Serial GC and the C1 compiler alone start the JVM about 0.7 s sooner on a
# two-core machine; a test broker never runs long enough to miss C2.
JVM_OPTIONS = ["-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1", "-XX:-UsePerfData"]


class JavaNotFoundError(FileNotFoundError):
    pass


class KafkaStartError(RuntimeError):
    pass


def free_ports(count: int) -> list[int]:
    """Distinct free loopback ports: every probe stays bound until all are read."""
    with ExitStack() as stack:
        probes = [stack.enter_context(socket.socket(socket.AF_INET, socket.SOCK_STREAM)) for _ in range(count)]
        for probe in probes:
            probe.bind(("127.0.0.1", 0))
        return [int(probe.getsockname()[1]) for probe in probes]


def cluster_id() -> str:
    """A random Kafka cluster id: 16 bytes as 22 base64url characters, like ``StorageTool random-uuid``."""
    while True:
        text = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        if not text.startswith("-"):  # would read as an option on a command line
            return text


def broker_properties(port: int, controller_port: int, log_dirs: Path, num_partitions: int) -> str:
    """The settings of a single node that starts fast and binds only 127.0.0.1."""
    return "\n".join([
        "process.roles=broker,controller",
        "node.id=1",
        f"controller.quorum.bootstrap.servers=127.0.0.1:{controller_port}",
        f"listeners=PLAINTEXT://127.0.0.1:{port},CONTROLLER://127.0.0.1:{controller_port}",
        f"advertised.listeners=PLAINTEXT://127.0.0.1:{port}",
        "controller.listener.names=CONTROLLER",
        "inter.broker.listener.name=PLAINTEXT",
        "listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
        f"log.dirs={log_dirs}",
        f"num.partitions={num_partitions}",
        "auto.create.topics.enable=true",
        # One node can hold only one replica of the internal topics.
        "offsets.topic.replication.factor=1",
        "offsets.topic.num.partitions=1",
        "transaction.state.log.replication.factor=1",
        "transaction.state.log.min.isr=1",
        "share.coordinator.state.topic.replication.factor=1",
        "share.coordinator.state.topic.min.isr=1",
        # Consumer groups would otherwise wait 3 s for more members to join.
        "group.initial.rebalance.delay.ms=0",
        "",
    ])  # fmt: skip


def log4j2_properties(log_file: Path, level: str) -> str:
    return "\n".join([
        "status = warn",
        "appender.file.type = File",
        "appender.file.name = file",
        f"appender.file.fileName = {log_file}",
        "appender.file.layout.type = PatternLayout",
        "appender.file.layout.pattern = [%d] %p %m (%c)%n",
        f"rootLogger.level = {level}",
        "rootLogger.appenderRef.file.ref = file",
        "",
    ])  # fmt: skip


def java_executable(java: str = "java") -> str:
    found = shutil.which(java)
    if found is None:
        raise JavaNotFoundError(f"{java} is not installed; the Kafka tests need a Java 17+ runtime")
    return found


def create_topic(bootstrap: str, topic: str, partitions: int, java: str = "java") -> None:
    """Create ``topic`` with ``partitions`` partitions on the broker at ``bootstrap``."""
    jars = fetch_jars()
    with tempfile.TemporaryDirectory(prefix="ferry-kafka-tool-") as scratch:
        config = Path(scratch) / "log4j2.properties"
        config.write_text(log4j2_properties(Path(scratch) / "tool.log", "warn"))
        arguments = [
            java_executable(java), *JVM_OPTIONS, f"-Dlog4j2.configurationFile={config}",
            "-cp", jars.classpath, "org.apache.kafka.tools.TopicCommand", "--bootstrap-server", bootstrap,
            "--create", "--topic", topic, "--partitions", str(partitions), "--replication-factor", "1",
        ]  # fmt: skip
        done = subprocess.run(
            arguments, check=False, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=TOOL_TIMEOUT_S
        )
    if done.returncode != 0:
        raise RuntimeError(f"could not create topic {topic!r}: {(done.stdout + done.stderr)[-2000:]}")


# kafka-python 3.0 closes a connection whose write buffer still holds a request only once that
# buffer has drained (``kafka.net.transport``); when its client stops first, as a busy machine
# makes likelier, the socket is left to the garbage collector, whose ResourceWarning then fails
# whichever test it lands in. ``left_client_sockets`` matches only sockets connected to a broker
# these tests started, so a socket of ferry's own left open still fails its test.
BROKER_PORTS: set[int] = set()


def left_client_sockets() -> str | None:
    """The ResourceWarning message of a client socket left open to one of these brokers."""
    if not BROKER_PORTS:
        return None
    ports = "|".join(str(port) for port in sorted(BROKER_PORTS))
    return rf"unclosed <socket\.socket .*raddr=\('127\.0\.0\.1', ({ports})\)>"


class KafkaServer:
    def __init__(self, java: str = "java", num_partitions: int = 1) -> None:
        self._java = java_executable(java)
        self._num_partitions = num_partitions
        self._dir: tempfile.TemporaryDirectory[str] | None = None
        self._process: subprocess.Popen[bytes] | None = None
        self._config: Path | None = None
        self._classpath = ""
        self.port = 0

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def pid(self) -> int:
        assert self._process is not None, "the broker is not started"
        return self._process.pid

    @property
    def log_path(self) -> Path:
        """The broker's log; read it when a test fails. Gone after ``stop``."""
        assert self._dir is not None, "the broker is not started"
        return Path(self._dir.name) / "broker.log"

    def __enter__(self) -> KafkaServer:
        self.start()
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    def create_topic(self, topic: str, partitions: int) -> None:
        create_topic(self.bootstrap, topic, partitions, java=self._java)

    def start(self) -> None:
        classpath = fetch_jars().classpath
        self._dir = tempfile.TemporaryDirectory(prefix="ferry-kafka-")
        try:
            self._start_attempts(classpath)
        except BaseException:
            self.stop()
            raise

    def restart(self, down_s: float = 0.0) -> None:
        """Stop the broker (SIGTERM), wait ``down_s``, and start it again on the
        same ports and data, as an operator's restart would."""
        assert self._process is not None and self._config is not None, "the broker is not started"
        self._terminate(self._process)
        self._process = None
        time.sleep(down_s)
        self._process = self._launch(self._classpath, self._config)
        if not self._wait_ready(after=self._log_size()):
            raise KafkaStartError(f"the Kafka broker did not restart; its log ends:\n{self._log_tail()}")

    def _log_size(self) -> int:
        try:
            return self.log_path.stat().st_size
        except FileNotFoundError:
            return 0

    def stop(self) -> None:
        if self._process is not None:
            self._terminate(self._process)
            self._process = None
        if self._dir is not None:
            self._dir.cleanup()
            self._dir = None

    def _start_attempts(self, classpath: str) -> None:
        # The ports are free when probed but another process may take one before
        # Kafka binds it; the broker then exits, and fresh ports ride that out.
        for attempt in range(3):
            self.port, controller_port = free_ports(2)
            BROKER_PORTS.add(self.port)
            config = self._write_config(attempt, controller_port)
            self._format(classpath, config)
            self._process = self._launch(classpath, config)
            if self._wait_ready():
                self._config, self._classpath = config, classpath
                return
            hung = self._process.poll() is None  # a lost port race exits; a hang will not mend
            self._terminate(self._process)
            self._process = None
            if hung:
                break
        raise KafkaStartError(f"the Kafka broker did not start; its log ends:\n{self._log_tail()}")

    def _write_config(self, attempt: int, controller_port: int) -> Path:
        root = self.log_path.parent
        (root / "log4j2.properties").write_text(log4j2_properties(self.log_path, "info"))
        config = root / "server.properties"
        properties = broker_properties(self.port, controller_port, root / f"data-{attempt}", self._num_partitions)
        config.write_text(properties)
        return config

    def _format(self, classpath: str, config: Path) -> None:
        arguments = [
            *self._java_command(classpath), "kafka.tools.StorageTool",
            "format", "--standalone", "-t", cluster_id(), "-c", str(config),
        ]  # fmt: skip
        done = subprocess.run(
            arguments, check=False, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=TOOL_TIMEOUT_S
        )
        if done.returncode != 0:
            raise KafkaStartError(f"formatting Kafka storage failed: {(done.stdout + done.stderr)[-2000:]}")

    def _launch(self, classpath: str, config: Path) -> subprocess.Popen[bytes]:
        # A few lines (JVM warnings) bypass log4j; keep them beside the log, out of pytest's output.
        with open(config.parent / "console.log", "ab") as console:
            return subprocess.Popen(
                [*self._java_command(classpath), "-Xms512m", "-Xmx1g", "kafka.Kafka", str(config)],
                stdin=subprocess.DEVNULL, stdout=console, stderr=subprocess.STDOUT,
            )  # fmt: skip

    def _java_command(self, classpath: str) -> list[str]:
        config = self.log_path.with_name("log4j2.properties")
        return [self._java, *JVM_OPTIONS, f"-Dlog4j2.configurationFile={config}", "-cp", classpath]

    def _wait_ready(self, after: int = 0) -> bool:
        assert self._process is not None
        deadline = time.monotonic() + READY_TIMEOUT_S
        offset = after
        while time.monotonic() < deadline and self._process.poll() is None:
            chunk = self._read_log(offset)
            if READY_LINE in chunk:
                return True
            # Read on from just before the end, so a line split across two reads still matches.
            offset += max(0, len(chunk) - len(READY_LINE))
            time.sleep(0.05)
        return False

    def _read_log(self, offset: int) -> bytes:
        try:
            with open(self.log_path, "rb") as log:
                log.seek(offset)
                return log.read()
        except FileNotFoundError:
            return b""

    def _terminate(self, process: subprocess.Popen[bytes]) -> None:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(timeout=STOP_TIMEOUT_S)
                return
            except subprocess.TimeoutExpired:
                process.kill()
        process.wait()

    def _log_tail(self) -> str:
        root = self.log_path.parent
        parts = [(root / name).read_text(errors="replace")[-3000:] for name in ("broker.log", "console.log")
                 if (root / name).exists()]  # fmt: skip
        return "\n".join(parts) or "(no log)"
