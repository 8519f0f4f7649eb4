"""The serving layer's reads of the batch view (PostgreSQL, rule 6): the served row and the
cells of its generation in one statement, so one snapshot. A read is planned against the W last
seen for the metric (`ServedHints`) and guarded by it: the statement returns the served row,
and cells are only joined when the row still holds that stamp. When a run has flipped
meanwhile, the plan is redone with the new row — one round trip in the common case, and never
a plan from one W with cells from another."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from psycopg import sql

from serving_layer.caches import ServedHints
from serving_layer.errors import BatchViewUnsettled
from serving_layer.pools import AsyncDb
from serving_layer.selection import Selection
from shared.metric_plan import MetricPlan

_GUARD_RETRIES = 4


@dataclass
class Served:
    generation: int | None
    watermark: int | None
    """W of the metric, None when nothing of this metric's version is served."""


_SERVED_CTE = """
WITH s AS (
    SELECT generation, (watermarks ->> %(metric)s)::bigint AS w, versions ->> %(metric)s AS v,
           xmin::text AS x
    FROM served_view WHERE id = 1
)
"""

_SERVED_SQL = _SERVED_CTE + "SELECT s.generation, s.w, s.v, NULL, s.x FROM s"
"""The served row alone, shaped like a cell read that found nothing: when every cell a read
needs is cached, this is the whole statement."""

SERIES_SQL = (
    _SERVED_CTE
    + """
SELECT s.generation, s.w, s.v, c.window_ms, c.start_ms, c.count, c.sum, c.min, c.max,
       CASE WHEN p.need THEN c.sketches END, c.sketch_summaries, s.x
FROM s
LEFT JOIN unnest(%(sizes)s::bigint[], %(starts)s::bigint[], %(needs)s::boolean[])
    AS p(window_ms, start_ms, need)
    ON s.x = %(x)s AND s.v = %(version)s
LEFT JOIN LATERAL (
    SELECT * FROM batch_cells c
    WHERE c.generation = %(generation)s AND c.metric = %(metric)s AND c.version = %(version)s
      AND c.window_ms = p.window_ms AND c.start_ms = p.start_ms AND c.key = %(key)s
    OFFSET 0
) c ON true
"""
)
"""One key's cells at the given (window, start)s, each found by its primary key. `OFFSET 0`
keeps the planner from flattening the lookup into a join: for a key it estimates at one row
(a rollup's only key, `{}`) it then scanned every cell of the metric's version once per cell
asked for (a day's total: 1,526 rows x 30 cells, 11 ms, where the lookups take 0.1 ms)."""

_FILTERED_CELLS = """
FROM s
LEFT JOIN unnest(%(sizes)s::bigint[], %(starts)s::bigint[]) AS p(window_ms, start_ms)
    ON s.x = %(x)s AND s.v = %(version)s
LEFT JOIN LATERAL (
    SELECT * FROM batch_cells c
    WHERE c.generation = %(generation)s AND c.metric = %(metric)s AND c.version = %(version)s
      AND c.window_ms = p.window_ms AND c.start_ms = p.start_ms{filters}
    OFFSET 0
) c ON true
LIMIT %(limit)s
"""
"""Every key's cells at the given (window, start)s that pass the filters, at most `limit`
(each (window, start) a range of the primary key, as in `SERIES_SQL`)."""

SLICE_SQL = sql.SQL(
    _SERVED_CTE
    + """
SELECT s.generation, s.w, s.v, c.window_ms, c.start_ms, c.key, c.count, c.sum, c.min, c.max,
       c.sketches, c.sketch_summaries, s.x"""
    + _FILTERED_CELLS
)
"""What a sliced series groups and merges."""

TOP_SQL = sql.SQL(
    _SERVED_CTE
    + """
SELECT s.generation, s.w, s.v, c.key, c.count, c.sum, c.min, c.max,
       CASE WHEN %(sketch)s::int > 0 AND %(union)s THEN c.sketches[%(sketch)s] END,
       CASE WHEN %(sketch)s::int > 0 THEN c.sketch_summaries[%(sketch)s] END, s.x"""
    + _FILTERED_CELLS
)
"""What `top` ranks: each key's plain columns and the ranked aggregation's sketch slot."""

KEYS_SQL = sql.SQL(
    _SERVED_CTE
    + """
SELECT s.generation, s.w, s.v, k.key
FROM s
LEFT JOIN LATERAL (
    SELECT DISTINCT c.key FROM batch_cells c
    WHERE c.generation = s.generation AND c.metric = %(metric)s AND c.version = %(version)s
      AND s.w IS NOT NULL AND c.window_ms = %(base)s AND c.start_ms >= %(start)s
      AND c.start_ms < LEAST(%(end)s, s.w - %(base)s + 1)
      AND (%(prefix)s::text IS NULL OR left(c.key[1], length(%(prefix)s::text)) = %(prefix)s)
      {filters}
) k ON s.v = %(version)s
"""
)


class BatchViewReader:
    """Guarded reads of the served generation, planned against the hinted served row."""

    def __init__(self) -> None:
        self.hints = ServedHints()

    async def guarded(
        self,
        db: AsyncDb,
        metric: MetricPlan,
        query: str | sql.Composed,
        params_for: Callable[[str | None, int | None], dict[str, Any]],
    ) -> tuple[Served, str | None, list[tuple[Any, ...]]]:
        """Run a cell read planned against the hinted row until the served row agrees with it.
        `params_for(stamp, W)` plans the read; the rows are those of its last call."""
        version = metric.version
        stamp, generation, watermark = self.hints.get(metric.name)
        for _ in range(_GUARD_RETRIES):
            params = params_for(stamp, watermark)
            params.update(metric=metric.name, version=version, x=stamp, generation=generation)
            statement = query if params["sizes"] else _SERVED_SQL
            async with db.connection() as conn:
                rows = await (await conn.execute(statement, params)).fetchall()
            if not rows:
                served, row_stamp = Served(None, None), None
            else:
                row_version = rows[0][2]
                served = Served(rows[0][0], rows[0][1] if row_version == version else None)
                row_stamp = rows[0][-1]
            self.hints.set(metric.name, row_stamp, served.generation, served.watermark)
            if served.watermark is None:
                return served, row_stamp, []
            if row_stamp == stamp:
                return served, row_stamp, rows
            stamp, generation, watermark = row_stamp, served.generation, served.watermark
        raise BatchViewUnsettled("the batch view changed during the read several times; retry")

    async def keys(
        self,
        db: AsyncDb,
        metric: MetricPlan,
        start: int,
        end: int,
        prefix: str | None,
        selection: Selection,
    ) -> tuple[int | None, set[tuple[str, ...]]]:
        """W and the keys passing the filters with a base cell in `[start, end)` before W."""
        condition, filters = selection.sql_condition("c.key")
        async with db.connection() as conn:
            cursor = await conn.execute(
                KEYS_SQL.format(filters=condition),
                {
                    **filters,
                    "metric": metric.name,
                    "version": metric.version,
                    "base": metric.base_window_ms,
                    "start": start,
                    "end": end,
                    "prefix": prefix if metric.key else None,
                },
            )
            rows = await cursor.fetchall()
        watermark = rows[0][1] if rows and rows[0][2] == metric.version else None
        return watermark, {tuple(row[3]) for row in rows if row[3] is not None}
