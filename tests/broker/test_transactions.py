"""Transactions and the last stable offset (LSO) under ``isolation.level=read_committed``.

The batch layer snapshots each partition at its LSO (read_committed) and ends a slice when the
consumer *position* reaches that end offset, never by counting records. These tests pin the
broker behaviour that design relies on.

Observed against Apache Kafka 4.3.1 with confluent-kafka 2.16.1 / librdkafka 2.16.0 (one
partition: 3 plain records at offsets 0-2, a transaction left open with 4 records at 3-6, then
2 plain non-transactional records at 7-8):

* ``Consumer.get_watermark_offsets(tp, timeout=..., cached=False)`` on a consumer configured with
  ``isolation.level=read_committed`` sends a ListOffsets(latest) request with that isolation
  level and returns ``(0, 3)``: the high value is the LSO, exactly the offset of the first
  record of the open transaction. The same call on a read_uncommitted consumer returns
  ``(0, 9)`` (the high watermark).
* ``AdminClient.list_offsets({tp: OffsetSpec.latest()}, isolation_level=READ_COMMITTED)``
  also returns 3 (READ_UNCOMMITTED: 9).
* ``get_watermark_offsets(tp, cached=True)`` returns ``(0, 9)`` even on the read_committed
  consumer: librdkafka caches the fetch response's *high watermark*, not the LSO. A cached
  value must therefore never be used as a read_committed snapshot.
* A read_committed consumer delivers offsets 0-2 only, raises PARTITION_EOF "at offset 3
  (HighwaterMark 9)" and its position stays 3. The plain records at 7-8 are held back too:
  the LSO blocks everything after the first open transaction, transactional or not.
* After ``commit_transaction`` the commit marker takes offset 9; the LSO (read_committed
  ``get_watermark_offsets`` high) becomes 10 == high watermark, the consumer delivers offsets
  3-8 and its position ends at 10 although only 9 records exist below it. After
  ``abort_transaction`` instead the abort marker takes offset 9, the LSO becomes 10 as well and
  the consumer delivers only offsets 7-8, its position ending at 10.
* ``commit_transaction`` / ``abort_transaction`` return once the transaction coordinator has
  logged the decision; the markers are written to the partitions asynchronously. For a few
  milliseconds after the call returns the LSO can still be the old one (seen: 3 right after
  the commit on a freshly started broker), so the tests wait (briefly) for it to move.
* An aborted transaction's records (and its abort marker) are never delivered under
  read_committed; the consumer's position moves past them to the end offset. A
  read_uncommitted consumer does deliver the aborted records (never the markers).
* A producer killed (SIGKILL) with a transaction open: the LSO stays at the transaction's
  first record until the broker aborts the transaction on its timeout, found by a periodic
  check (``transaction.abort.timed.out.transaction.cleanup.interval.ms``, 10 s by default).
  The LSO moved on 3.6-10.6 s after the kill with ``transaction.timeout.ms=2000`` and 5.7-12.2 s
  after it with 5000 (the records were acknowledged just before the kill); the abort marker
  then lets the read_committed position reach the end.
"""

from __future__ import annotations

import contextlib
import time
import uuid
from collections.abc import Iterator

import pytest
from confluent_kafka import (
    Consumer,
    IsolationLevel,
    KafkaError,
    KafkaException,
    Message,
    Producer,
    TopicPartition,
)
from confluent_kafka.admin import AdminClient, OffsetSpec

from ._kafka import (
    ClientFactory,
    TopicFactory,
    eventually,
    make_consumer,
    make_producer,
    poll_for,
    produce_all,
    read_until,
)

pytestmark = pytest.mark.timeout(60)

#: How long the markers of a transaction that was just committed/aborted may take to land.
MARKERS_WRITTEN_WITHIN_S = 10.0


@pytest.fixture
def txn_producer(kafka_bootstrap: str) -> Iterator[Producer]:
    producer = make_producer(
        kafka_bootstrap,
        config={
            "transactional.id": f"conformance-txn-{uuid.uuid4().hex}",
            "transaction.timeout.ms": 60000,
        },
    )
    producer.init_transactions(15)
    yield producer
    # Never leave a transaction open on a persistent broker (it would pin the topic's LSO).
    with contextlib.suppress(KafkaException):  # no transaction in progress: nothing to abort
        producer.abort_transaction(5)
    producer.flush(5)


def _read_committed_consumer(bootstrap: str) -> Consumer:
    return make_consumer(
        bootstrap, config={"isolation.level": "read_committed", "enable.partition.eof": True}
    )


def _lso(consumer: Consumer, topic: str, partition: int = 0) -> int:
    """High value of a fresh (uncached) watermark query on a read_committed consumer."""
    _, high = consumer.get_watermark_offsets(
        TopicPartition(topic, partition), timeout=10, cached=False
    )
    return int(high)


def _lso_reaches(
    consumer: Consumer,
    topic: str,
    expected: int,
    partition: int = 0,
    timeout: float = MARKERS_WRITTEN_WITHIN_S,
) -> None:
    """Wait until the read_committed watermark query returns ``expected``.

    Ending a transaction returns before its markers are written (see the module docstring),
    so a released LSO is waited for rather than read once.
    """
    eventually(
        lambda: _lso(consumer, topic, partition),
        lambda lso: lso == expected,
        timeout,
        f"read_committed watermark of {topic} [{partition}] reaching {expected}",
    )


def _admin_latest(admin: AdminClient, topic: str, isolation: IsolationLevel) -> int:
    """The partition's latest offset by the admin API. It first asks a broker for the
    partition's leader, and on a cluster that broker may not know a new topic's leader yet
    ("No leaders found", not retried by the client): asked again for up to 10 s."""
    tp = TopicPartition(topic, 0)
    deadline = time.monotonic() + 10
    while True:
        futures = admin.list_offsets(
            {tp: OffsetSpec.latest()}, isolation_level=isolation, request_timeout=10
        )
        try:
            return int(futures[tp].result().offset)
        except KafkaException as exc:
            if exc.args[0].code() != KafkaError._NOENT or time.monotonic() > deadline:
                raise
        time.sleep(0.1)


def _read_to_eof(consumer: Consumer, settle_s: float = 1.0, timeout: float = 10.0) -> list[Message]:
    """Read until PARTITION_EOF, then keep polling ``settle_s`` to catch late deliveries."""
    messages: list[Message] = []
    deadline = time.monotonic() + timeout
    settle_until: float | None = None
    while settle_until is None or time.monotonic() < settle_until:
        assert time.monotonic() < deadline, f"no PARTITION_EOF within {timeout} s"
        msg = consumer.poll(0.2)
        if msg is None:
            continue
        if (err := msg.error()) is not None:
            assert err.code() == KafkaError._PARTITION_EOF, f"consume error: {err}"
            settle_until = settle_until or time.monotonic() + settle_s
            continue
        messages.append(msg)
    return messages


def _position(consumer: Consumer, topic: str, partition: int = 0) -> int:
    [tp] = consumer.position([TopicPartition(topic, partition)])
    return int(tp.offset)


@pytest.mark.parametrize("outcome", ["commit", "abort"])
def test_open_transaction_holds_back_lso_until_it_ends(
    kafka_bootstrap: str,
    admin: AdminClient,
    create_topic: TopicFactory,
    txn_producer: Producer,
    outcome: str,
) -> None:
    """Open transaction: LSO <= its first record and nothing of it is visible; its end releases.

    A read_committed watermark query must never return an offset past the first record of an
    open transaction (the batch snapshot would otherwise include records that may later be
    aborted), and must not lag behind the committed records before it (the batch would stall).
    Commit or abort, the LSO then moves past the marker to the high watermark and the consumer
    that was held at the old LSO reads on to it: every record after a commit, only the plain
    ones after an abort.
    """
    topic = create_topic(partitions=1)
    plain = make_producer(kafka_bootstrap)
    produce_all(plain, topic, [{"value": f"plain{i}".encode()} for i in range(3)])

    txn_producer.begin_transaction()
    opened = produce_all(txn_producer, topic, [{"value": f"open{i}".encode()} for i in range(4)])
    first_open = min(r.offset for r in opened)
    assert first_open == 3
    # Non-transactional records after the open transaction are held back by the LSO as well.
    after = produce_all(plain, topic, [{"value": f"after{i}".encode()} for i in range(2)])
    high_watermark = max(r.offset for r in after) + 1
    assert high_watermark == 9

    committed_view = _read_committed_consumer(kafka_bootstrap)
    uncommitted_view = make_consumer(
        kafka_bootstrap, config={"isolation.level": "read_uncommitted"}
    )
    try:
        lso = _lso(committed_view, topic)
        assert lso <= first_open, (
            f"read_committed watermark query returned {lso}, past the first open-transaction "
            f"record at offset {first_open}"
        )
        assert lso >= 3, f"read_committed watermark {lso} lags behind 3 committed plain records"
        assert _lso(uncommitted_view, topic) == high_watermark
        assert _admin_latest(admin, topic, IsolationLevel.READ_COMMITTED) == lso
        assert _admin_latest(admin, topic, IsolationLevel.READ_UNCOMMITTED) == high_watermark

        committed_view.assign([TopicPartition(topic, 0, 0)])
        visible = _read_to_eof(committed_view)
        assert [m.value() for m in visible] == [b"plain0", b"plain1", b"plain2"]
        assert _position(committed_view, topic) == lso

        if outcome == "commit":
            txn_producer.commit_transaction(15)
            released_values = [*(r.value for r in opened), *(r.value for r in after)]
        else:
            txn_producer.abort_transaction(15)
            released_values = [r.value for r in after]

        # The marker occupies the offset right after the last record: LSO == HWM == 10.
        _lso_reaches(committed_view, topic, high_watermark + 1)
        assert _lso(uncommitted_view, topic) == high_watermark + 1
        released = read_until(committed_view, {(topic, 0): high_watermark + 1})
        released += poll_for(committed_view, 0.5)  # nothing more follows
        assert [m.value() for m in released] == released_values
        assert _position(committed_view, topic) == high_watermark + 1
    finally:
        committed_view.close()
        uncommitted_view.close()


def test_aborted_transaction_is_never_visible_to_read_committed(
    kafka_bootstrap: str, create_topic: TopicFactory, txn_producer: Producer
) -> None:
    """Aborted records are skipped by read_committed; the position still reaches the end."""
    topic = create_topic(partitions=1)
    plain = make_producer(kafka_bootstrap)
    produce_all(plain, topic, [{"value": b"before"}])
    txn_producer.begin_transaction()
    aborted = produce_all(
        txn_producer, topic, [{"value": f"aborted{i}".encode()} for i in range(3)]
    )
    txn_producer.abort_transaction(15)
    produce_all(plain, topic, [{"value": b"after"}])

    committed_view = _read_committed_consumer(kafka_bootstrap)
    uncommitted_view = make_consumer(
        kafka_bootstrap, config={"isolation.level": "read_uncommitted"}
    )
    try:
        # before(1) + aborted(3) + abort marker(1) + after(1)
        end = 6
        _lso_reaches(committed_view, topic, end)
        assert _lso(uncommitted_view, topic) == end

        committed_view.assign([TopicPartition(topic, 0, 0)])
        visible = read_until(committed_view, {(topic, 0): end})
        visible += poll_for(committed_view, 0.5)  # nothing more follows
        assert [m.value() for m in visible] == [b"before", b"after"]
        assert _position(committed_view, topic) == end

        # The aborted records really are in the log (read_uncommitted sees them).
        uncommitted_view.assign([TopicPartition(topic, 0, 0)])
        raw = read_until(uncommitted_view, {(topic, 0): end})
        assert [m.offset() for m in raw if (m.value() or b"").startswith(b"aborted")] == [
            r.offset for r in aborted
        ]
    finally:
        committed_view.close()
        uncommitted_view.close()


def test_slice_ends_by_position_not_record_count(
    kafka_bootstrap: str, create_topic: TopicFactory, txn_producer: Producer
) -> None:
    """Reading to the end leaves position == end offset although markers occupy offsets.

    Three committed transactions (3 records each) and one aborted one on each of 2 partitions:
    every partition's end offset exceeds the number of records a read_committed consumer gets,
    so a reader that counts records would wait forever; one that stops when its position
    reaches the end offset finishes with exactly the committed records.
    """
    topic = create_topic(partitions=2)
    for round_ in range(4):
        txn_producer.begin_transaction()
        produce_all(
            txn_producer,
            topic,
            [
                {"value": f"r{round_}-p{p}-{i}".encode(), "partition": p}
                for p in range(2)
                for i in range(3)
            ],
        )
        if round_ == 2:
            txn_producer.abort_transaction(15)
        else:
            txn_producer.commit_transaction(15)

    consumer = _read_committed_consumer(kafka_bootstrap)
    try:
        # per partition: 4 x 3 records + 4 markers (the last ones possibly still being written)
        ends = {(topic, p): 16 for p in range(2)}
        for p in range(2):
            _lso_reaches(consumer, topic, 16, partition=p)
        consumer.assign([TopicPartition(topic, p, 0) for p in range(2)])
        messages = read_until(consumer, ends)
        for p in range(2):
            got = [m.value() for m in messages if m.partition() == p]
            assert got == [f"r{r}-p{p}-{i}".encode() for r in (0, 1, 3) for i in range(3)]
            assert len(got) == 9 < ends[(topic, p)]
            assert _position(consumer, topic, p) == ends[(topic, p)]
    finally:
        consumer.close()


#: Short, so the test is quick, yet long enough that the test surely sees the LSO held before
#: the timeout even on a busy machine. The broker's periodic check for timed-out transactions
#: (transaction.abort.timed.out.transaction.cleanup.interval.ms, 10 s by default) adds up to
#: another 10 s before the abort, hence the allowance.
ABANDONED_TXN_TIMEOUT_MS = 5000
TIMEOUT_ABORT_WITHIN_S = 35.0


@pytest.mark.timeout(90)
def test_transaction_of_a_killed_producer_is_aborted_at_its_timeout(
    kafka_bootstrap: str, create_topic: TopicFactory, spawn_client: ClientFactory
) -> None:
    """A producer killed mid-transaction holds the LSO only until its transaction times out.

    The batch layer's read_committed snapshot would otherwise stall behind an abandoned
    transaction forever. The producer runs in its own process and is killed with SIGKILL, so it
    never ends the transaction: only the broker's transaction timeout can abort it.
    """
    topic = create_topic(partitions=1)
    plain = make_producer(kafka_bootstrap)
    produce_all(plain, topic, [{"value": b"before0"}, {"value": b"before1"}])
    committed_view = _read_committed_consumer(kafka_bootstrap)
    try:
        _lso_reaches(committed_view, topic, 2)  # connected before the clock starts
        abandoned = spawn_client(
            "open-transaction",
            bootstrap=kafka_bootstrap,
            topic=topic,
            transaction_timeout_ms=ABANDONED_TXN_TIMEOUT_MS,
            count=3,
        )
        produced = abandoned.expect("produced", timeout=60)
        assert produced["offsets"] == [2, 3, 4]
        # Well within its timeout, the transaction holds the LSO at its first record...
        assert _lso(committed_view, topic) == 2
        abandoned.kill()
        produce_all(plain, topic, [{"value": b"after0"}, {"value": b"after1"}])  # 5-6

        # ...until the broker aborts it: the abort marker takes offset 7, the LSO passes it.
        _lso_reaches(committed_view, topic, 8, timeout=TIMEOUT_ABORT_WITHIN_S)
        committed_view.assign([TopicPartition(topic, 0, 0)])
        visible = read_until(committed_view, {(topic, 0): 8})
        visible += poll_for(committed_view, 0.5)  # nothing more follows
        assert [m.value() for m in visible] == [b"before0", b"before1", b"after0", b"after1"]
        assert _position(committed_view, topic) == 8
    finally:
        committed_view.close()
