"""A throwaway real Redis Cluster for integration tests: three masters with a replica each
(``redis-server --cluster-enabled yes`` x 6, joined by ``redis-cli --cluster create
--cluster-replicas 1``), every node and cluster bus on a free loopback port."""

from __future__ import annotations

import shutil
import subprocess
import time
from dataclasses import dataclass
from types import TracebackType

import redis

from tests.redis_server import RedisServer, command, free_port

MASTERS = 3
# How long a master may be unreachable before its replica is promoted: short, so that a test
# killing one waits a second or two, not the default 15.
NODE_TIMEOUT_MS = 1000
READY_TIMEOUT_S = 30.0


@dataclass(frozen=True)
class SlotMove:
    """A slot whose keys are on their new master, which the cluster has yet to be told."""

    slot: int
    target_id: bytes


class ClusterNodeServer(RedisServer):
    def __init__(self) -> None:
        super().__init__(extra=())
        self.bus_port = 0

    def start(self) -> None:
        # The bus port is chosen too (Redis's default, port + 10000, may be taken or past 65535).
        self.bus_port = free_port()
        self._extra = ("--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
                       "--cluster-node-timeout", str(NODE_TIMEOUT_MS), "--cluster-port", str(self.bus_port),
                       "--appendfsync", "everysec",
                       # A replica's first full copy starts at once, not 5 s after it asks: only a
                       # replica that has had its copy can take over from its master.
                       "--repl-diskless-sync-delay", "0")
        super().start()


class RedisCluster:
    """``url`` is ``redis+cluster://`` naming every node, as ferry takes it."""

    def __init__(self) -> None:
        if shutil.which("redis-cli") is None:
            raise FileNotFoundError("redis-cli is not installed")
        self.nodes = [ClusterNodeServer() for _ in range(MASTERS * 2)]

    @property
    def url(self) -> str:
        return "redis+cluster://" + ",".join(f"127.0.0.1:{node.port}" for node in self.nodes)

    def __enter__(self) -> RedisCluster:
        try:
            for node in self.nodes:
                node.start()
            self._create()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()

    def stop(self) -> None:
        for node in self.nodes:
            node.stop()

    def _create(self) -> None:
        addresses = [f"127.0.0.1:{node.port}" for node in self.nodes]
        result = subprocess.run(["redis-cli", "--cluster", "create", *addresses, "--cluster-replicas", "1",
                                 "--cluster-yes"], capture_output=True, text=True, timeout=60)
        if result.returncode != 0:
            raise RuntimeError(f"redis-cli --cluster create failed:\n{result.stdout}\n{result.stderr}")
        self.wait_ok()

    def wait_ok(self, timeout_s: float = READY_TIMEOUT_S) -> None:
        """Until every live node says cluster_state:ok and knows all three masters, and every
        live replica is linked to its master (one that never was cannot be promoted)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if all(self._ok(node) for node in self.nodes if node.running):
                return
            time.sleep(0.1)
        raise TimeoutError(f"the Redis Cluster was not ok within {timeout_s} s")

    @staticmethod
    def _ok(node: ClusterNodeServer) -> bool:
        try:
            info = _bulk(node.port, "CLUSTER", "INFO")
        except OSError:
            return False
        if "cluster_state:ok" not in info or f"cluster_size:{MASTERS}" not in info:
            return False
        try:
            replication = _bulk(node.port, "INFO", "replication")
        except OSError:
            return False
        return "role:slave" not in replication or "master_link_status:up" in replication

    def masters(self) -> list[ClusterNodeServer]:
        """The live nodes that serve slots as masters, as a live node sees the cluster."""
        return [node for node, _ in self._master_slots()]

    def master_of(self, key: str) -> ClusterNodeServer:
        live = next(node for node in self.nodes if node.running)
        slot = int(command(live.port, "CLUSTER", "KEYSLOT", key).lstrip(b":"))
        for node, spans in self._master_slots():
            if any(_covers(span, slot) for span in spans):
                return node
        raise LookupError(f"no master serves slot {slot} ({key!r})")

    def _master_slots(self) -> list[tuple[ClusterNodeServer, list[str]]]:
        live = next(node for node in self.nodes if node.running)
        by_port = {node.port: node for node in self.nodes}
        found = []
        for line in _bulk(live.port, "CLUSTER", "NODES").splitlines():
            fields = line.split()
            port = int(fields[1].split("@")[0].rpartition(":")[2])
            if "master" in fields[2].split(",") and "fail" not in fields[2] and len(fields) > 8:
                if port in by_port and by_port[port].running:
                    found.append((by_port[port], fields[8:]))
        return found

    def move_slot_of(self, key: str, target: ClusterNodeServer) -> None:
        """Move the slot holding ``key`` to ``target``, as ``redis-cli --cluster reshard`` does:
        the slot is marked migrating and importing, its keys MIGRATEd in batches (clients are
        sent ASK meanwhile), then every master learns its new owner (MOVED from then on)."""
        self.hand_over(self.migrate_keys_of(key, target))

    def migrate_keys_of(self, key: str, target: ClusterNodeServer) -> SlotMove:
        """The first half of ``move_slot_of``: afterwards the old master answers ASK for the slot's keys."""
        source = self.master_of(key)
        if source is target:
            raise ValueError(f"{key!r} is on port {target.port} already")
        with redis.Redis(port=source.port) as src, redis.Redis(port=target.port) as dst:
            slot = int(src.execute_command("CLUSTER", "KEYSLOT", key))
            src_id, dst_id = src.execute_command("CLUSTER", "MYID"), dst.execute_command("CLUSTER", "MYID")
            dst.execute_command("CLUSTER", "SETSLOT", slot, "IMPORTING", src_id)
            src.execute_command("CLUSTER", "SETSLOT", slot, "MIGRATING", dst_id)
            while keys := src.execute_command("CLUSTER", "GETKEYSINSLOT", slot, 10):
                src.execute_command("MIGRATE", "127.0.0.1", target.port, "", 0, 5000, "KEYS", *keys)
        return SlotMove(slot, dst_id)

    def hand_over(self, move: SlotMove) -> None:
        """The second half of ``move_slot_of``: every master learns the slot's new owner."""
        for node in self.masters():
            with redis.Redis(port=node.port) as client:
                client.execute_command("CLUSTER", "SETSLOT", move.slot, "NODE", move.target_id)

    def flush(self) -> None:
        """Empty every master (replicas follow)."""
        for node in self.masters():
            if command(node.port, "FLUSHALL") != b"+OK":
                raise RuntimeError(f"FLUSHALL failed on port {node.port}")


def flush_cluster(url: str) -> None:
    """Empty every master of the cluster a ``redis+cluster://`` URL names (replicas refuse
    writes, and follow their masters)."""
    from broker.redis_url import parse_redis_url

    for _, port in parse_redis_url(url).nodes:
        try:
            reply = command(port, "FLUSHALL")
        except OSError:
            continue  # a node a test killed
        if reply != b"+OK" and not reply.startswith(b"-READONLY"):
            raise RuntimeError(f"FLUSHALL on port {port}: {reply!r}")


def _covers(span: str, slot: int) -> bool:
    if span.startswith("["):  # a slot being migrated
        return False
    low, _, high = span.partition("-")
    return int(low) <= slot <= int(high or low)


def _bulk(port: int, *words: str, timeout_s: float = 2.0) -> str:
    """One command whose reply is a bulk string, read whole."""
    import socket

    with socket.create_connection(("127.0.0.1", port), timeout=timeout_s) as conn:
        conn.sendall(" ".join(words).encode() + b"\r\n")
        data = b""
        while b"\r\n" not in data:
            chunk = conn.recv(65536)
            if not chunk:
                raise ConnectionError(f"port {port} closed the connection")
            data += chunk
        head, _, rest = data.partition(b"\r\n")
        if not head.startswith(b"$"):
            raise ConnectionError(f"port {port}: {head!r}")
        size = int(head[1:])
        while len(rest) < size + 2:
            chunk = conn.recv(65536)
            if not chunk:
                raise ConnectionError(f"port {port} closed the connection")
            rest += chunk
        return rest[:size].decode()
