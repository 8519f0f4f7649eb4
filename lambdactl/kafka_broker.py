"""The local Apache Kafka broker of `lambdactl stack up`: one KRaft node, broker and controller.

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
    data.mkdir(parents=True, exist_ok=True)
    properties = data / "server.properties"
    properties.write_text(_server_properties(data, host, port, _free_port(host)))
    if not (data / "meta.properties").exists():
        fmt = [*_java(java, jars), STORAGE_TOOL, "format", "-t", _cluster_id(), "-c"]
        done = subprocess.run([*fmt, str(properties)], capture_output=True, text=True, check=False)
        if done.returncode != 0:
            raise ServiceUnavailableError(
                f"formatting the Kafka log directory {data} failed (exit {done.returncode}):\n"
                f"{(done.stdout + done.stderr).strip()}"
            )
    return [*_java(java, jars), MAIN_CLASS, str(properties)]


def _java(java: str, jars: str) -> list[str]:
    return [java, *JVM_OPTIONS, f"-Dlog4j2.configurationFile={LOG4J}", "-cp", jars]


def _server_properties(data: Path, host: str, port: int, controller_port: int) -> str:
    settings = {
        "process.roles": "broker,controller",
        "node.id": str(NODE_ID),
        "controller.quorum.voters": f"{NODE_ID}@{host}:{controller_port}",
        "listeners": f"PLAINTEXT://{host}:{port},CONTROLLER://{host}:{controller_port}",
        "advertised.listeners": f"PLAINTEXT://{host}:{port}",
        "controller.listener.names": "CONTROLLER",
        "inter.broker.listener.name": "PLAINTEXT",
        "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
        "log.dirs": str(data),
        # The platform creates its topics (partition counts checked against the config).
        "auto.create.topics.enable": "false",
        # One node: the internal topics cannot have more replicas than that.
        "offsets.topic.replication.factor": "1",
        "transaction.state.log.replication.factor": "1",
        "transaction.state.log.min.isr": "1",
        "share.coordinator.state.topic.replication.factor": "1",
        "share.coordinator.state.topic.min.isr": "1",
        # A lone local worker gets its partitions at once (Kafka's own dev configs do this).
        "group.initial.rebalance.delay.ms": "0",
    }
    lines = [f"{name}={value}" for name, value in settings.items()]
    return "# Written by `lambdactl stack up` at every start.\n" + "\n".join(lines) + "\n"


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
