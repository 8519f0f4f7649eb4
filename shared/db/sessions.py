"""The sessions of a session metric stored in the batch view (rule 13 in docs/semantics.md):
each is a cell of window 0 (`SESSION_WINDOW_MS`) starting at its first event, of the metric
(its events' aggregations) and of its `sessions` part (its duration)."""

from __future__ import annotations

from typing import Any

import psycopg

from shared.metric_plan import SESSION_WINDOW_MS, MetricPlan
from shared.sessions import Session

BOUNDARY_SQL = f"""
SELECT DISTINCT ON (p.key) p.key, p.start_ms, p.max, m.count
FROM batch_cells p
JOIN batch_cells m
  ON m.generation = p.generation AND m.metric = %(metric)s AND m.version = %(version)s
 AND m.window_ms = p.window_ms AND m.start_ms = p.start_ms AND m.key = p.key
WHERE p.generation = %(generation)s AND p.metric = %(part)s AND p.version = %(part_version)s
  AND p.window_ms = {SESSION_WINDOW_MS} AND p.start_ms >= %(after)s AND p.start_ms < %(watermark)s
ORDER BY p.key, p.start_ms DESC
"""


def boundary_sessions(
    conn: psycopg.Connection[Any],
    generation: int,
    metric: MetricPlan,
    part: MetricPlan,
    watermark: int,
) -> dict[tuple[str, ...], Session]:
    """Per key, the last session of `generation` starting before `watermark` (W), when it may
    reach W: it started at most `max_duration` before it. The speed layer continues each key
    from it (its seed)."""
    assert metric.sessions is not None
    rows = conn.execute(
        BOUNDARY_SQL,
        {
            "generation": generation,
            "metric": metric.name,
            "version": metric.version,
            "part": part.name,
            "part_version": part.version,
            "after": watermark - metric.sessions.rule.max_duration_ms,
            "watermark": watermark,
        },
    ).fetchall()
    return {
        tuple(key): Session(start, start + int(duration), events)
        for key, start, duration, events in rows
    }
