"""The speed layer's client (aiokafka, under Faust) against the broker: groups and commits."""

from __future__ import annotations

import asyncio
import uuid

import pytest
from aiokafka import AIOKafkaConsumer, ConsumerRecord
from aiokafka.structs import OffsetAndMetadata, TopicPartition

from ._kafka import TopicFactory, eventually, make_producer, produce_all

pytestmark = pytest.mark.timeout(60)

PARTITIONS = 3
PER_PARTITION = {0: 11, 1: 4, 2: 7}


async def _consume_commit_and_check(bootstrap: str, topic: str, group: str) -> None:
    consumer = AIOKafkaConsumer(
        topic,
        bootstrap_servers=bootstrap,
        group_id=group,
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        isolation_level="read_committed",
    )
    await consumer.start()
    try:
        total = sum(PER_PARTITION.values())
        records: list[ConsumerRecord[bytes, bytes]] = []

        async def read_all() -> None:
            while len(records) < total:
                batches = await consumer.getmany(timeout_ms=200)
                for batch in batches.values():
                    records.extend(batch)

        await asyncio.wait_for(read_all(), timeout=30)

        expected_tps = {TopicPartition(topic, p) for p in range(PARTITIONS)}
        assert consumer.assignment() == expected_tps, "group did not assign every partition"
        assert len(records) == total
        per_partition = {
            p: [r.offset for r in records if r.partition == p] for p in range(PARTITIONS)
        }
        assert per_partition == {p: list(range(n)) for p, n in PER_PARTITION.items()}

        ends = await consumer.end_offsets(sorted(expected_tps))
        assert ends == {TopicPartition(topic, p): n for p, n in PER_PARTITION.items()}
        for tp in expected_tps:
            assert await consumer.position(tp) == ends[tp]

        # Commit explicitly (as the speed layer does after Redis has the batch) and read back.
        await consumer.commit({tp: OffsetAndMetadata(ends[tp], "") for tp in expected_tps})
        for tp in expected_tps:
            assert await consumer.committed(tp) == ends[tp]
    finally:
        await consumer.stop()

    # A fresh member of the same group sees the committed offsets and nothing left to read.
    again = AIOKafkaConsumer(
        topic, bootstrap_servers=bootstrap, group_id=group, enable_auto_commit=False
    )
    await again.start()
    try:
        for p, n in PER_PARTITION.items():
            assert await again.committed(TopicPartition(topic, p)) == n
        leftovers = await again.getmany(timeout_ms=1500)
        assert not any(leftovers.values()), f"records redelivered after commit: {leftovers}"
    finally:
        await again.stop()


def test_aiokafka_group_consumer_reads_commits_and_end_offsets_match(
    kafka_bootstrap: str, create_topic: TopicFactory
) -> None:
    """aiokafka group member (manual commit): assignment, full read, commit, end_offsets."""
    topic = create_topic(partitions=PARTITIONS)
    produce_all(
        make_producer(kafka_bootstrap),
        topic,
        [
            {"value": f"p{p}-{i}".encode(), "partition": p}
            for p, n in PER_PARTITION.items()
            for i in range(n)
        ],
    )
    group = f"conformance-aiokafka-{uuid.uuid4().hex}"
    asyncio.run(_consume_commit_and_check(kafka_bootstrap, topic, group))


async def _read_committed_view(bootstrap: str, topic: str) -> tuple[int, list[int], int | None]:
    """(end_offsets, offsets delivered, last_stable_offset) for partition 0 under read_committed.

    Reads until the position reaches ``end_offsets``, then polls 0.5 s more: anything delivered
    beyond the end shows up in the offsets.
    """
    tp = TopicPartition(topic, 0)
    consumer = AIOKafkaConsumer(
        bootstrap_servers=bootstrap,
        enable_auto_commit=False,
        isolation_level="read_committed",
    )
    await consumer.start()
    try:
        consumer.assign([tp])
        await consumer.seek_to_beginning(tp)
        end = (await consumer.end_offsets([tp]))[tp]
        seen: list[int] = []

        async def read_to_end() -> None:
            while await consumer.position(tp) < end:
                batches = await consumer.getmany(tp, timeout_ms=200)
                seen.extend(r.offset for r in batches.get(tp, []))

        await asyncio.wait_for(read_to_end(), timeout=15)
        batches = await consumer.getmany(tp, timeout_ms=500)
        seen.extend(r.offset for r in batches.get(tp, []))
        return end, seen, consumer.last_stable_offset(tp)
    finally:
        await consumer.stop()


def test_aiokafka_read_committed_end_offsets_stop_at_open_transaction(
    kafka_bootstrap: str, create_topic: TopicFactory
) -> None:
    """aiokafka (read_committed) end_offsets == LSO; open-transaction records stay invisible.

    Observed on Apache Kafka 4.3.1 / aiokafka 0.14.0: with 2 committed plain records and a
    transaction of 3 records left open, ``end_offsets`` returns 2, ``last_stable_offset``
    (from the fetch response) is 2 and only offsets 0-1 are delivered; after the commit
    ``end_offsets`` is 6 (3 records + the commit marker at offset 5) once the marker is written
    (``commit_transaction`` returns before that, see test_transactions.py).
    """
    topic = create_topic(partitions=1)
    produce_all(make_producer(kafka_bootstrap), topic, [{"value": b"a"}, {"value": b"b"}])
    txn = make_producer(
        kafka_bootstrap, config={"transactional.id": f"conformance-aio-{uuid.uuid4().hex}"}
    )
    txn.init_transactions(15)
    txn.begin_transaction()
    try:
        produce_all(txn, topic, [{"value": f"open{i}".encode()} for i in range(3)])
        end, seen, lso = asyncio.run(_read_committed_view(kafka_bootstrap, topic))
        assert end == 2, f"read_committed end_offsets {end} while a transaction is open at 2"
        assert seen == [0, 1]
        assert lso == 2, f"last_stable_offset from fetch responses: {lso}"
    finally:
        txn.commit_transaction(15)
    view, _ = eventually(
        lambda: asyncio.run(_read_committed_view(kafka_bootstrap, topic)),
        lambda view: view[0] != 2,
        timeout=10,
        what="read_committed end_offsets moving past the committed transaction",
    )
    assert view == (6, [0, 1, 2, 3, 4], 6)
