"""Kafka helpers used by more than one layer: topic administration and client settings."""

from __future__ import annotations

import time
from dataclasses import dataclass

from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient, NewTopic

from shared.config import Settings
from shared.errors import ServiceUnavailableError, TopicMismatchError


@dataclass(frozen=True)
class TopicSpec:
    name: str
    partitions: int
    config: dict[str, str]


def platform_topics(settings: Settings) -> list[TopicSpec]:
    """Source topics keep their history forever (the master dataset); `.dlq`/`.late` too."""
    forever = {"retention.ms": "-1"}
    specs = []
    for source in settings.sources:
        specs.append(TopicSpec(source.topic, source.partitions, forever))
        specs.append(TopicSpec(source.dlq_topic, source.partitions, forever))
        specs.append(TopicSpec(source.late_topic, source.partitions, forever))
    return specs


def admin_client(settings: Settings) -> AdminClient:
    return AdminClient({"bootstrap.servers": settings.kafka.bootstrap_servers})


def live_partition_counts(admin: AdminClient, timeout_s: float = 10.0) -> dict[str, int]:
    try:
        metadata = admin.list_topics(timeout=timeout_s)
    except KafkaException as exc:
        raise ServiceUnavailableError(
            f"Kafka is not reachable ({exc}); start it with `lambdactl stack up` or set "
            "LAMBDA_KAFKA__BOOTSTRAP_SERVERS"
        ) from exc
    return {name: len(topic.partitions) for name, topic in metadata.topics.items()}


def create_topics(settings: Settings) -> list[str]:
    """Create the missing platform topics; returns the names created. Then checks them all."""
    admin = admin_client(settings)
    live = live_partition_counts(admin)
    missing = [spec for spec in platform_topics(settings) if spec.name not in live]
    if missing:
        futures = admin.create_topics(
            [NewTopic(s.name, num_partitions=s.partitions, config=s.config) for s in missing]
        )
        for future in futures.values():
            try:
                future.result()
            except KafkaException as exc:
                if "TOPIC_ALREADY_EXISTS" not in str(exc):
                    raise
        _wait_for_leaders(admin, [spec.name for spec in missing])
    check_topics(settings)
    return [spec.name for spec in missing]


def _wait_for_leaders(admin: AdminClient, topics: list[str], timeout_s: float = 30.0) -> None:
    """A created topic is usable once every partition has a leader: the controller answers
    the create before the brokers' metadata shows it."""
    deadline = time.monotonic() + timeout_s
    while True:
        metadata = admin.list_topics(timeout=10).topics
        waiting = [
            name
            for name in topics
            if name not in metadata
            or metadata[name].error is not None
            or any(p.leader < 0 for p in metadata[name].partitions.values())
        ]
        if not waiting:
            return
        if time.monotonic() > deadline:
            raise ServiceUnavailableError(
                f"topics {waiting} were created but have no leader after {timeout_s:.0f} s; "
                "check the brokers (`lambdactl stack status`, the broker log)"
            )
        time.sleep(0.1)


def check_topics(settings: Settings) -> None:
    """Refuse to run when a live topic's partition count differs from the config."""
    live = live_partition_counts(admin_client(settings))
    problems = []
    for spec in platform_topics(settings):
        count = live.get(spec.name)
        if count is None:
            problems.append(f"topic {spec.name!r} does not exist (run `lambdactl topics create`)")
        elif count != spec.partitions:
            problems.append(
                f"topic {spec.name!r} has {count} partitions but the config says "
                f"{spec.partitions}; fix `partitions` in the config or recreate the topic"
            )
    if problems:
        raise TopicMismatchError("; ".join(problems))
