"""A local Apache Kafka cluster of three KRaft nodes (each broker and controller), for the
tests that run the platform on one: the jars and Java of the local stack, free ports, a
directory of its own; every node killed on exit."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path

from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient

from lambdactl.kafka_broker import quorum_commands
from lambdactl.stack import kafka_runtime
from shared.config import Settings
from tests.serving.api_process import free_port

HOST = "127.0.0.1"


@dataclass
class KafkaCluster:
    bootstrap: str
    nodes: dict[int, subprocess.Popen[bytes]]
    """Node id -> its process."""

    def admin(self) -> AdminClient:
        return AdminClient({"bootstrap.servers": self.bootstrap, "log_level": 0})

    def kill(self, node_id: int) -> None:
        """kill -9 of one node."""
        os.kill(self.nodes[node_id].pid, signal.SIGKILL)
        self.nodes[node_id].wait(10)


@contextmanager
def local_kafka_cluster(directory: Path, nodes: int = 3) -> Iterator[KafkaCluster]:
    """The cluster once every node is a live broker in its metadata."""
    java, jars = kafka_runtime(Settings())
    ports = [free_port() for _ in range(nodes)]
    commands = quorum_commands(java, jars, directory, HOST, ports)
    with ExitStack() as running:
        processes: dict[int, subprocess.Popen[bytes]] = {}
        for node_id, command in enumerate(commands, start=1):
            log = (directory / f"node-{node_id}.log").open("wb")
            running.callback(log.close)
            process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
            running.callback(_kill, process)
            processes[node_id] = process
        cluster = KafkaCluster(",".join(f"{HOST}:{port}" for port in ports), processes)
        _wait_for_brokers(cluster, nodes, directory)
        yield cluster


def _wait_for_brokers(cluster: KafkaCluster, nodes: int, directory: Path) -> None:
    admin = cluster.admin()
    deadline = time.monotonic() + 120
    seen = 0
    while time.monotonic() < deadline:
        dead = [n for n, p in cluster.nodes.items() if p.poll() is not None]
        assert not dead, f"Kafka nodes {dead} exited at start; see {directory}/node-*.log"
        try:
            seen = len(admin.list_topics(timeout=5).brokers)
        except KafkaException:
            seen = 0
        if seen == nodes:
            return
        time.sleep(0.5)
    raise AssertionError(
        f"the local Kafka cluster showed {seen} of {nodes} brokers after 120 s; "
        f"see {directory}/node-*.log"
    )


def _kill(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        process.kill()
        process.wait(10)
