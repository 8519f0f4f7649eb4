"""Writes a batch generation and speed sub-cells straight in the stores' formats, so serving
tests control W and every cell without running Spark or Faust."""

from __future__ import annotations

import random
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import redis

from batch_layer.publish import Publication, publish_full_generation
from shared.aggregates import AggState
from shared.config import Settings
from shared.db.connect import connect
from shared.metric_plan import MetricPlan, versions_of
from shared.speed_store import EPOCH_KEY, cell_key, encode_key, fence_key
from shared.windows import window_start


@dataclass(frozen=True)
class Event:
    time_ms: int
    key: tuple[str, ...]
    value: float
    user: str


def key_of(metric: MetricPlan, event: Event) -> tuple[str, ...]:
    return event.key if metric.key else ()


def _state(metric: MetricPlan, events: Iterable[Event]) -> AggState:
    state = AggState.empty(len(metric.distinct_fields))
    for e in events:
        state.add(e.value if metric.value else None, [e.user] * len(metric.distinct_fields))
    return state


def batch_rows(
    settings: Settings, metric: MetricPlan, events: Sequence[Event], watermark: int
) -> list[tuple[Any, ...]]:
    """Every configured window's cells of the events in base cells ending at or before W."""
    version = metric.version
    base = metric.base_window_ms
    before = [e for e in events if window_start(e.time_ms, base) + base <= watermark]
    rows = []
    for size in metric.windows_ms:
        groups: dict[tuple[int, tuple[str, ...]], list[Event]] = defaultdict(list)
        for e in before:
            groups[(window_start(e.time_ms, size), key_of(metric, e))].append(e)
        for (start, key), group in groups.items():
            s = _state(metric, group)
            rows.append(
                (
                    metric.name,
                    version,
                    size,
                    start,
                    list(key),
                    s.count,
                    s.total,
                    s.minimum if s.count and metric.value else None,
                    s.maximum if s.count and metric.value else None,
                    [sk.serialize_compact() for sk in s.sketches],
                    s.distinct_estimates(),
                )
            )
    return rows


def publish(settings: Settings, rows: list[tuple[Any, ...]], watermarks: dict[str, int]) -> int:
    versions = versions_of(settings.plans.values())
    publication = Publication(
        snapshot={s.topic: {} for s in settings.sources},
        watermarks=watermarks,
        rebuild_from={s.topic: {} for s in settings.sources},
        versions={m: versions[m] for m in watermarks},
    )
    with connect(settings.postgres.url) as conn:
        generation, _ = publish_full_generation(conn, rows, [], [], publication)
        conn.commit()
    return generation


def write_speed(
    settings: Settings,
    metric: MetricPlan,
    events: Sequence[Event],
    watermark: int | None,
    seed: int = 0,
) -> None:
    """Sub-cells of the events in base cells after W, spread over the source's partitions."""
    client = redis.Redis.from_url(settings.redis.url)
    client.set(EPOCH_KEY, "test-epoch")
    version = metric.version
    base = metric.base_window_ms
    partitions = metric.source.partitions
    rng = random.Random(seed)
    groups: dict[tuple[int, int, tuple[str, ...]], list[Event]] = defaultdict(list)
    for e in events:
        start = window_start(e.time_ms, base)
        if watermark is None or start + base > watermark:
            groups[(start, rng.randrange(partitions), key_of(metric, e))].append(e)
    pipe = client.pipeline()
    for (start, partition, key), group in groups.items():
        pipe.hset(
            cell_key(metric.name, version, start, partition),
            encode_key(key),
            _state(metric, group).to_bytes(),
        )
    source = metric.source
    for p in range(partitions):
        pipe.hset(fence_key(source.topic, p), mapping={"offset": 10 + p, "stream_time": 0})
    pipe.execute()


def expected(metric: MetricPlan, events: Iterable[Event]) -> dict[str, Any]:
    """Brute force: the configured outputs over the events (exact distinct counts)."""
    events = list(events)
    values = [e.value for e in events]
    out: dict[str, Any] = {
        "count": len(events),
        "sum": sum(values),
        "min": min(values),
        "max": max(values),
        "avg": sum(values) / len(events),
    }
    for f in metric.distinct_fields:
        out[f"distinct_{f}"] = len({e.user for e in events})
    return {name: out[name] for name in metric.output_names}


def random_events(
    rng: random.Random, start: int, end: int, n: int, keys: Sequence[str]
) -> list[Event]:
    return [
        Event(
            rng.randrange(start, end),
            (rng.choice(keys),),
            round(rng.uniform(-50, 500), 3),
            f"u{rng.randrange(300)}",
        )
        for _ in range(n)
    ]
