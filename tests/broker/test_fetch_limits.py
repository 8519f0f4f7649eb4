"""Fetch size limits: the broker never answers a fetch with more than the consumer asked for.

The batch layer reads whole partitions (the master dataset) through consumers whose memory is
bounded by ``fetch.max.bytes`` / ``max.partition.fetch.bytes``. A broker that ignored those
limits would answer each fetch with everything it has, and a large partition would blow the
consumer's memory.

How it is observed: librdkafka refuses any response larger than ``receive.message.max.bytes``
(it drops the response, reports ``Receive failed: Invalid response size N`` via ``error_cb``,
reconnects and sends the same fetch again). With that kept at its minimum, ``fetch.max.bytes +
512`` (the protocol overhead librdkafka allows for), a consumer can only get through a
partition much larger than the limit if every fetch response is within the limit: a broker
answering a fetch with the partition's whole remaining tail (~30 MB here) would leave the
consumer retrying at offset 0 until the read's deadline fails the test. Kafka's one exception,
a first record batch larger than the limit is returned whole (so an oversized record cannot
stall a consumer), is avoided in the main read by producing batches smaller than the limit, and
used as a control: it proves that an oversized response really is caught by this setup.

Observed against Apache Kafka 4.3.1 / librdkafka 2.16.0: 300 records of 100 KB (~30 MB) are
read in full with ``fetch.max.bytes = max.partition.fetch.bytes = 1 MiB`` and
``receive.message.max.bytes = 1 MiB + 512`` without a single receive error; a partition whose
first batch is one 1,500,000-byte record is answered with that whole batch, which librdkafka
rejects ("Invalid response size 1500148 (0..1049088)"). Producing the main partition in 2 MB
batches instead makes the read fail at once the same way.
"""

from __future__ import annotations

import re
from typing import Any

import pytest
from confluent_kafka import Consumer, TopicPartition

from ._kafka import TopicFactory, eventually, make_consumer, make_producer, produce_all, read_until

pytestmark = pytest.mark.timeout(120)

LIMIT = 1024 * 1024
RECORD_BYTES = 100 * 1024
RECORDS = 300  # ~30 MB in partition 0
OVERSIZED_RECORD_BYTES = 1_500_000  # partition 1: one record, one batch, over the limit
RESPONSE_SIZE = re.compile(r"Invalid response size (\d+)")


def _limited_consumer(bootstrap: str, errors: list[str]) -> Consumer:
    config: dict[str, Any] = {
        "fetch.max.bytes": LIMIT,
        "max.partition.fetch.bytes": LIMIT,
        # librdkafka's minimum for it: fetch.max.bytes + 512 bytes of protocol overhead.
        "receive.message.max.bytes": LIMIT + 512,
        "error_cb": lambda err: errors.append(str(err)),
    }
    return make_consumer(bootstrap, config=config)


def test_fetch_responses_stay_within_fetch_max_bytes(
    kafka_bootstrap: str, create_topic: TopicFactory
) -> None:
    """A ~30 MB partition is read in full by a consumer that rejects responses over 1 MiB."""
    topic = create_topic(partitions=2, config={"max.message.bytes": str(2 * LIMIT)})
    producer = make_producer(
        kafka_bootstrap,
        # Record batches of at most 500 KB: below the limit, so Kafka's "first batch larger
        # than the limit" exception never applies to partition 0.
        # Idempotent: a batch retried after a request timeout keeps its place in the log.
        config={
            "batch.size": 500_000,
            "message.max.bytes": 2 * LIMIT,
            "linger.ms": 20,
            "enable.idempotence": True,
        },
    )
    payload = bytes(RECORD_BYTES)
    produce_all(
        producer,
        topic,
        [{"value": payload, "key": str(i).encode(), "partition": 0} for i in range(RECORDS)],
        timeout=60,
    )
    produce_all(producer, topic, [{"value": bytes(OVERSIZED_RECORD_BYTES), "partition": 1}])

    errors: list[str] = []
    consumer = _limited_consumer(kafka_bootstrap, errors)
    try:
        consumer.assign([TopicPartition(topic, 0, 0)])
        messages = read_until(consumer, {(topic, 0): RECORDS}, timeout=60)
    finally:
        consumer.close()
    assert not errors, f"errors while reading with {LIMIT}-byte fetches: {errors[:5]}"
    assert [m.key() for m in messages] == [str(i).encode() for i in range(RECORDS)]
    assert all(len(m.value() or b"") == RECORD_BYTES for m in messages)

    # Control: a first batch over the limit is returned whole (Kafka's documented exception),
    # and this consumer setup rejects that response, so it would reject an over-limit answer
    # to any of the fetches above just the same.
    control_errors: list[str] = []
    control = _limited_consumer(kafka_bootstrap, control_errors)
    try:
        control.assign([TopicPartition(topic, 1, 0)])

        def rejected_sizes() -> list[int]:
            msg = control.poll(0.2)  # serves error_cb
            assert msg is None or msg.error() is not None, (
                f"a {len(msg.value() or b'')}-byte record got through a {LIMIT}-byte "
                "receive limit: the receive limit does not bite, this test checks nothing"
            )
            if msg is not None:
                control_errors.append(str(msg.error()))
            return [int(m.group(1)) for e in control_errors if (m := RESPONSE_SIZE.search(e))]

        sizes, _ = eventually(
            rejected_sizes,
            bool,
            timeout=20,
            what="the oversized first batch answered whole and rejected by the receive limit",
        )
        assert min(sizes) > OVERSIZED_RECORD_BYTES > LIMIT + 512
    finally:
        control.close()
