"""`topics create` / `topics check` against the real broker: a source topic stamped by the
producers' clocks (CreateTime) is refused, and `topics create` gives an existing one the
broker's clock (rule 1 in docs/semantics.md)."""

from __future__ import annotations

import pytest
from confluent_kafka.admin import (
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    NewTopic,
    ResourceType,
)

from shared.errors import TopicMismatchError
from shared.kafka import check_topics, create_topics
from tests.conftest import Platform

pytestmark = [pytest.mark.services, pytest.mark.timeout(120)]


def _timestamp_type(admin: AdminClient, topic: str) -> str | None:
    resource = ConfigResource(ResourceType.TOPIC, topic)
    entries = admin.describe_configs([resource], request_timeout=10)[resource].result()
    return entries["message.timestamp.type"].value


def test_a_create_time_source_topic_is_refused_until_topics_create_sets_the_broker_clock(
    platform: Platform,
) -> None:
    settings = platform.settings
    source = settings.sources[0]
    admin = AdminClient({"bootstrap.servers": settings.kafka.bootstrap_servers})
    new = NewTopic(source.topic, num_partitions=source.partitions, replication_factor=1)
    admin.create_topics([new])[source.topic].result(timeout=30)

    created = create_topics(settings)
    assert source.topic not in created
    assert _timestamp_type(admin, source.topic) == "LogAppendTime"
    assert _timestamp_type(admin, source.dlq_topic) == "CreateTime"  # side topics keep theirs
    check_topics(settings)

    # a topic switched back by hand is refused again, with what to do
    entry = ConfigEntry(
        "message.timestamp.type", "CreateTime", incremental_operation=AlterConfigOpType.SET
    )
    resource = ConfigResource(ResourceType.TOPIC, source.topic, incremental_configs=[entry])
    admin.incremental_alter_configs([resource])[resource].result()
    with pytest.raises(TopicMismatchError) as refused:
        check_topics(settings)
    message = str(refused.value)
    assert f"topic {source.topic!r} has message.timestamp.type=CreateTime" in message
    assert "`lambdactl topics create`" in message
