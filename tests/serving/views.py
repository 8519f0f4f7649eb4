"""Writes a batch generation and speed sub-cells straight in the stores' formats, so serving
tests control W and every cell without running Spark or Faust."""

from __future__ import annotations

import random
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from batch_layer.publish import Publication, publish_full_generation
from shared.aggregations import CellState, encode_state, fold_inputs
from shared.config import Settings
from shared.db.cells import BatchCell
from shared.db.connect import connect
from shared.metric_plan import MetricPlan, versions_of
from shared.speed_view import EPOCH_KEY, cell_key, encode_key, fence_key, redis_client
from shared.windows import window_start
from tests import oracle


@dataclass(frozen=True)
class Event:
    time_ms: int
    key: tuple[str, ...]
    value: float
    user: str


def key_of(metric: MetricPlan, event: Event) -> tuple[str, ...]:
    return event.key if metric.key else ()


def _state(metric: MetricPlan, events: Sequence[Event]) -> CellState:
    """The events' state: each sketch fed the event's user (text) or value (number)."""
    items = [[e.value if i.number else e.user for e in events] for i in metric.sketch_inputs]
    values = [e.value for e in events] if metric.value else None
    return fold_inputs(metric.kinds, None, values, items, len(events))


def batch_rows(
    settings: Settings, metric: MetricPlan, events: Sequence[Event], watermark: int
) -> list[BatchCell]:
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
            identity = BatchCell(
                metric.name, version, size, start, list(key), 0, 0.0, None, None, [], []
            )
            rows.append(identity.with_state(_state(metric, group), metric.kinds))
    return rows


def publish(settings: Settings, rows: list[BatchCell], watermarks: dict[str, int]) -> int:
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


def load_views(settings: Settings, events: Sequence[Event], watermark: int, seed: int) -> None:
    """Both views of the events for every metric: a new full generation with W = `watermark`
    and the speed sub-cells of the rest."""
    rows, ws = [], {}
    for metric in settings.plans.values():
        rows += batch_rows(settings, metric, events, watermark)
        ws[metric.name] = watermark
        write_speed(settings, metric, events, watermark, seed)
    publish(settings, rows, ws)


def write_speed(
    settings: Settings,
    metric: MetricPlan,
    events: Sequence[Event],
    watermark: int | None,
    seed: int = 0,
) -> None:
    """Sub-cells of the events in base cells after W, spread over the source's partitions."""
    client = redis_client(settings.redis)
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
            cell_key(metric.source.topic, partition, metric.name, version, start),
            encode_key(key),
            encode_state(_state(metric, group)),
        )
    source = metric.source
    for p in range(partitions):
        pipe.hset(fence_key(source.topic, p), mapping={"offset": 10 + p, "stream_time": 0})
    pipe.execute()


def expected(metric: MetricPlan, events: Iterable[Event]) -> dict[str, Any]:
    """Brute force: the configured outputs over the events (exact distinct counts; exact
    quantiles, which the oracle's `compare` judges by rank)."""
    events = list(events)
    values = [e.value for e in events]
    out: dict[str, Any] = {
        "count": len(events),
        "sum": sum(values),
        "min": min(values),
        "max": max(values),
        "avg": sum(values) / len(events),
    }
    for i in metric.sketch_inputs:
        if not i.number:
            out[f"distinct_{i.field}"] = len({e.user for e in events})
    for q in oracle.DEFAULT_QUANTILES:
        out[oracle.quantile_name(q)] = oracle.ExactQuantile(q, values)
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
