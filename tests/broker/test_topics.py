"""Topic administration: the platform creates its source topics itself (retention forever)."""

from __future__ import annotations

import pytest
from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import AdminClient, ConfigResource, NewTopic, ResourceType

from ._kafka import TopicFactory, eventually

pytestmark = pytest.mark.timeout(30)


def _topic_config(admin: AdminClient, topic: str) -> dict[str, str | None]:
    """The topic's configuration. On a cluster, DescribeConfigs goes to any broker, and one
    that has not yet replayed the topic's creation from the metadata log answers
    UNKNOWN_TOPIC_OR_PART, a retriable error that clients retry: so does this."""
    resource = ConfigResource(ResourceType.TOPIC, topic)

    def describe() -> dict[str, str | None] | KafkaException:
        try:
            entries = admin.describe_configs([resource], request_timeout=10)[resource].result()
        except KafkaException as exc:
            if exc.args[0].code() != KafkaError.UNKNOWN_TOPIC_OR_PART:
                raise
            return exc
        return {name: entry.value for name, entry in entries.items()}

    config, _ = eventually(
        describe, lambda got: isinstance(got, dict), timeout=15, what=f"config of {topic}"
    )
    assert isinstance(config, dict)
    return config


def test_create_topic_with_partitions_and_infinite_retention(
    admin: AdminClient, create_topic: TopicFactory
) -> None:
    """AdminClient creates a 4-partition topic with retention.ms=-1 and the broker reports both."""
    topic = create_topic(partitions=4, config={"retention.ms": "-1"})

    config = _topic_config(admin, topic)
    assert config.get("retention.ms") == "-1", (
        f"retention.ms is {config.get('retention.ms')!r}: the topic is the master dataset and "
        "must keep records forever"
    )

    metadata = admin.list_topics(topic, timeout=10).topics[topic]
    assert metadata.error is None, f"topic metadata error: {metadata.error}"
    assert sorted(metadata.partitions) == [0, 1, 2, 3]
    for partition in metadata.partitions.values():
        assert partition.error is None, f"partition {partition.id}: {partition.error}"
        assert partition.leader >= 0, f"partition {partition.id} has no leader"


def test_topic_keeps_producer_create_time(admin: AdminClient, create_topic: TopicFactory) -> None:
    """Event validity compares event time with the record's CreateTime: the broker must keep it."""
    topic = create_topic()
    config = _topic_config(admin, topic)
    assert config.get("message.timestamp.type") == "CreateTime", (
        f"message.timestamp.type is {config.get('message.timestamp.type')!r}; "
        "LogAppendTime would overwrite the producer's CreateTime"
    )


def test_creating_an_existing_topic_reports_topic_already_exists(
    admin: AdminClient, create_topic: TopicFactory
) -> None:
    """The platform creates topics idempotently: a second create must say TOPIC_ALREADY_EXISTS."""
    topic = create_topic(partitions=2)
    futures = admin.create_topics(
        [NewTopic(topic, num_partitions=2, replication_factor=-1)], request_timeout=10
    )
    with pytest.raises(KafkaException) as excinfo:
        futures[topic].result()
    assert excinfo.value.args[0].code() == KafkaError.TOPIC_ALREADY_EXISTS
    # ...and the existing topic is untouched.
    assert len(admin.list_topics(topic, timeout=10).topics[topic].partitions) == 2
