"""One edge-case corpus through both layers and the oracle (docs/semantics.md "Event validity"):
the speed layer's dead letters and cells, the batch layer's malformed/skipped counts and cells,
and the brute-force oracle must all agree on every record."""

from __future__ import annotations

import time
from typing import Any

import orjson
import pytest
from confluent_kafka import Consumer, Producer, TopicPartition

from batch_layer import run_full
from shared.db.connect import connect
from shared.db.runs import RunRequest, queue_run
from shared.kafka import create_topics
from tests import oracle
from tests.conftest import Platform
from tests.speed.support import drain_with_worker
from tests.views import batch_view_cells, speed_view_cells

pytestmark = [pytest.mark.services, pytest.mark.timeout(600)]

BASE = 1_767_225_600_000  # 2026-01-01T00:00:00Z
CREATE_TIME = BASE + 10 * 60_000
"""What the producer stamps: a source topic replaces it with the broker's clock (rule 1)."""
MAX_FUTURE = 5 * 60_000


def _event(event_id: Any, ts: Any = BASE + 1_000, **fields: Any) -> dict[str, Any]:
    return {
        "ts": ts,
        "event_id": event_id,
        "page": "/",
        "user_id": "u1",
        "latency_ms": 10,
        **fields,
    }


def corpus(now_ms: int) -> list[bytes | None]:
    """Each record exercises one rule; ids are unique unless a duplicate is meant. `now_ms`:
    the broker's clock before the records are produced (their arrival, rule 1)."""
    json_events = [
        _event("int-ms"),
        _event("reused-id", BASE + 1_000, page="/reused"),  # another time: another event
        _event("reused-id", BASE + 61_000, page="/reused"),
        _event("rfc-z", "2026-01-01T00:00:02Z"),
        _event("rfc-lower", "2026-01-01t00:00:03z"),
        _event("rfc-plus", "2026-01-01T02:00:04+02:00"),
        _event("rfc-minus", "2025-12-31T18:30:05-05:30"),
        _event("rfc-micro", "2026-01-01T00:00:06.123456Z"),
        _event("rfc-7-digits", "2026-01-01T00:00:06.1234567Z"),
        _event("rfc-no-offset", "2026-01-01T00:00:07"),
        _event("rfc-space", "2026-01-01 00:00:08Z"),
        _event("rfc-bad-offset", "2026-01-01T00:00:09+24:00"),
        _event("ts-float", float(BASE + 1_000)),
        _event("ts-bool", True),
        _event("ts-digits-string", str(BASE)),
        _event("ts-null", None),
        {"event_id": "ts-missing", "page": "/"},
        _event("future-ahead", now_ms + MAX_FUTURE - 60_000),  # counts; stream time stops at now
        _event("future-beyond", now_ms + MAX_FUTURE + 3_600_000),
        _event("future-created", CREATE_TIME + MAX_FUTURE + 1),  # valid by the broker's clock
        _event("far-past", -62_135_596_800_001),
        _event("year-1", -62_135_596_800_000),
        _event("year-1-text", "0001-01-01T00:00:00.001Z", page="/y1"),
        {"ts": BASE, "page": "/", "user_id": "u1", "latency_ms": 1},
        _event(1.5),
        _event(True),
        _event(None),
        _event(7, page=7),
        _event("7", page="7"),
        _event("dup-a", page="/dup"),
        _event("dup-a", page="/dup"),
        _event("page-bool", page=True),
        _event("page-float", page=1.0),
        _event("page-object", page={"x": 1}),
        _event("page-empty", page=""),
        _event("page-unicode", page="/ü/日本"),
        _event("latency-bool", latency_ms=False),
        _event("latency-string", latency_ms="10"),
        _event("latency-float", latency_ms=0.25),
        _event("latency-negative", latency_ms=-3),
        _event("user-float", user_id=2.5),
        _event("user-int", user_id=2),
        _event("user-int-as-string", user_id="2"),
        {k: v for k, v in _event("page-missing").items() if k != "page"},
        {k: v for k, v in _event("latency-missing").items() if k != "latency_ms"},
        {k: v for k, v in _event("user-missing").items() if k != "user_id"},
        # what the stores cannot hold (issue #26): each is refused the same way everywhere
        _event("page-nul", page="a\x00b"),
        _event("id-nul\x00"),
        _event("i" * 1025),
        _event("i" * 1024),
        _event("page-too-long", page="p" * 1025),
        _event("page-longest", page="é" * 512),
        _event("latency-max-a", page="/max", latency_ms=1.7e308),
        _event("latency-max-b", page="/max", latency_ms=1.7e308),
        _event("latency-min", page="/max", latency_ms=-1.7e308),
        _event("latency-2-63", latency_ms=2**63),
        _event("latency-below-2-63", latency_ms=-(2**63 - 2**11)),
    ]
    raw: list[bytes | None] = [orjson.dumps(e) for e in json_events]
    raw += [
        b"not json",
        b"[1, 2]",
        b'"a string"',
        b"",
        None,
        b'{"ts": NaN, "event_id": "nan"}',
        b'{"ts": %d, "event_id": "\\ud800", "page": "/"}' % BASE,
        b"\xff\xfe{}",
        b"[" * 5000 + b"]" * 5000,
        b'{"ts": %d, "event_id": "dup-keys", "page": "/a", "page": "/b", "user_id": "u",'
        b' "latency_ms": 1}' % BASE,
        b'{"ts": %d, "event_id": "huge-page", "page": 123456789012345678901234567890,'
        b' "user_id": "u", "latency_ms": 1}' % BASE,
        b'{"ts": %d, "event_id": "latency-inf", "page": "/", "user_id": "u",'
        b' "latency_ms": 1e400}' % BASE,
        b'{"ts": %d, "event_id": "latency-huge-int", "page": "/", "user_id": "u",'
        b' "latency_ms": 123456789012345678901234567890}' % BASE,
    ]
    return raw


def produce_corpus(bootstrap: str, topic: str) -> int:
    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True})
    records = corpus(int(time.time() * 1000))
    for i, value in enumerate(records):
        producer.produce(
            topic,
            key=b"same-partition",
            value=value,
            timestamp=CREATE_TIME,
            headers=[("n", str(i).encode())],
        )
    assert producer.flush(30) == 0
    return len(records)


def dead_letter_keys(bootstrap: str, topic: str, partitions: int) -> set[bytes]:
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"dlq-{topic}",
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
        }
    )
    keys: set[bytes] = set()
    try:
        for p in range(partitions):
            end = consumer.get_watermark_offsets(
                TopicPartition(topic, p), timeout=10, cached=False
            )[1]
            if not end:
                continue
            consumer.assign([TopicPartition(topic, p, 0)])
            deadline = time.monotonic() + 30
            while consumer.position([TopicPartition(topic, p)])[0].offset < end:
                assert time.monotonic() < deadline, "dead letter topic not readable"
                for message in consumer.consume(500, timeout=1):
                    keys.add(message.key())
    finally:
        consumer.close()
    return keys


def test_speed_batch_and_oracle_agree_on_the_edge_corpus(platform: Platform, spark: Any) -> None:
    settings = platform.settings
    source = settings.sources[0]
    bootstrap = settings.kafka.bootstrap_servers
    create_topics(settings)
    before_ms = int(time.time() * 1000)
    produced = produce_corpus(bootstrap, source.topic)
    records = oracle.read_topic(bootstrap, source.topic)
    assert len(records) == produced
    assert min(r.create_time_ms for r in records) >= before_ms - 1_000  # the broker's clock
    expected = oracle.compute(platform.config, records, late_rule=True)
    everything = oracle.compute(platform.config, records)
    malformed_total = sum(expected.malformed.values())
    assert malformed_total >= 20 and expected.duplicates >= 2
    assert expected.malformed["time_in_future"] == 1
    assert everything.cells[("views_by_page", 60_000, BASE + 60_000, ("/reused",))]["count"] == 1

    drain_with_worker(platform, platform.config_path.with_name("speed.log"))
    assert oracle.compare(expected.cells, speed_view_cells(platform.settings)) == []
    assert len(dead_letter_keys(bootstrap, source.dlq_topic, source.partitions)) == (
        malformed_total
    )

    with connect(settings.postgres.url, autocommit=True) as conn:
        run_id = queue_run(conn, RunRequest("full"))[0]
    summary = run_full(settings, spark, run_id)
    assert summary.malformed == malformed_total
    assert summary.skipped == {m: n for m, n in everything.skipped.items() if n}
    with connect(settings.postgres.url, autocommit=True) as conn:
        batch = batch_view_cells(settings, conn)
    assert oracle.compare(everything.cells, batch) == []
