"""Producing and reading records: partitioning by key, CreateTime, end offsets, time lookups."""

from __future__ import annotations

import time
from collections import defaultdict

import pytest
from confluent_kafka import TIMESTAMP_CREATE_TIME, TopicPartition

from ._kafka import TopicFactory, make_consumer, make_producer, produce_all, read_until

pytestmark = pytest.mark.timeout(60)

DAY_MS = 24 * 60 * 60 * 1000


def test_same_key_always_lands_on_the_same_partition(
    kafka_bootstrap: str, create_topic: TopicFactory
) -> None:
    """Speed-layer de-duplication relies on every copy of a key sharing one partition."""
    topic = create_topic(partitions=4)
    producer = make_producer(kafka_bootstrap)
    keys = [f"user-{i}".encode() for i in range(24)]
    records = [
        {"key": key, "value": f"{key.decode()}#{round_}".encode()}
        for round_ in range(5)
        for key in keys
    ]
    delivered = produce_all(producer, topic, records)

    partitions_by_key: dict[bytes | None, set[int]] = defaultdict(set)
    for report in delivered:
        partitions_by_key[report.key].add(report.partition)
    spread = {k: p for k, p in partitions_by_key.items() if len(p) != 1}
    assert not spread, f"keys spread over several partitions: {spread}"
    assert len({p for ps in partitions_by_key.values() for p in ps}) > 1, (
        "24 distinct keys all hashed to one partition: keyed partitioning looks broken"
    )

    # Reading the log back shows every key only on the partition the producer reported.
    consumer = make_consumer(kafka_bootstrap)
    try:
        ends = {(topic, p): 0 for p in range(4)}
        for report in delivered:
            ends[(topic, report.partition)] = max(
                ends[(topic, report.partition)], report.offset + 1
            )
        consumer.assign([TopicPartition(topic, p, 0) for p in range(4)])
        messages = read_until(consumer, ends)
    finally:
        consumer.close()
    assert len(messages) == len(records)
    for msg in messages:
        assert partitions_by_key[msg.key()] == {msg.partition()}


def test_explicit_create_time_is_kept_including_old_timestamps(
    kafka_bootstrap: str, create_topic: TopicFactory
) -> None:
    """Records keep the producer's CreateTime verbatim; a 30-day-old one is stored and readable.

    Event validity compares the event time with the record's CreateTime, and the batch layer
    re-reads the whole history, so neither the timestamp nor an old record may be altered or
    dropped (retention.ms=-1; no message.timestamp.before.max.ms rejection).
    """
    topic = create_topic(partitions=1)
    now_ms = int(time.time() * 1000)
    timestamps = [now_ms - 30 * DAY_MS, now_ms - 7 * DAY_MS, now_ms - 1, now_ms, now_ms + 1000]
    producer = make_producer(kafka_bootstrap)
    delivered = produce_all(
        producer,
        topic,
        [{"value": f"r{i}".encode(), "timestamp": ts} for i, ts in enumerate(timestamps)],
    )
    for report, ts in zip(delivered, timestamps, strict=True):
        assert report.timestamp == (TIMESTAMP_CREATE_TIME, ts)

    consumer = make_consumer(kafka_bootstrap)
    try:
        consumer.assign([TopicPartition(topic, 0, 0)])
        messages = read_until(consumer, {(topic, 0): len(timestamps)})
    finally:
        consumer.close()
    got = [(m.value(), m.timestamp()) for m in messages]
    expected = [(f"r{i}".encode(), (TIMESTAMP_CREATE_TIME, ts)) for i, ts in enumerate(timestamps)]
    assert got == expected


def test_high_watermark_equals_records_produced_and_offset_after_last(
    kafka_bootstrap: str, create_topic: TopicFactory
) -> None:
    """Non-transactional: high watermark == records produced == last offset + 1 (per partition)."""
    topic = create_topic(partitions=2)
    producer = make_producer(kafka_bootstrap)
    counts = {0: 37, 1: 5}
    delivered = produce_all(
        producer,
        topic,
        [
            {"value": f"p{p}-{i}".encode(), "partition": p}
            for p, n in counts.items()
            for i in range(n)
        ],
    )

    consumer = make_consumer(kafka_bootstrap)
    try:
        for partition, count in counts.items():
            last_offset = max(r.offset for r in delivered if r.partition == partition)
            low, high = consumer.get_watermark_offsets(
                TopicPartition(topic, partition), timeout=10, cached=False
            )
            assert (low, high) == (0, count), f"partition {partition}: watermarks {(low, high)}"
            assert high == last_offset + 1

        # Reading to the end leaves the position exactly at the high watermark.
        consumer.assign([TopicPartition(topic, p, 0) for p in counts])
        messages = read_until(consumer, {(topic, p): n for p, n in counts.items()})
        assert len(messages) == sum(counts.values())
        positions = consumer.position([TopicPartition(topic, p) for p in counts])
        assert {tp.partition: tp.offset for tp in positions} == counts
    finally:
        consumer.close()


@pytest.mark.parametrize("batching", ["one-batch", "batch-per-record"])
def test_offsets_for_times_returns_first_offset_at_or_after_time(
    kafka_bootstrap: str, create_topic: TopicFactory, batching: str
) -> None:
    """offsets_for_times(t) by CreateTime == the first offset whose timestamp is >= t.

    Timestamps are explicit CreateTimes, deliberately out of order at offset 2 (producers may
    send late records): the answer is the first offset *in log order* with timestamp >= t, not
    the record closest to t. Kafka looks a time up in two steps, the time index (one entry per
    new maximum timestamp, here at every batch: ``index.interval.bytes=1``) and then a scan of
    the batches from there by each batch's maximum timestamp: both are exercised, with every
    record in one batch and with one batch per record.
    """
    topic = create_topic(
        partitions=1,
        config={"message.timestamp.type": "CreateTime", "index.interval.bytes": "1"},
    )
    base = int(time.time() * 1000) - 10 * DAY_MS
    relative = [0, 1000, 5000, 3000, 7000, 7000, 9000]  # offsets 0..6
    records = [{"value": f"t{r}".encode(), "timestamp": base + r} for r in relative]
    producer = make_producer(kafka_bootstrap)
    if batching == "one-batch":
        delivered = produce_all(producer, topic, records)
    else:  # produce_all flushes: each record is sent (and stored) as a batch of its own
        delivered = [
            report for record in records for report in produce_all(producer, topic, [record])
        ]
    assert [r.timestamp for r in delivered] == [(TIMESTAMP_CREATE_TIME, base + r) for r in relative]

    def expected(asked: int) -> int:
        return next((o for o, r in enumerate(relative) if base + r >= asked), -1)

    consumer = make_consumer(kafka_bootstrap)
    try:
        for asked_rel in [-5000, 0, 1, 1000, 2000, 3000, 4000, 5000, 6000, 7000, 8000, 9000]:
            asked = base + asked_rel
            [result] = consumer.offsets_for_times([TopicPartition(topic, 0, asked)], timeout=10)
            assert result.error is None, f"offsets_for_times({asked_rel:+}): {result.error}"
            assert result.offset == expected(asked), (
                f"offsets_for_times(base{asked_rel:+}) returned {result.offset}, expected "
                f"{expected(asked)} (timestamps base+{relative})"
            )
        # After the newest timestamp there is no such offset: Kafka answers -1 (end).
        [after] = consumer.offsets_for_times([TopicPartition(topic, 0, base + 9001)], timeout=10)
        assert after.offset == -1
    finally:
        consumer.close()


def test_idempotent_producer_writes_each_record_exactly_once(
    kafka_bootstrap: str, create_topic: TopicFactory
) -> None:
    """enable.idempotence=True is accepted and yields exactly the records produced, no dupes."""
    topic = create_topic(partitions=3)
    producer = make_producer(
        kafka_bootstrap,
        config={"enable.idempotence": True, "max.in.flight.requests.per.connection": 5},
    )
    total = 600
    delivered = produce_all(
        producer,
        topic,
        [{"key": f"k{i % 17}".encode(), "value": f"v{i}".encode()} for i in range(total)],
    )
    assert len(delivered) == total

    consumer = make_consumer(kafka_bootstrap)
    try:
        ends: dict[tuple[str, int], int] = {}
        for partition in range(3):
            _, high = consumer.get_watermark_offsets(TopicPartition(topic, partition), timeout=10)
            ends[(topic, partition)] = high
        assert sum(ends.values()) == total, f"high watermarks {ends} do not sum to {total}"
        consumer.assign([TopicPartition(topic, p, 0) for p in range(3)])
        messages = read_until(consumer, ends)
    finally:
        consumer.close()
    values = [m.value() for m in messages]
    assert len(values) == total
    assert len(set(values)) == total, "duplicate records in the log"
    assert set(values) == {f"v{i}".encode() for i in range(total)}
