"""Reading `[start, end)` slices of a partition on the real broker: exactly the slice's
records, with the client's default fetch and response size limits, from a partition far larger
than one response may carry."""

from __future__ import annotations

import pytest
from confluent_kafka import Producer

from batch_layer.kafka_source import Slice, read_slice
from shared.kafka import client_config, create_topics
from tests.conftest import Platform

pytestmark = [pytest.mark.services, pytest.mark.timeout(180)]

_RECORD_BYTES = 100_000
_RECORDS = 1_100
"""110 MB in one partition: more than librdkafka's default 100 MB response limit, so the read
works only because the broker honours the fetch size limits (`tests/broker` checks that)."""


def test_slices_of_a_partition_larger_than_the_default_response_limit(
    platform: Platform,
) -> None:
    create_topics(platform.settings)
    topic = platform.settings.sources[0].topic
    producer = Producer(  # idempotent: a retried batch keeps its place, so offset i holds i
        {
            "bootstrap.servers": platform.settings.kafka.bootstrap_servers,
            "linger.ms": 20,
            "enable.idempotence": True,
        }
    )
    for i in range(_RECORDS):
        producer.produce(topic, str(i).encode().ljust(_RECORD_BYTES, b" "), partition=0)
        producer.poll(0)
    assert producer.flush(60) == 0
    client = client_config(platform.settings.kafka)

    def read(start: int, end: int) -> list[tuple[int, int]]:
        return [
            (offset, int(value))
            for records in read_slice(client, topic, Slice(0, start, end))
            for offset, value in zip(records.offsets, records.values, strict=True)
            if value is not None
        ]

    assert read(0, 10) == [(i, i) for i in range(10)]
    assert read(500, 700) == [(i, i) for i in range(500, 700)]
    assert read(_RECORDS - 3, _RECORDS) == [(i, i) for i in range(_RECORDS - 3, _RECORDS)]
