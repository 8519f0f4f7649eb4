"""Consumer groups and positioning: committed offsets, resume, assign and seek."""

from __future__ import annotations

import time
import uuid

import pytest
from confluent_kafka import Consumer, KafkaError, Message, TopicPartition

from ._kafka import TopicFactory, make_consumer, make_producer, produce_all, read_until

pytestmark = pytest.mark.timeout(60)


def _poll_n(consumer: Consumer, n: int, timeout: float = 20.0) -> list[Message]:
    """Poll a subscribed consumer until it has delivered ``n`` records (group join included)."""
    messages: list[Message] = []
    deadline = time.monotonic() + timeout
    while len(messages) < n:
        assert time.monotonic() < deadline, (
            f"got {len(messages)}/{n} records within {timeout} s (assignment: "
            f"{consumer.assignment()})"
        )
        msg = consumer.poll(0.2)
        if msg is None:
            continue
        assert msg.error() is None, f"consume error: {msg.error()}"
        messages.append(msg)
    return messages


def test_group_commit_then_new_consumer_resumes_at_committed_offset(
    kafka_bootstrap: str, create_topic: TopicFactory
) -> None:
    """Consume part, commit, close; a new consumer in the group starts exactly at the commit."""
    topic = create_topic(partitions=1)
    produce_all(
        make_producer(kafka_bootstrap), topic, [{"value": f"m{i}".encode()} for i in range(10)]
    )
    group = f"conformance-resume-{uuid.uuid4().hex}"

    first = make_consumer(kafka_bootstrap, group)
    try:
        first.subscribe([topic])
        consumed = _poll_n(first, 4)
        assert [m.offset() for m in consumed] == [0, 1, 2, 3]
        committed = first.commit(message=consumed[-1], asynchronous=False)
        assert committed is not None
        assert [(tp.partition, tp.offset, tp.error) for tp in committed] == [(0, 4, None)]
    finally:
        first.close()

    second = make_consumer(kafka_bootstrap, group)
    try:
        [stored] = second.committed([TopicPartition(topic, 0)], timeout=10)
        assert stored.error is None and stored.offset == 4, f"committed offset: {stored}"
        second.subscribe([topic])
        resumed = _poll_n(second, 6)
        assert [m.offset() for m in resumed] == list(range(4, 10))
        assert [m.value() for m in resumed] == [f"m{i}".encode() for i in range(4, 10)]
    finally:
        second.close()


def test_assign_and_seek_read_from_exactly_that_offset(
    kafka_bootstrap: str, create_topic: TopicFactory
) -> None:
    """assign(offset=N) and seek(N) both deliver record N first (the speed layer seeks fence+1)."""
    topic = create_topic(partitions=2)
    produce_all(
        make_producer(kafka_bootstrap),
        topic,
        [{"value": f"m{i}".encode(), "partition": 1} for i in range(20)],
    )

    consumer = make_consumer(kafka_bootstrap, config={"enable.partition.eof": True})
    try:
        consumer.assign([TopicPartition(topic, 1, 7)])
        from_assign = read_until(consumer, {(topic, 1): 20})
        assert [m.offset() for m in from_assign] == list(range(7, 20))
        assert from_assign[0].value() == b"m7"

        # Seek backwards on the assigned partition: the next record is exactly offset 3.
        consumer.seek(TopicPartition(topic, 1, 3))
        deadline = time.monotonic() + 10
        while True:
            assert time.monotonic() < deadline, "no record after seek"
            msg = consumer.poll(0.2)
            if msg is None:
                continue
            if (err := msg.error()) is not None:
                assert err.code() == KafkaError._PARTITION_EOF, f"consume error: {err}"
                continue
            break
        assert (msg.partition(), msg.offset(), msg.value()) == (1, 3, b"m3")
        rest = read_until(consumer, {(topic, 1): 20})
        assert [m.offset() for m in rest] == list(range(4, 20))
    finally:
        consumer.close()
