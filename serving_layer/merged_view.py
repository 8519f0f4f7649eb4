"""Rule 8 at query time: read W and the batch cells in one snapshot, the speed sub-cells after W
from Redis (one pipeline), and compose each window from them."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import psycopg
import redis

from serving_layer.timefmt import format_time
from shared.aggregates import AggState, merge_all, outputs_of, sketch_from_bytes
from shared.config import MetricConfig, Settings
from shared.db.served import read_served
from shared.speed_store import EPOCH_KEY, REBUILDING_KEY, encode_key, read_cells
from shared.windows import CellRef, WindowPlan, plan_window, point_source

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class BatchCell:
    count: int
    total: float
    minimum: float | None
    maximum: float | None
    sketches: list[bytes]
    estimates: list[float]

    def state(self) -> AggState:
        return AggState(
            self.count,
            self.total,
            float("inf") if self.minimum is None else self.minimum,
            float("-inf") if self.maximum is None else self.maximum,
            [sketch_from_bytes(b) for b in self.sketches],
        )


@dataclass
class Series:
    watermark_ms: int | None
    speed_status: str
    points: list[dict[str, Any]]


def speed_status(client: redis.Redis) -> str:
    """ok, rebuilding (Redis lost its data or a rebuild runs), or unavailable (Redis down)."""
    try:
        pipe = client.pipeline(transaction=False)
        pipe.exists(EPOCH_KEY)
        pipe.scard(REBUILDING_KEY)
        has_epoch, rebuilding = pipe.execute()
    except redis.RedisError:
        return "unavailable"
    return "ok" if has_epoch and not rebuilding else "rebuilding"


def read_series(
    settings: Settings,
    conn: psycopg.Connection[Any],
    client: redis.Redis,
    metric: MetricConfig,
    window_ms: int,
    starts: Sequence[int],
    key: tuple[str, ...],
) -> Series:
    version = settings.metric_version(metric)
    with conn.transaction():
        conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        served = read_served(conn)
        watermark = None if served is None else served.watermark(metric.name, version)
        plans = [
            plan_window(start, window_ms, metric.base_window, watermark, metric.windows)
            for start in starts
        ]
        batch = (
            _read_batch_cells(conn, served.generation, metric.name, version, key, plans)
            if served is not None and watermark is not None
            else {}
        )
    status = speed_status(client)
    speed: dict[int, list[bytes]] = {}
    speed_starts = sorted({s for plan in plans for s in plan.speed_cells})
    if status != "unavailable" and speed_starts:
        source = settings.source(metric.source)
        try:
            cells = read_cells(client, metric.name, version, speed_starts, source.partitions, key)
        except redis.RedisError:
            status, cells = "unavailable", {}
        encoded = encode_key(key)
        speed = {start: by_key[encoded] for start, by_key in cells.items() if encoded in by_key}
    points = []
    for start, plan in zip(starts, plans, strict=True):
        values = _compose(metric, plan, batch, speed)
        if values is None:
            continue
        end = start + window_ms
        points.append(
            {
                "start": format_time(start),
                "end": format_time(end),
                "source": point_source(start, end, watermark),
                **values,
            }
        )
    return Series(watermark, status, points)


def _compose(
    metric: MetricConfig,
    plan: WindowPlan,
    batch: dict[CellRef, BatchCell],
    speed: dict[int, list[bytes]],
) -> dict[str, Any] | None:
    batch_parts = [batch[ref] for ref in plan.batch_cells if ref in batch]
    speed_parts = [state for start in plan.speed_cells for state in speed.get(start, [])]
    if len(batch_parts) == 1 and not speed_parts:
        only = batch_parts[0]
        return outputs_of(
            metric,
            only.count,
            only.total,
            float("inf") if only.minimum is None else only.minimum,
            float("-inf") if only.maximum is None else only.maximum,
            only.estimates,
        )
    merged = merge_all(
        [cell.state() for cell in batch_parts] + [AggState.from_bytes(s) for s in speed_parts]
    )
    return None if merged is None or merged.count == 0 else merged.outputs(metric)


def _read_batch_cells(
    conn: psycopg.Connection[Any],
    generation: int,
    metric: str,
    version: str,
    key: tuple[str, ...],
    plans: Sequence[WindowPlan],
) -> dict[CellRef, BatchCell]:
    refs = sorted({ref for plan in plans for ref in plan.batch_cells})
    if not refs:
        return {}
    rows = conn.execute(
        """
        SELECT window_ms, start_ms, count, sum, min, max, sketches, distinct_estimates
        FROM batch_cells
        WHERE generation = %s AND metric = %s AND version = %s AND key = %s
          AND (window_ms, start_ms) IN (SELECT * FROM unnest(%s::bigint[], %s::bigint[]))
        """,
        [
            generation,
            metric,
            version,
            list(key),
            [r.size_ms for r in refs],
            [r.start_ms for r in refs],
        ],
    ).fetchall()
    return {
        CellRef(row[0], row[1]): BatchCell(
            row[2], row[3], row[4], row[5], [bytes(b) for b in row[6]], list(row[7])
        )
        for row in rows
    }
