"""`SourceProcessor` without Kafka: its per-batch path against the brute-force oracle, for
any batch split (rules 2 and 4 decided per event in offset order, whatever the batch).

The records go straight to the processor, which applies them through the real
`SpeedViewWriter` on the test Redis database, so every split of the records, down to one
record a batch, exercises de-duplication against ids applied by earlier batches and merges
with stored states: this keeps `decide` (tested without Redis in `test_decide`) honest on the
real store."""

from __future__ import annotations

from collections import Counter
from typing import Any

import orjson
import pytest

from lambdactl.generator import GeneratorSpec, generate
from shared.config import Settings
from shared.speed_view import (
    APPLIED,
    FENCE_MOVED,
    SpeedViewWriter,
    SyncRedis,
    fence_key,
)
from shared.speed_view.keys import cell_pattern
from speed_layer.processor import RawRecord, SourceProcessor
from tests import oracle
from tests.conftest import platform_config
from tests.speed.support import USER_SESSIONS, view_client
from tests.views import speed_view_cells

MINUTE = 60_000
T0 = 1_704_067_200_000


pytestmark = [pytest.mark.services, pytest.mark.timeout(300)]


@pytest.fixture
def client(stack: Settings) -> SyncRedis:
    return view_client(stack)


def _config() -> dict[str, Any]:
    config = platform_config("proc", partitions=1)
    config["metrics"].append(
        {
            "name": "by_page_country",
            "source": "pageviews",
            "key": ["page", "country"],
            "value": "latency_ms",
            "aggregations": ["count", "sum", "min", "max", "distinct(user_id)", "distinct(page)"],
            "windows": ["5m"],
            "grace": "30s",
        }
    )
    config["metrics"].append(USER_SESSIONS)  # sessions: buckets rebuilt, fields removed
    return config


def _values() -> list[bytes]:
    """Sample events (late, out of order, duplicated, malformed) and metric-level edge cases."""
    spec = GeneratorSpec(T0, T0 + 40 * MINUTE, 3_000, malformed_fraction=0.03, seed=11)
    values = [record.value for record in generate(spec)]
    t = T0 + 20 * MINUTE
    edge = [
        {"ts": t, "event_id": "e1", "page": 7, "country": "nl", "user_id": 42, "latency_ms": 3},
        {"ts": t, "event_id": 8, "page": "7", "country": "nl", "user_id": "42", "latency_ms": 1.5},
        {"ts": t, "event_id": "e3", "page": "/x", "user_id": "u", "latency_ms": True},
        {"ts": t, "event_id": "e4", "page": None, "country": "be", "user_id": "u"},
        {"ts": t, "event_id": "e5", "country": "be", "user_id": "u", "latency_ms": 2},
        {"ts": t, "event_id": "e6", "page": "/y", "country": "be", "latency_ms": 2},
        {"ts": t, "event_id": "e7", "page": "/y", "country": ["x"], "user_id": 1, "latency_ms": 2},
        {
            "ts": t,
            "event_id": "e8",
            "page": "/z",
            "country": "de",
            "user_id": "v",
            "latency_ms": 1e20,
        },
        {"ts": "2024-01-01T00:20:00.5+01:00", "event_id": "e9", "page": "/z", "user_id": "v"},
        {"ts": t, "event_id": "e1", "page": "/dup", "user_id": "dup", "latency_ms": 9},
    ]
    values[1_000:1_000] = [orjson.dumps(e) for e in edge]
    values.insert(1_500, b'{"ts": %d, "event_id": "e10", "page": "p", "latency_ms": 1e999}' % t)
    values.insert(1_600, b'{"ts": %d, "event_id": "e11", "page": 100000000000000000000}' % t)
    return values


def _stored_cells(client: SyncRedis, settings: Settings) -> dict[str, dict[bytes, bytes]]:
    return {
        name.decode(): client.hgetall(name)
        for m in settings.plans.values()
        for name in client.scan_iter(cell_pattern(m.source.topic, m.name, m.version))
    }


@pytest.mark.parametrize("batch_size", [1, 7, 500, 5_000])
@pytest.mark.parametrize("watermark", [None, T0 + 10 * MINUTE], ids=["no-W", "W"])
def test_any_batch_split_matches_the_oracle(
    client: SyncRedis, batch_size: int, watermark: int | None
) -> None:
    config = _config()
    settings = Settings(**config)
    source = settings.sources[0]
    create_time = T0 + 60 * MINUTE
    records = [RawRecord(i, create_time, v) for i, v in enumerate(_values())]
    watermarks = {m.name: watermark for m in settings.metrics}

    store = SpeedViewWriter(client, 86_400)
    processor = SourceProcessor(settings, source, store, lambda *_: None)  # type: ignore[arg-type]
    dead: Counter[str] = Counter()
    late: Counter[str] = Counter()
    skipped: Counter[str] = Counter()
    duplicates = 0
    late_offsets: list[int] = []
    for i in range(0, len(records), batch_size):
        outcome = processor.process(0, records[i : i + batch_size], watermarks)
        assert outcome.status == APPLIED
        dead.update(item.why for item in outcome.dead_letters)
        late.update(outcome.late_by_metric)
        for (name, _reason), n in outcome.skipped.items():
            skipped[name] += n
        duplicates += outcome.duplicates
        late_offsets += [item.offset for item in outcome.late]
        for item in outcome.late:
            assert set(item.why.split(",")) <= set(watermarks)
    assert store.read_fence(source.topic, 0).offset == len(records) - 1
    assert late_offsets == sorted(late_offsets)

    expected = oracle.compute(
        config,
        [oracle.Record(source.topic, 0, r.offset, r.timestamp, r.value) for r in records],
        late_rule=True,
        watermarks={k: v for k, v in watermarks.items() if v is not None},
    )
    want = {c: v for c, v in expected.cells.items() if c[1] != 0}  # not the sessions themselves
    assert oracle.compare(want, speed_view_cells(settings, client)) == []
    assert sum(dead.values()) == sum(expected.malformed.values())
    assert duplicates == expected.duplicates
    assert {k: v for k, v in late.items() if v} == {k: v for k, v in expected.late.items() if v}
    assert {k: v for k, v in skipped.items() if v} == {
        k: v for k, v in expected.skipped.items() if v
    }
    assert store.read_fence(source.topic, 0).stream_time == expected.stream_time[(source.topic, 0)]


def test_a_fence_moved_by_another_worker_discards_the_batch(client: SyncRedis) -> None:
    settings = Settings(**_config())
    store = SpeedViewWriter(client, 86_400)
    processor = SourceProcessor(
        settings,
        settings.sources[0],
        store,
        lambda *_: None,  # type: ignore[arg-type]
    )
    values = _values()[:100]
    first = [RawRecord(i, T0 + 60 * MINUTE, v) for i, v in enumerate(values[:50])]
    assert processor.process(0, first, {}).status == APPLIED
    client.hset(fence_key(settings.sources[0].topic, 0), "offset", 70)  # another worker
    cells_before = _stored_cells(client, settings)
    rest = [RawRecord(i, T0 + 60 * MINUTE, v) for i, v in enumerate(values[50:], 50)]
    assert processor.process(0, rest, {}).status == FENCE_MOVED
    assert _stored_cells(client, settings) == cells_before
    assert processor.known_fence(0) is None
