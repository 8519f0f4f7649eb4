"""The local Apache Kafka broker of `lambdactl stack up`: one KRaft node, broker and controller;
and a local quorum of several such nodes (`quorum_commands`), for the tests of a cluster.

Its jars come from Maven Central by the pinned coordinates in `kafka/pom.xml`: Maven resolves
them into its own repository (`~/.m2`, so only the first setup downloads, ~43 MB) and writes
the classpath, which is kept beside the stack's pid files per pom digest. The node's
`server.properties` is written at every start (a free controller port each time: the voter set
is static, so only its id is persistent); its log directory is formatted on first start.
"""

from __future__ import annotations

import base64
import hashlib
import re
import socket
import subprocess
import uuid
from dataclasses import dataclass
from pathlib import Path

from shared.errors import ServiceUnavailableError

KAFKA_FILES = Path(__file__).with_name("kafka")
POM = KAFKA_FILES / "pom.xml"
LOG4J = KAFKA_FILES / "log4j2.properties"
MAIN_CLASS = "kafka.Kafka"
STORAGE_TOOL = "kafka.tools.StorageTool"
NODE_ID = 1
JVM_OPTIONS = (
    "-Xms256m",
    "-Xmx1g",
    "-XX:+UseG1GC",
    "-XX:MaxGCPauseMillis=20",
    "-XX:InitiatingHeapOccupancyPercent=35",
    "-XX:+ExplicitGCInvokesConcurrent",
    "-Djava.awt.headless=true",
)
RESOLVE_TIMEOUT_S = 900


def kafka_version() -> str:
    match = re.search(r"<kafka\.version>([^<]+)</kafka\.version>", POM.read_text())
    if match is None:
        raise ServiceUnavailableError(f"{POM} names no <kafka.version>")
    return match.group(1)


def classpath(mvn: str, cache_dir: Path) -> str:
    """The broker's classpath, resolved by Maven once per pom content."""
    digest = hashlib.sha256(POM.read_bytes()).hexdigest()[:16]
    cached = cache_dir / f"kafka-classpath-{digest}.txt"
    if cached.exists():
        jars = cached.read_text().strip()
        if jars and all(Path(jar).exists() for jar in jars.split(":")):
            return jars
    partial = cached.with_suffix(".part")
    command = [
        mvn,
        "-B",
        "-q",
        "-f",
        str(POM),
        "dependency:build-classpath",
        f"-Dmdep.outputFile={partial}",
    ]
    try:
        done = subprocess.run(
            command, capture_output=True, text=True, timeout=RESOLVE_TIMEOUT_S, check=False
        )
    except subprocess.TimeoutExpired as exc:
        raise ServiceUnavailableError(
            f"Maven did not resolve Apache Kafka {kafka_version()} within {RESOLVE_TIMEOUT_S} s; "
            "check that this machine reaches Maven Central (or a mirror in ~/.m2/settings.xml)"
        ) from exc
    if done.returncode != 0 or not partial.exists():
        output = "\n".join((done.stdout + done.stderr).strip().splitlines()[-15:])
        raise ServiceUnavailableError(
            f"could not resolve Apache Kafka {kafka_version()}'s jars from Maven Central "
            f"(`{' '.join(command)}` exited {done.returncode}). The first `stack up` downloads "
            "them (~43 MB) into ~/.m2: give this machine access to Maven Central or a mirror "
            "(~/.m2/settings.xml), or copy a ~/.m2/repository that has them, or point "
            f"LAMBDA_KAFKA__BOOTSTRAP_SERVERS at a running Kafka.\n{output}"
        )
    partial.replace(cached)
    return cached.read_text().strip()


def broker_command(java: str, jars: str, data: Path, host: str, port: int) -> list[str]:
    """Write the node's configuration, format its storage on first start, return its command."""
    controller = _free_port(host)
    node = KraftNode(NODE_ID, port, controller, data)
    return node.command(java, jars, host, f"{NODE_ID}@{host}:{controller}", _cluster_id(), 1)


def quorum_commands(
    java: str, jars: str, root: Path, host: str, ports: list[int]
) -> list[list[str]]:
    """A cluster of `len(ports)` KRaft nodes, each broker and controller, in `root/node-<id>`
    (formatted afresh): one command per node, listening on its port of `ports`. Topics and
    the internal ones get Kafka's production defaults for such a cluster: replication factor
    up to 3 and `min.insync.replicas` up to 2, so with `acks=all` one node may fail without
    losing or refusing an acknowledged write."""
    nodes = [
        KraftNode(n, port, _free_port(host), root / f"node-{n}")
        for n, port in enumerate(ports, start=1)
    ]
    voters = ",".join(f"{node.node_id}@{host}:{node.controller_port}" for node in nodes)
    cluster = _cluster_id()
    return [node.command(java, jars, host, voters, cluster, len(nodes)) for node in nodes]


@dataclass(frozen=True)
class KraftNode:
    """One KRaft node (broker and controller) of the quorum `voters` names."""

    node_id: int
    port: int
    controller_port: int
    data: Path

    def command(
        self, java: str, jars: str, host: str, voters: str, cluster_id: str, nodes: int
    ) -> list[str]:
        """Write the node's configuration, format its storage on first start (with
        `cluster_id`), return its command."""
        self.data.mkdir(parents=True, exist_ok=True)
        properties = self.data / "server.properties"
        properties.write_text(self._properties(host, voters, nodes))
        if not (self.data / "meta.properties").exists():
            fmt = [*_java(java, jars), STORAGE_TOOL, "format", "-t", cluster_id, "-c"]
            done = subprocess.run(
                [*fmt, str(properties)], capture_output=True, text=True, check=False
            )
            if done.returncode != 0:
                raise ServiceUnavailableError(
                    f"formatting the Kafka log directory {self.data} failed (exit "
                    f"{done.returncode}):\n{(done.stdout + done.stderr).strip()}"
                )
        return [*_java(java, jars), MAIN_CLASS, str(properties)]

    def _properties(self, host: str, voters: str, nodes: int) -> str:
        replicas, min_isr = str(min(nodes, 3)), str(min(nodes, 2))
        settings = {
            "process.roles": "broker,controller",
            "node.id": str(self.node_id),
            "controller.quorum.voters": voters,
            "listeners": f"PLAINTEXT://{host}:{self.port},CONTROLLER://{host}:{self.controller_port}",
            "advertised.listeners": f"PLAINTEXT://{host}:{self.port}",
            "controller.listener.names": "CONTROLLER",
            "inter.broker.listener.name": "PLAINTEXT",
            "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
            "log.dirs": str(self.data),
            # The platform creates its topics (partition counts checked against the config).
            "auto.create.topics.enable": "false",
            # Topics the platform creates take these (no replication factor of its own), and
            # the internal topics cannot have more replicas than there are nodes.
            "default.replication.factor": replicas,
            "min.insync.replicas": min_isr,
            "offsets.topic.replication.factor": replicas,
            "transaction.state.log.replication.factor": replicas,
            "transaction.state.log.min.isr": min_isr,
            "share.coordinator.state.topic.replication.factor": replicas,
            "share.coordinator.state.topic.min.isr": min_isr,
            # A lone local worker gets its partitions at once (Kafka's own dev configs do this).
            "group.initial.rebalance.delay.ms": "0",
        }
        lines = [f"{name}={value}" for name, value in settings.items()]
        return "# Written by `lambdactl` at every start.\n" + "\n".join(lines) + "\n"


def _java(java: str, jars: str) -> list[str]:
    return [java, *JVM_OPTIONS, f"-Dlog4j2.configurationFile={LOG4J}", "-cp", jars]


def _free_port(host: str) -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind((host, 0))
        port: int = probe.getsockname()[1]
        return port


def _cluster_id() -> str:
    """A Kafka cluster id: 16 random bytes in unpadded URL-safe base64, never starting with
    '-' (Kafka's own `Uuid.randomUuid` avoids those, as they read as command-line flags)."""
    while True:
        text = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        if not text.startswith("-"):
            return text
