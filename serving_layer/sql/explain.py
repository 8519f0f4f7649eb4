"""`EXPLAIN <statement>`: a compiled statement's plan against the served row (docs/sql.md)."""

from __future__ import annotations

from serving_layer.merged_view import MergedView
from serving_layer.pools import AsyncDb
from serving_layer.query import KeysQuery, SessionsQuery, TopQuery, TotalQuery, answering_plan
from serving_layer.read_plan import Answer
from serving_layer.selection import Selection
from serving_layer.sql.statement import SqlStatement
from serving_layer.timefmt import format_time
from shared.durations import format_duration


async def explain(statement: SqlStatement, view: MergedView, db: AsyncDb) -> Answer[list[str]]:
    """The plan of a compiled statement, a line each, against the served row this process
    holds (none before its first read): what it reads (the metric or the rollup chosen), its
    windows, and how many come from each view by their position against W (rule 8 in
    docs/semantics.md). Nothing is read but the row and the speed view's status."""
    query = statement.query
    metric = query.metric
    served = None if db.served is None else await db.served.row_for(metric)
    watermark = None if served is None else served.watermark
    speed_status = await view.speed.status()
    if isinstance(query, KeysQuery | SessionsQuery):
        span = _range(query.start_ms, query.end_ms)
        if isinstance(query, KeysQuery):
            lines, selection = [f"Keys of {metric.name} with a cell in {span}"], query.selection
        else:
            key = dict(zip(metric.key, query.key, strict=True))
            lines = [f"Sessions of {metric.name} for {key} starting in {span}"]
            selection = Selection(metric.key, tuple((d, frozenset({v})) for d, v in key.items()))
        reads, windows = metric, [(query.start_ms, query.end_ms)]
    else:
        reads, selection = answering_plan(view.settings, metric, query.selection)
        if isinstance(query, TopQuery):
            window = (query.start_ms, query.end_ms)
            lines = [f"Top {query.n} groups of {metric.name} by {query.by} over {_range(*window)}"]
            windows = [window]
        elif isinstance(query, TotalQuery):
            windows = [(query.start_ms, query.end_ms)]
            lines = [f"Total of {metric.name} over {_range(*windows[0])}"]
        else:
            spec = query.spec
            windows = spec.windows(query.start_ms, query.end_ms)
            size = format_duration(spec.size_ms)
            step = "" if spec.step_ms == spec.size_ms else f" every {format_duration(spec.step_ms)}"
            zone = "" if spec.tz is None else f" in {spec.tz}"
            lines = [
                f"Series of {metric.name}: {len(windows)} windows of {size}{step}{zone} starting "
                f"in {_range(query.start_ms, query.end_ms)}"
            ]
    rollup = "" if reads is metric else " (the smallest rollup keeping every dimension used)"
    lines.append(f"  reads {reads.name}{rollup}")
    if selection.filters:
        filters = " AND ".join(
            f"{d} IN ({', '.join(map(repr, sorted(v)))})" for d, v in selection.filters
        )
        lines.append(f"  filters: {filters}")
    if selection.group_by:
        lines.append(f"  group by: {', '.join(selection.group_by)}")
    if watermark is None:
        lines.append("  W: none served yet (every window from the speed view)")
    else:
        batch = sum(1 for _, end in windows if end <= watermark)
        speed = sum(1 for start, _ in windows if start >= watermark)
        lines.append(
            f"  W = {format_time(watermark)}; windows from the batch view: {batch}, "
            f"straddling W: {len(windows) - batch - speed}, from the speed view: {speed}"
        )
    batch_status = "ok" if served is None or served.reachable else "unavailable"
    return Answer(lines, watermark, speed_status, batch_status)


def _range(start_ms: int, end_ms: int) -> str:
    return f"[{format_time(start_ms)}, {format_time(end_ms)})"
