"""Small confluent-kafka helpers shared by the broker conformance tests."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from confluent_kafka import Consumer, KafkaError, Message, Producer, TopicPartition

POLL_S = 0.2

#: ``create_topic(partitions=1, config=None) -> topic name`` (see conftest).
TopicFactory = Callable[..., str]


@dataclass(frozen=True)
class Delivered:
    """Where the broker put one produced record (from the delivery report)."""

    key: bytes | None
    value: bytes | None
    partition: int
    offset: int
    timestamp: tuple[int, int]


def make_producer(bootstrap: str, config: Mapping[str, Any] | None = None) -> Producer:
    settings: dict[str, Any] = {"bootstrap.servers": bootstrap, "linger.ms": 5, "acks": "all"}
    settings.update(config or {})
    return Producer(settings)


def make_consumer(
    bootstrap: str, group_id: str | None = None, config: Mapping[str, Any] | None = None
) -> Consumer:
    settings: dict[str, Any] = {
        "bootstrap.servers": bootstrap,
        "group.id": group_id or f"conformance-{uuid.uuid4().hex}",
        "enable.auto.commit": False,
        "auto.offset.reset": "earliest",
        "enable.partition.eof": False,
    }
    settings.update(config or {})
    return Consumer(settings)


def produce_all(
    producer: Producer,
    topic: str,
    records: Iterable[Mapping[str, Any]],
    timeout: float = 15.0,
) -> list[Delivered]:
    """Produce ``records`` (kwargs for ``Producer.produce``), flush, fail on any delivery error.

    Returns the delivery reports in produce order.
    """
    reports: list[Delivered | None] = []
    errors: list[str] = []

    def make_callback(index: int) -> Any:
        def on_delivery(err: KafkaError | None, msg: Message) -> None:
            if err is not None:
                errors.append(f"record {index}: {err}")
                return
            partition, offset = msg.partition(), msg.offset()
            assert partition is not None and offset is not None
            reports[index] = Delivered(
                key=msg.key(),
                value=msg.value(),
                partition=partition,
                offset=offset,
                timestamp=msg.timestamp(),
            )

        return on_delivery

    for record in records:
        reports.append(None)
        producer.produce(topic, on_delivery=make_callback(len(reports) - 1), **record)
        producer.poll(0)
    remaining = producer.flush(timeout)
    assert remaining == 0, f"{remaining} record(s) still undelivered after {timeout} s"
    assert not errors, f"delivery failed: {errors[:5]}"
    assert all(r is not None for r in reports), "missing delivery report(s)"
    return [r for r in reports if r is not None]


def read_until(
    consumer: Consumer, ends: Mapping[tuple[str, int], int], timeout: float = 15.0
) -> list[Message]:
    """Poll an assigned/subscribed consumer until each (topic, partition)'s position >= its end.

    This is how the batch layer slices the log: it stops when the *position* reaches the end
    offset, never by counting records (transaction markers and aborted records occupy offsets
    but are never delivered). Partitions whose end is 0 are empty and need no reading.
    """
    pending = {tp: end for tp, end in ends.items() if end > 0}
    messages: list[Message] = []
    deadline = time.monotonic() + timeout

    def positions() -> dict[tuple[str, int], int]:
        tps = consumer.position([TopicPartition(t, p) for t, p in pending])
        return {(tp.topic, tp.partition): tp.offset for tp in tps}

    while any(positions()[tp] < end for tp, end in pending.items()):
        assert time.monotonic() < deadline, (
            f"positions {positions()} did not reach {pending} within {timeout} s; "
            f"read {len(messages)} record(s)"
        )
        msg = consumer.poll(POLL_S)
        if msg is None:
            continue
        if (err := msg.error()) is not None:
            assert err.code() == KafkaError._PARTITION_EOF, f"consume error: {err}"
            continue
        messages.append(msg)
    return messages


def poll_for(consumer: Consumer, duration: float) -> list[Message]:
    """Poll for ``duration`` seconds and return every record delivered meanwhile."""
    messages: list[Message] = []
    deadline = time.monotonic() + duration
    while time.monotonic() < deadline:
        msg = consumer.poll(POLL_S)
        if msg is None:
            continue
        if (err := msg.error()) is not None:
            assert err.code() == KafkaError._PARTITION_EOF, f"consume error: {err}"
            continue
        messages.append(msg)
    return messages
