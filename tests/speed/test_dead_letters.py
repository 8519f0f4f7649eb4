"""Malformed records: every one in `<source>.dlq` with its reason, the worker keeps running,
and the valid events' cells still equal the oracle."""

from __future__ import annotations

import time
from collections import Counter
from pathlib import Path

import orjson
import pytest
from confluent_kafka import Producer

from shared.kafka import create_topics
from tests import oracle
from tests.conftest import Platform
from tests.speed.support import (
    expected_base_cells,
    side_topic,
    speed_cells,
    start_worker,
    stop_worker,
    wait_until_applied,
)

pytestmark = [pytest.mark.services, pytest.mark.timeout(180)]


def test_malformed_records_go_to_the_dlq(platform: Platform, tmp_path: Path) -> None:
    settings = platform.settings
    topic = settings.sources[0].topic
    bootstrap = settings.kafka.bootstrap_servers
    create_topics(settings)
    now = int(time.time() * 1000)
    good = {"page": "/", "user_id": "u1", "latency_ms": 3.5}
    values: list[bytes] = [
        b"not json at all",
        b"[1, 2, 3]",
        b"\xff\xfe",
        b'{"ts": NaN, "event_id": "n"}',
        orjson.dumps({**good, "event_id": "m1"}),
        orjson.dumps({**good, "ts": "yesterday", "event_id": "m2"}),
        orjson.dumps({**good, "ts": True, "event_id": "m3"}),
        orjson.dumps({**good, "ts": 1.5e12, "event_id": "m4"}),
        orjson.dumps({**good, "ts": "2024-01-01T00:00:00", "event_id": "m5"}),
        orjson.dumps({**good, "ts": now + 3_600_000, "event_id": "m6"}),
        orjson.dumps({**good, "ts": now, "event_id": 1.5}),
        orjson.dumps({**good, "ts": now}),
        b"x" * (1024 * 1024 - 200),
        orjson.dumps({**good, "ts": now, "event_id": "big", "pad": "y" * (900 * 1024)}),
        orjson.dumps({**good, "ts": now, "event_id": 7, "page": 7}),
        orjson.dumps({**good, "ts": now, "event_id": "s1", "latency_ms": "fast"}),
        orjson.dumps({**good, "ts": now, "event_id": "s2", "page": None}),
    ]
    for i in range(300):
        values.append(orjson.dumps({**good, "ts": now - i * 1000, "event_id": f"ok-{i}"}))
    producer = Producer({"bootstrap.servers": bootstrap, "message.max.bytes": 4 * 1024 * 1024})
    for i, value in enumerate(values):
        producer.produce(topic, key=str(i % 7).encode(), value=value)
    assert producer.flush(30) == 0

    worker = start_worker(platform, tmp_path / "worker.log")
    try:
        wait_until_applied(platform, workers=[worker])
        assert worker.poll() is None
    finally:
        assert stop_worker(worker) == 0

    records = oracle.read_topic(bootstrap, topic)
    assert len(records) == len(values), "the broker refused a record"
    want, result = expected_base_cells(platform, records)
    assert oracle.compare(want, speed_cells(platform)) == []
    dead = side_topic(platform, ".dlq")
    assert len({key for key, _, _ in dead}) == len(dead)
    reasons = Counter(headers["reason"] for _, _, headers in dead)
    assert sum(reasons.values()) == sum(result.malformed.values()) == 13
    by_offset = {f"{topic}:{r.partition}:{r.offset}": r.value or b"" for r in records}
    for key, dead_value, headers in dead:
        assert headers["reason"]
        assert headers["detail"], "a dead letter says what is wrong with it"
        if headers["reason"].startswith(("time", "id")):
            field = "'ts'" if headers["reason"].startswith("time") else "'event_id'"
            assert field in headers["detail"], headers
        if "truncated" in headers:
            assert by_offset[key][: len(dead_value or b"")] == dead_value
        else:
            assert by_offset[key] == dead_value
