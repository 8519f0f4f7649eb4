"""Fixtures for the Kafka broker conformance suite.

The broker address comes from ``LAMBDA_KAFKA__BOOTSTRAP_SERVERS`` (default ``127.0.0.1:9092``).
A loopback address gets the local stack started first (as ``lambdactl stack up`` would), so the
suite runs on a fresh machine; a remote cluster is used as it is. An unreachable broker is a
test failure, never a skip: an operator running this suite must not mistake "nothing was
checked" for "the cluster is fine".
"""

from __future__ import annotations

import contextlib
import os
import uuid
from collections.abc import Iterator

import pytest
from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient, NewTopic

from ._kafka import ChildClient, ClientFactory, TopicFactory, eventually

DEFAULT_BOOTSTRAP = "127.0.0.1:9092"
CONNECT_TIMEOUT_S = 10.0


@pytest.fixture(scope="session")
def kafka_bootstrap(request: pytest.FixtureRequest) -> str:
    """The bootstrap servers of the broker under test; fails loudly if it is unreachable."""
    bootstrap = os.environ.get("LAMBDA_KAFKA__BOOTSTRAP_SERVERS", DEFAULT_BOOTSTRAP)
    host = bootstrap.split(",")[0].rsplit(":", 1)[0]
    if host in ("127.0.0.1", "localhost", "::1", "[::1]"):
        request.getfixturevalue("stack")
    probe = AdminClient(
        {
            "bootstrap.servers": bootstrap,
            "socket.connection.setup.timeout.ms": 5000,
            "log_level": 0,  # the failure below says it all; no connect-refused spam
        }
    )
    error: KafkaException | None = None
    try:
        metadata = probe.list_topics(timeout=CONNECT_TIMEOUT_S)
    except KafkaException as exc:
        error = exc
    if error is not None:
        pytest.fail(
            f"Kafka broker at {bootstrap!r} is unreachable within {CONNECT_TIMEOUT_S:.0f} s "
            f"({error}). Start the local stack with `lambdactl stack up`, or point "
            "LAMBDA_KAFKA__BOOTSTRAP_SERVERS at the cluster under test.",
            pytrace=False,
        )
    if not metadata.brokers:
        pytest.fail(
            f"Kafka at {bootstrap!r} answered but advertises no brokers. "
            "Start the local stack with `lambdactl stack up`.",
            pytrace=False,
        )
    return bootstrap


@pytest.fixture(scope="session")
def admin(kafka_bootstrap: str) -> AdminClient:
    return AdminClient({"bootstrap.servers": kafka_bootstrap})


@pytest.fixture
def create_topic(admin: AdminClient, request: pytest.FixtureRequest) -> Iterator[TopicFactory]:
    """Factory creating uniquely named topics (uuid suffix); they are deleted at teardown."""
    created: list[str] = []

    def _create(partitions: int = 1, config: dict[str, str] | None = None) -> str:
        base = request.node.name.replace("[", "-").replace("]", "").replace("_", "-")[:60]
        name = f"conformance-{base}-{uuid.uuid4().hex[:12]}"
        topic_config = {"retention.ms": "-1", **(config or {})}
        futures = admin.create_topics(
            [NewTopic(name, num_partitions=partitions, replication_factor=-1, config=topic_config)],
            operation_timeout=10,
            request_timeout=15,
        )
        futures[name].result()
        created.append(name)
        # CreateTopics answers once the controller has the topic; the broker serving requests
        # learns it from the metadata log a moment later (meanwhile e.g. DescribeConfigs says
        # UNKNOWN_TOPIC_OR_PART). Wait until the broker reports every partition with a leader.
        eventually(
            lambda: _leaders(admin, name),
            lambda leaders: len(leaders) == partitions and min(leaders) >= 0,
            timeout=15,
            what=f"topic {name} metadata with a leader for each of {partitions} partition(s)",
        )
        return name

    yield _create

    if created:  # best effort: a broker refusing deletes must not fail the suite
        with contextlib.suppress(Exception):
            for future in admin.delete_topics(created, operation_timeout=10).values():
                with contextlib.suppress(Exception):
                    future.result()


def _leaders(admin: AdminClient, topic: str) -> list[int]:
    """The leader of each partition of ``topic`` per the broker's metadata ([] while unknown)."""
    try:
        metadata = admin.list_topics(topic, timeout=5).topics.get(topic)
    except KafkaException:
        return []
    if metadata is None or metadata.error is not None:
        return []
    return [p.leader if p.error is None else -1 for p in metadata.partitions.values()]


@pytest.fixture
def spawn_client() -> Iterator[ClientFactory]:
    """Start ``_clients.py`` clients (``spawn_client(mode, **args)``); killed at teardown."""
    children: list[ChildClient] = []

    def _spawn(mode: str, **args: object) -> ChildClient:
        child = ChildClient(mode, **args)
        children.append(child)
        return child

    yield _spawn
    for child in children:
        child.kill()
