"""The serving layer's reads of the batch view (PostgreSQL, rule 6 in docs/semantics.md): the
served row and the cells of its generation in one statement, so one snapshot. A read is planned
against the W last seen for the metric (`ServedHints`) and guarded by it: the statement returns
the served row, and cells are only joined when the row still holds that stamp. When a run has
flipped meanwhile, the read is planned again with the new row — one round trip in the common
case, and never a plan from one W with cells from another. Rows come back typed (`ServedRow`,
`StoredCell`), matched to the statement's columns by name."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any, NamedTuple, Protocol, TypeVar, cast

import psycopg
from psycopg import AsyncCursor, sql
from psycopg.rows import RowMaker

from serving_layer.errors import BatchViewUnreachable, BatchViewUnsettled, TooManyCells
from serving_layer.pools import AsyncDb
from serving_layer.selection import Selection
from serving_layer.served_row import NOTHING_SERVED, ServedHints, ServedRow
from shared.aggregations import CellState
from shared.db.cells import state_of_columns
from shared.metric_plan import SESSION_WINDOW_MS, MetricPlan
from shared.windows import CellRef

_GUARD_RETRIES = 4


class StoredCell(NamedTuple):
    """One row of a cell read: one batch cell and the served row it was read under, in the
    statements' column order (psycopg makes each row one of these as it loads it: no second
    copy of a read of 10^5 rows). A column a statement does not select is NULL: the one-key
    read leaves out `key`; `top` selects one sketch slot, as a one-slot array; the served row
    alone has every cell column NULL (`_typed_rows` keeps only rows holding a cell)."""

    generation: int | None
    watermark: int | None
    version: str | None
    window_ms: int
    start_ms: int
    events: int
    """Its `count` column (a name a tuple's method holds)."""
    sum: float
    min: float | None
    max: float | None
    sketches: list[bytes] | None
    sketch_summaries: list[float | None] | None
    key: list[str] | None
    stamp: str | None

    @property
    def ref(self) -> CellRef:
        return CellRef(self.window_ms, self.start_ms)

    def state(self) -> CellState:
        return state_of_columns(
            self.events, self.sum, self.min, self.max, self.sketches, self.sketch_summaries
        )


_SERVED_CTE = """
WITH s AS (
    SELECT generation, (watermarks ->> %(metric)s)::bigint AS w, versions ->> %(metric)s AS v,
           xmin::text AS x
    FROM served_view WHERE id = 1
)
"""

_SERVED_SQL = (
    _SERVED_CTE
    + """
SELECT s.generation, s.w AS watermark, s.v AS version, NULL::bigint AS window_ms,
       NULL::bigint AS start_ms, NULL::bigint AS events, NULL::float8 AS sum,
       NULL::float8 AS min, NULL::float8 AS max, NULL::bytea[] AS sketches,
       NULL::float8[] AS sketch_summaries, NULL::text[] AS key, s.x AS stamp
FROM s"""
)
"""The served row alone: when every cell a read needs is cached, this is the whole statement."""

SERIES_SQL = (
    _SERVED_CTE
    + """
SELECT s.generation, s.w AS watermark, s.v AS version, c.window_ms, c.start_ms,
       c.count AS events, c.sum, c.min, c.max, CASE WHEN r.need THEN c.sketches END AS sketches,
       c.sketch_summaries, NULL::text[] AS key, s.x AS stamp
FROM s
LEFT JOIN unnest(%(run_sizes)s::bigint[], %(run_firsts)s::bigint[], %(run_ends)s::bigint[],
                 %(run_needs)s::boolean[]) AS r(window_ms, first_ms, end_ms, need)
    ON s.x = %(x)s AND s.v = %(version)s
LEFT JOIN LATERAL (
    SELECT * FROM batch_cells c
    WHERE c.generation = %(generation)s AND c.metric = %(metric)s AND c.version = %(version)s
      AND c.window_ms = r.window_ms AND c.key = %(key)s
      AND c.start_ms >= r.first_ms AND c.start_ms < r.end_ms
    OFFSET 0
) c ON true
"""
)
"""One key's cells, asked as runs (`CellRuns`): each run the consecutive cells of one window
from `first_ms` to `end_ms`, read as one range of the generation's index by key
(`by_key_index`): a 60-cell series is one or two leaf pages of it, where a lookup per cell
by the time-major primary key touched a leaf per cell (from disk, once the view outgrows
memory). `OFFSET 0` keeps the planner from flattening the lookup into a join: for a key it
estimates at one row (a rollup's only key, `{}`) it then scanned every cell of the metric's
version once per run."""


class CellRuns(NamedTuple):
    """Cells asked for, as runs of consecutive starts of one window and one `need` (whether
    the merge needs their sketches): the `SERIES_SQL` parameters of `runs_of`."""

    run_sizes: list[int]
    run_firsts: list[int]
    run_ends: list[int]
    run_needs: list[bool]


def runs_of(needs: Mapping[CellRef, bool]) -> CellRuns:
    """The fewest runs that hold exactly the cells of `needs`, each with its `need`: stored
    cells of a window start on its multiples, so a run `[first, end)` of window `w` holds
    the cells at `first, first + w, ... end - w` and no other (window 0, a session's cell,
    has no such runs)."""
    runs = CellRuns([], [], [], [])
    for ref in sorted(needs, key=lambda r: (r.size_ms, r.start_ms)):
        if ref.size_ms <= 0:
            raise ValueError(f"cells of window {ref.size_ms} cannot be read as runs")
        need = needs[ref]
        if (
            runs.run_sizes
            and runs.run_sizes[-1] == ref.size_ms
            and runs.run_ends[-1] == ref.start_ms
            and runs.run_needs[-1] == need
        ):
            runs.run_ends[-1] = ref.start_ms + ref.size_ms
            continue
        runs.run_sizes.append(ref.size_ms)
        runs.run_firsts.append(ref.start_ms)
        runs.run_ends.append(ref.start_ms + ref.size_ms)
        runs.run_needs.append(need)
    return runs


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
(each (window, start) a range of the time-major primary key; `OFFSET 0` as in
`SERIES_SQL`)."""

SLICE_SQL = sql.SQL(
    _SERVED_CTE
    + """
SELECT s.generation, s.w AS watermark, s.v AS version, c.window_ms, c.start_ms,
       c.count AS events, c.sum, c.min, c.max, c.sketches, c.sketch_summaries, c.key,
       s.x AS stamp"""
    + _FILTERED_CELLS
)
"""What a sliced series groups and merges."""

TOP_SQL = sql.SQL(
    _SERVED_CTE
    + """
SELECT s.generation, s.w AS watermark, s.v AS version, c.window_ms, c.start_ms,
       c.count AS events, c.sum, c.min, c.max,
       CASE WHEN %(sketch)s::int > 0 AND %(union)s THEN ARRAY[c.sketches[%(sketch)s]] END
           AS sketches,
       CASE WHEN %(sketch)s::int > 0 THEN ARRAY[c.sketch_summaries[%(sketch)s]] END
           AS sketch_summaries,
       c.key, s.x AS stamp"""
    + _FILTERED_CELLS
)
"""What `top` ranks: each key's plain columns and the ranked aggregation's sketch slot."""

KEYS_SQL = sql.SQL(
    _SERVED_CTE
    + """
SELECT s.generation, s.w AS watermark, s.v AS version, k.key, s.x AS stamp
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

SESSIONS_SQL = (
    _SERVED_CTE
    + f"""
SELECT s.generation, s.w AS watermark, s.v AS version, c.start_ms, c.count AS events, c.sum,
       c.min, c.max, c.sketches, c.sketch_summaries, c.duration, s.x AS stamp
FROM s
LEFT JOIN LATERAL (
    SELECT m.start_ms, m.count, m.sum, m.min, m.max, m.sketches, m.sketch_summaries,
           p.max AS duration
    FROM batch_cells m
    JOIN batch_cells p
      ON p.generation = m.generation AND p.metric = %(part)s AND p.version = %(part_version)s
     AND p.window_ms = m.window_ms AND p.start_ms = m.start_ms AND p.key = m.key
    WHERE m.generation = s.generation AND m.metric = %(metric)s AND m.version = %(version)s
      AND m.window_ms = {SESSION_WINDOW_MS} AND m.key = %(key)s
      AND m.start_ms >= %(start)s AND m.start_ms < LEAST(%(end)s, s.w)
    ORDER BY m.start_ms
    LIMIT %(limit)s
) c ON s.v = %(version)s AND s.w IS NOT NULL
"""
)
"""One key's sessions starting in `[start, min(end, W))`: each a cell of window 0 of the
metric (its events' states) and of its `sessions` part (its duration), found through the
generation's index by key (`by_key_index`). Window 0 is written into the statement: a
generation indexed before migration 0008 has a partial index of window 0 instead, which a
prepared statement's generic plan uses only when it can prove the predicate."""


class StoredSession(NamedTuple):
    """One session the batch view serves: its first event time, its events' state, its
    duration in ms."""

    start_ms: int
    state: CellState
    duration_ms: int


@dataclass(frozen=True)
class CellQuery:
    """A cell read: one of the statements above and its parameters besides the served row's
    (metric, version, stamp, generation), which the guarded read adds."""

    statement: str | sql.Composed
    refs: Sequence[CellRef]
    params: dict[str, Any]
    max_cells: int | None = None
    """Past this many rows the read raises TooManyCells (it fetches one more to know)."""

    @classmethod
    def one_key(cls, key: Sequence[str], needs: dict[CellRef, bool]) -> CellQuery:
        """One key's cells, each with its sketches only where the merge `needs` them."""
        return cls(SERIES_SQL, tuple(needs), {"key": list(key), **runs_of(needs)._asdict()})

    def bound(self, metric: str, version: str, served: ServedRow) -> dict[str, Any]:
        """Every parameter of the statement for `metric` at `version`, read under `served`."""
        return {
            **_served_params(metric, version, served),
            **self.params,
            "sizes": [r.size_ms for r in self.refs],
            "starts": [r.start_ms for r in self.refs],
        }

    @classmethod
    def sliced(cls, selection: Selection, refs: Sequence[CellRef], max_cells: int) -> CellQuery:
        """Every key's cells passing `selection`'s filters, for a sliced series."""
        return cls._filtered(SLICE_SQL, selection, refs, max_cells, {})

    @classmethod
    def ranked(
        cls,
        selection: Selection,
        refs: Sequence[CellRef],
        max_cells: int,
        sketch: int,
        union: bool,
    ) -> CellQuery:
        """Every key's cells passing `selection`'s filters, for `top`: the ranked
        aggregation's sketch slot (`sketch`, 1-based; 0: none), its bytes only for a `union`."""
        return cls._filtered(
            TOP_SQL, selection, refs, max_cells, {"sketch": sketch, "union": union}
        )

    @classmethod
    def _filtered(
        cls,
        statement: sql.SQL,
        selection: Selection,
        refs: Sequence[CellRef],
        max_cells: int,
        params: dict[str, Any],
    ) -> CellQuery:
        condition, filters = selection.sql_condition("c.key")
        return cls(
            statement.format(filters=condition),
            refs,
            {**filters, **params, "limit": max_cells + 1},
            max_cells,
        )


def _served_params(metric: str, version: str, served: ServedRow) -> dict[str, Any]:
    """The parameters every cell read has: the metric, and the served row it is guarded by."""
    return {
        "metric": metric,
        "version": version,
        "x": served.stamp,
        "generation": served.generation,
    }


class BatchPlan(Protocol):
    """A read planned against one served row: `cell_query` is what it needs of the batch
    view (None: the served row alone)."""

    @property
    def served(self) -> ServedRow: ...

    @property
    def cell_query(self) -> CellQuery | None: ...


PlanT = TypeVar("PlanT", bound=BatchPlan)


class BatchViewReader:
    """Guarded reads of the served generation, planned against the hinted served row.
    `speed_only_for_s`: how long after the last successful read an unreachable PostgreSQL
    still gets a plan of the row last read (rule 12 in docs/semantics.md: the speed worker
    deletes cells below a W only once it has been served that long)."""

    def __init__(self, speed_only_for_s: float) -> None:
        self.hints = ServedHints()
        self.speed_only_for_s = speed_only_for_s

    async def guarded(
        self, db: AsyncDb, metric: MetricPlan, plan_for: Callable[[ServedRow], PlanT]
    ) -> tuple[PlanT, list[StoredCell]]:
        """The plan `plan_for` makes of the served row and the cells it reads, in one statement
        while the hinted row is still served; else planned again with the row found. When
        PostgreSQL does not answer, the plan of the row last read marked unreachable, with no
        cells (rule 12), if that row is recent enough; else the error.

        The row `db` holds (`HeldServedRow.row_for`: confirmed current unless
        `serving.served_row_confirm` is off), while fresh, replaces the hint, and a plan of it
        that needs no cell (every batch point cached for its stamp, or nothing of the metric
        served) reads nothing of PostgreSQL. A plan that reads cells still reads them guarded
        by the held stamp, so a row changed since (a publication committed after the row was
        confirmed, a flip that dropped the generation) joins no cell and the request is
        planned again with the row found, as with a stale hint. An answer planned against a
        held row that a publication has replaced meanwhile merges that row's batch points and
        the speed cells after its W, which the speed layer keeps for `speed.cleanup_delay_s`
        after it saw the new W served (rule 8): longer than the held row is used
        (`fresh_for_s`, at most half of it) plus a request's time."""
        held = None if db.served is None else await db.served.row_for(metric)
        served = self.hints.get(metric.name) if held is None else held
        for _ in range(_GUARD_RETRIES):
            plan = plan_for(served)
            query = plan.cell_query
            statement: str | sql.Composed
            name, version = metric.name, metric.version
            if query is None or not query.refs:
                if served is held:
                    return plan, []
                statement, params = _SERVED_SQL, _served_params(name, version, served)
            else:
                statement, params = query.statement, query.bound(name, version, served)
            try:
                async with db.connection() as conn:
                    cursor = conn.cursor(row_factory=_stored_cells)
                    sent_at = time.monotonic()
                    await cursor.execute(statement, params)
                    rows = await cursor.fetchall()
            except (BatchViewUnreachable, psycopg.OperationalError) as exc:
                last = self.hints.read_within(metric.name, self.speed_only_for_s)
                if last is None or not _unreachable(exc):
                    raise
                return plan_for(last._replace(reachable=False)), []
            if query is not None and query.max_cells is not None and len(rows) > query.max_cells:
                raise TooManyCells(query.max_cells)
            found, cells = _typed_rows(rows, metric.version)
            self.hints.set(metric.name, found, sent_at)
            if served is held and db.served is not None and found.stamp != served.stamp:
                db.served.contradicted(found.stamp)
            if found.watermark is None:
                return plan_for(found), []
            if found.stamp == served.stamp:
                return plan, cells
            served = found
        raise BatchViewUnsettled("the batch view changed during the read several times; retry")

    async def keys(
        self,
        db: AsyncDb,
        metric: MetricPlan,
        start: int,
        end: int,
        prefix: str | None,
        selection: Selection,
    ) -> tuple[ServedRow, frozenset[tuple[str, ...]]]:
        """The served row and the keys passing the filters with a base cell in `[start, end)`
        before W."""
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
        columns = [column.name for column in cursor.description or ()]
        served = _served_of(columns, rows, metric.version)
        key_at = columns.index("key")
        return served, frozenset(tuple(row[key_at]) for row in rows if row[key_at] is not None)

    async def sessions(
        self,
        db: AsyncDb,
        metric: MetricPlan,
        part: MetricPlan,
        key: Sequence[str],
        window: tuple[int, int],
        limit: int,
    ) -> tuple[ServedRow, list[StoredSession]]:
        """The served row and, when it serves `metric`, one key's sessions starting in
        `window` before W, ascending, at most `limit`."""
        async with db.connection() as conn:
            cursor = await conn.execute(
                SESSIONS_SQL,
                {
                    "metric": metric.name,
                    "version": metric.version,
                    "part": part.name,
                    "part_version": part.version,
                    "key": list(key),
                    "start": window[0],
                    "end": window[1],
                    "limit": limit,
                },
            )
            rows = await cursor.fetchall()
        columns = [column.name for column in cursor.description or ()]
        served = _served_of(columns, rows, metric.version)
        sessions = [
            StoredSession(start, state_of_columns(*state), int(duration))
            for _, _, _, start, *state, duration, _ in rows
            if start is not None
        ]
        return served, sessions


_DOWN_STATES = ("57P01", "57P02", "57P03")
"""Admin shutdown, crash shutdown, cannot connect now: PostgreSQL going or gone."""


def _unreachable(error: Exception) -> bool:
    """Whether `error` says PostgreSQL cannot be reached (no connection, or the connection
    lost: rule 12), not an error it answered (out of memory, a deadlock, a canceled
    statement), which stays an error."""
    if isinstance(error, BatchViewUnreachable):
        return True
    state = getattr(error, "sqlstate", None)
    return state is None or state.startswith("08") or state in _DOWN_STATES


def _served_of(columns: list[str], rows: list[Any], version: str) -> ServedRow:
    """The served row a statement's `rows` carry (W None unless it serves `version`)."""
    if not rows:
        return NOTHING_SERVED
    first = dict(zip(columns, rows[0], strict=True))
    watermark = first["watermark"] if first["version"] == version else None
    return ServedRow(first["stamp"], first["generation"], watermark)


def _stored_cells(cursor: AsyncCursor[Any]) -> RowMaker[StoredCell]:
    """psycopg's row factory of a cell read: each row made a `StoredCell` as it is loaded, in C
    (`tuple.__new__`), once its columns are checked to be `StoredCell`'s, by name."""
    result = cursor.pgresult
    columns = () if result is None else tuple(map(result.fname, range(result.nfields)))
    if columns != _STORED_COLUMNS:
        raise RuntimeError(f"a cell read's columns {columns} are not {_STORED_COLUMNS}")
    return cast("RowMaker[StoredCell]", partial(tuple.__new__, StoredCell))


_STORED_COLUMNS = tuple(name.encode() for name in StoredCell._fields)
"""`StoredCell`'s fields as libpq names a result's columns (`cursor.description` would build
a `Column` per column of every read)."""


def _typed_rows(rows: list[StoredCell], version: str) -> tuple[ServedRow, list[StoredCell]]:
    """The served row and the cells of a cell read's `rows`; a row without a cell (the LEFT
    JOINs found none, or the statement read the served row alone) adds none."""
    if not rows:
        return NOTHING_SERVED, []
    first = rows[0]
    watermark = first.watermark if first.version == version else None
    served = ServedRow(first.stamp, first.generation, watermark)
    return served, [row for row in rows if row.window_ms is not None]
