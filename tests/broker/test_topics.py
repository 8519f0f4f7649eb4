"""Topic administration: the platform creates its source topics itself (retention forever,
the broker's clock as their timestamps)."""

from __future__ import annotations

import time

import pytest
from confluent_kafka import TIMESTAMP_LOG_APPEND_TIME, KafkaError, KafkaException, TopicPartition
from confluent_kafka.admin import (
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    NewTopic,
    ResourceType,
)

from ._kafka import TopicFactory, eventually, make_consumer, make_producer, produce_all, read_until

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


def test_log_append_time_stamps_records_with_the_broker_clock(
    admin: AdminClient, create_topic: TopicFactory, kafka_bootstrap: str
) -> None:
    """Source topics bound event times by the broker's clock (rule 1 in docs/semantics.md):
    with message.timestamp.type=LogAppendTime the broker replaces a producer's CreateTime
    (here a day ahead) with its own clock, and consumers read it as a log-append time."""
    topic = create_topic(config={"message.timestamp.type": "LogAppendTime"})
    assert _topic_config(admin, topic).get("message.timestamp.type") == "LogAppendTime"
    before_ms = int(time.time() * 1000)
    produce_all(
        make_producer(kafka_bootstrap),
        topic,
        [{"value": b"{}", "timestamp": before_ms + 86_400_000}],
    )
    after_ms = int(time.time() * 1000)
    consumer = make_consumer(kafka_bootstrap)
    try:
        consumer.assign([TopicPartition(topic, 0, 0)])
        (message,) = read_until(consumer, {(topic, 0): 1})
    finally:
        consumer.close()
    kind, stamped = message.timestamp()
    assert kind == TIMESTAMP_LOG_APPEND_TIME
    assert before_ms - 1_000 <= stamped <= after_ms + 1_000


def test_an_existing_topic_takes_log_append_time_by_an_incremental_alter(
    admin: AdminClient, create_topic: TopicFactory
) -> None:
    """`lambdactl topics create` sets LogAppendTime on an existing source topic with an
    incremental alter, leaving its other configs (here retention) as they were."""
    topic = create_topic(config={"retention.ms": "-1"})
    assert _topic_config(admin, topic).get("message.timestamp.type") == "CreateTime"
    entry = ConfigEntry(
        "message.timestamp.type", "LogAppendTime", incremental_operation=AlterConfigOpType.SET
    )
    resource = ConfigResource(ResourceType.TOPIC, topic, incremental_configs=[entry])
    admin.incremental_alter_configs([resource])[resource].result()
    config, _ = eventually(
        lambda: _topic_config(admin, topic),
        lambda got: got.get("message.timestamp.type") == "LogAppendTime",
        timeout=15,
        what=f"LogAppendTime on {topic}",
    )
    assert config.get("retention.ms") == "-1"


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
