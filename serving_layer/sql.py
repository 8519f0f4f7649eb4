"""SQL over the merged views (docs/sql.md): a `SELECT` compiled into one of the serving layer's
queries (`serving_layer.query`), never evaluated row by row. Each metric is a table shaped like
its source's events, restricted to what its cells can answer: the event time `ts`, its key
dimensions, and aggregates that name its configured aggregations. What the statement asks picks
the query:

- `time_bucket('<window>', ts[, '<tz>'])` or `date_trunc('<unit>', ts[, '<tz>'])` in `GROUP BY`:
  a series (`SeriesQuery`), one row per window and group;
- no bucket: a total over the `ts` range as one window (`TotalQuery`), one row per group;
- no bucket, `ORDER BY <aggregate> DESC LIMIT n`: a ranking (`TopQuery`) over the range,
  which must be one window of the metric's base cells;
- `SELECT DISTINCT <dims>` with no aggregate: the keys seen (`KeysQuery`).

`WHERE` holds a `ts` range (`ts >= a AND ts < b`, both bounds: the windows starting in it, as
the HTTP API's `start` and `end`) and `=` / `IN` on key dimensions (the filters); `GROUP BY`
names the dimensions each row keeps (`group_by`). A statement that asks anything else is a
`SqlError` saying where and what the metric can answer."""

from __future__ import annotations

import re
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from decimal import Decimal, InvalidOperation
from typing import Any

import sqlglot
from fastapi import HTTPException
from sqlglot import exp

from serving_layer.merged_view import MergedView
from serving_layer.params import (
    check_key_text,
    metric_of,
    time_of,
    window_spec_of,
)
from serving_layer.pools import AsyncDb
from serving_layer.query import (
    KeysQuery,
    SeriesQuery,
    SessionsQuery,
    TopQuery,
    TotalQuery,
    answering_plan,
)
from serving_layer.read_plan import Answer, Group, Point
from serving_layer.selection import Selection
from serving_layer.sessions import SessionRow, ranked_value
from serving_layer.timefmt import format_time
from serving_layer.windowing import WindowSpec
from shared.aggregations import RenderOptions, quantile_name
from shared.config import Settings
from shared.durations import format_duration
from shared.metric_plan import MetricPlan
from shared.windows import point_source

Query = SeriesQuery | TotalQuery | TopQuery | KeysQuery | SessionsQuery

TIME_COLUMN = "ts"
SOURCE_COLUMN = "source"
"""A pseudo-column: where a row's cells came from (`batch`, `mixed`, `speed`), as a point's
`source` in the HTTP API."""

SESSION_COLUMNS = {"end": "timestamptz", "events": "bigint", "duration_s": "double precision"}
"""A session metric's table besides `ts` (a session's start) and its key: one row a session."""

_DATE_TRUNC_UNITS = {"MINUTE": "1m", "HOUR": "1h", "DAY": "1d"}
_PLAIN = {exp.Sum: "sum", exp.Min: "min", exp.Max: "max", exp.Avg: "avg"}


class SqlError(HTTPException):
    """A statement the dialect cannot answer: a 400 saying where (line and column) and why;
    `position` is the character it points at, from 1 (PostgreSQL's error field `P`)."""

    def __init__(
        self,
        message: str,
        node: exp.Expr | None = None,
        position: int | None = None,
        sqlstate: str = "42601",
    ) -> None:
        where = _placed(node)
        if where is not None:
            line, column, position = where
            message = f"line {line}, column {column}: {message}"
        super().__init__(400, detail=message)
        self.message = message
        self.position = position
        self.sqlstate = sqlstate
        """What PostgreSQL would report: 42601 (syntax_error), 25006 for a statement that
        writes (read_only_sql_transaction)."""


def _placed(node: exp.Expr | None) -> tuple[int, int, int] | None:
    """(line, column, character from 1) of the first token of `node` sqlglot placed."""
    placed = [part.meta for part in (() if node is None else node.walk()) if "line" in part.meta]
    if not placed:
        return None
    first = min(placed, key=lambda meta: meta["start"])
    width = first["end"] - first["start"]
    return first["line"], first["col"] - width, first["start"] + 1


@dataclass(frozen=True)
class OutputColumn:
    """One column of the answer: its name, its PostgreSQL type name and how a row's value is
    read (from the window, the group and the rendered values of one point)."""

    name: str
    type: str
    value: Callable[[RowParts], Any]


@dataclass(frozen=True)
class RowParts:
    """What one answer row is made of: its window, group, where its cells came from and its
    rendered outputs."""

    window: tuple[int, int]
    group: Group
    source: str
    values: dict[str, Any]


@dataclass(frozen=True)
class SqlStatement:
    """A compiled statement: the query it reads and the columns it answers, in order."""

    text: str
    query: Query
    columns: tuple[OutputColumn, ...]
    row_limit: int | None
    """`LIMIT` of a series, total or keys statement (a ranking's is the query's `n`)."""
    explain: bool = False
    """`EXPLAIN <statement>`: answered by its plan (`explain`), nothing read but the row."""

    def rows(self, answer: Answer[Any]) -> list[tuple[Any, ...]]:
        """The answer's rows in column order: a series by window then group, a total and the
        keys by group, a ranking best first."""
        rows = [
            tuple(column.value(part) for column in self.columns) for part in self._parts(answer)
        ]
        if isinstance(self.query, KeysQuery):  # the keys projected onto the dimensions selected
            rows = list(dict.fromkeys(rows))
        return rows if self.row_limit is None else rows[: self.row_limit]

    def _parts(self, answer: Answer[Any]) -> list[RowParts]:
        query = self.query
        if isinstance(query, SessionsQuery):
            sessions: list[SessionRow] = answer.rows[: query.limit]
            return [
                RowParts(
                    (row.start_ms, row.last_ms),
                    query.key,
                    row.source,
                    {
                        TIME_COLUMN: format_time(row.start_ms),
                        "end": format_time(row.last_ms),
                        "events": row.state.count,
                        "duration_s": (row.last_ms - row.start_ms) / 1000,
                    },
                )
                for row in sessions
            ]
        if isinstance(query, KeysQuery):
            window = (query.start_ms, query.end_ms)
            keys: list[Group] = answer.rows
            return [RowParts(window, key, "", {}) for key in keys]
        if isinstance(query, TopQuery):
            window = (query.start_ms, query.end_ms)
            source = point_source(*window, answer.watermark)
            ranked: list[tuple[Group, Any]] = answer.rows
            return [
                RowParts(window, group, source, {query.by: ranked_value(query.by, value)})
                for group, value in ranked[: query.n]
            ]
        by_group: dict[Group, list[Point]] = answer.rows
        parts = [
            RowParts(point.window, group, point.source, point.values)
            for group, points in by_group.items()
            for point in points
        ]
        return sorted(parts, key=lambda part: (part.window, part.group))


_EXPLAIN = re.compile(r"\s*EXPLAIN\s", re.IGNORECASE)


def compile_sql(settings: Settings, text: str, params: Sequence[str | None] = ()) -> SqlStatement:
    """The statement `text` compiled against the configured metrics (raises SqlError), its
    parameters `$1`, `$2`, ... bound to `params` (as the wire protocol's Bind sends them:
    text, a number where it reads as one). `EXPLAIN <statement>` compiles the statement."""
    explained, select = _parsed(text)
    _bind(select, params)
    statement = _Compiler(settings, text, select).compile()
    return statement if not explained else replace(statement, explain=True)


def columns_of(settings: Settings, text: str) -> tuple[OutputColumn, ...]:
    """The columns `text` answers, from its select list alone (its parameters unbound): what
    the wire protocol's Describe of a statement asks before any Bind."""
    explained, select = _parsed(text)
    if explained:
        return (OutputColumn(PLAN_COLUMN, "text", _source),)
    return _Compiler(settings, text, select).columns()


PLAN_COLUMN = "QUERY PLAN"
"""The one column of an `EXPLAIN` answer, as PostgreSQL names it."""


def _parsed(text: str) -> tuple[bool, exp.Select]:
    """Whether `text` is an EXPLAIN, and its SELECT. The keyword is blanked, not cut, so that
    positions in errors still count from the start of `text`."""
    explained = _EXPLAIN.match(text)
    source = text if explained is None else " " * explained.end() + text[explained.end() :]
    try:
        statements = sqlglot.parse(source, read="postgres")
    except sqlglot.errors.ParseError as exc:
        first = exc.errors[0] if exc.errors else {}
        where = f"line {first.get('line')}, column {first.get('col')}: " if first else ""
        description = first.get("description", exc)
        raise SqlError(
            f"{where}cannot parse the statement: {description}",
            position=_character(source, first.get("line"), first.get("col")),
        ) from None
    except sqlglot.errors.SqlglotError as exc:
        raise SqlError(f"cannot parse the statement: {exc}") from None
    if len(statements) != 1 or statements[0] is None:
        raise SqlError("send one statement")
    select = statements[0]
    if not isinstance(select, exp.Select):
        raise SqlError(
            "the SQL interface is read-only: send one SELECT (or EXPLAIN SELECT)",
            select,
            sqlstate="25006",
        )
    return explained is not None, select


def _character(text: str, line: int | None, column: int | None) -> int | None:
    """The character (from 1) at a line and column (both from 1) of `text`."""
    if line is None or column is None:
        return None
    lines = text.split("\n")
    return sum(len(before) + 1 for before in lines[: line - 1]) + column


def _bind(select: exp.Select, params: Sequence[str | None]) -> None:
    """Each `$n` in `select` replaced by the literal of `params[n - 1]`, in place."""
    for parameter in list(select.find_all(exp.Parameter)):
        at = parameter.this
        number = int(at.this) if isinstance(at, exp.Literal) and str(at.this).isdigit() else 0
        if not 1 <= number <= len(params):
            raise SqlError(f"${number} is not bound: send {number} parameters or more", parameter)
        value = params[number - 1]
        literal: exp.Expr
        if value is None:
            literal = exp.Null()
        elif _NUMBER.fullmatch(value):
            literal = exp.Literal.number(value)
        else:
            literal = exp.Literal.string(value)
        literal.meta.update(parameter.meta)
        parameter.replace(literal)


_DATE = re.compile(r"[0-9]{4}-[0-9]{2}-[0-9]{2}")
_LOCAL_TIME = re.compile(r"[0-9]{4}-[0-9]{2}-[0-9]{2}[T ][0-9]{2}:[0-9]{2}(:[0-9]{2}(\.[0-9]+)?)?")
"""A time without an offset (PostgreSQL reads it in the session's TimeZone, UTC here)."""
_NUMBER = re.compile(r"-?[0-9]+(\.[0-9]+)?([eE][-+]?[0-9]+)?")


class SqlStatements:
    """Compiled statements by their text, the most recent `capacity` kept: compiling is pure
    given the settings, so a dashboard's repeated statement is parsed and planned once."""

    def __init__(self, settings: Settings, capacity: int = 1024) -> None:
        self.settings = settings
        self.capacity = capacity
        self._compiled: OrderedDict[tuple[str, tuple[str | None, ...]], SqlStatement] = (
            OrderedDict()
        )

    def compile(self, text: str, params: Sequence[str | None] = ()) -> SqlStatement:
        """`text` compiled with `params` bound: kept, or compiled (then kept)."""
        name = (text, tuple(params))
        statement = self._compiled.get(name)
        if statement is None:
            statement = self._compiled[name] = compile_sql(self.settings, text, params)
            if len(self._compiled) > self.capacity:
                self._compiled.popitem(last=False)
        else:
            self._compiled.move_to_end(name)
        return statement


class _Compiler:
    """One SELECT against one metric's table."""

    def __init__(self, settings: Settings, text: str, select: exp.Select) -> None:
        self.settings = settings
        self.text = text
        self.select = select
        self.metric = self._table()
        self.quantiles: list[Decimal] = []
        self.lists_sessions = self.metric.sessions is not None and not _aggregates_in(select)
        """A session metric's statement without aggregates: one key's sessions, a row each."""

    def columns(self) -> tuple[OutputColumn, ...]:
        """The columns of the select list, nothing else checked."""
        group_dims, bucket = self._group_by()
        items = [self._item(e, group_dims, bucket) for e in self.select.expressions]
        distinct = bool(self.select.args.get("distinct"))
        listed = distinct or self.lists_sessions
        row_dims = self.metric.key if listed else tuple(group_dims)
        return tuple(_column(kind, name, node, row_dims) for kind, name, node in items)

    def compile(self) -> SqlStatement:
        select, metric = self.select, self.metric
        self._refuse_unsupported()
        start, end, filters = self._where()
        group_dims, bucket = self._group_by()
        items = [self._item(e, group_dims, bucket) for e in select.expressions]
        aggregates = [name for kind, name, _ in items if kind == "aggregate"]
        ranked = self._ranked()
        # only the quantiles the statement asks for (none: a quantiles metric renders none)
        render = RenderOptions(tuple(dict.fromkeys(self.quantiles)))
        distinct = bool(select.args.get("distinct"))
        columns = self.columns()
        selection = Selection(metric.key, filters, tuple(group_dims))
        limit = self._limit()
        query: Query
        if self.lists_sessions:
            most = self.settings.serving.max_keys_limit
            query = SessionsQuery.of(self.settings, metric, (start, end), selection, limit or most)
        elif distinct:
            query = self._keys(aggregates, bucket, (start, end), filters)
        elif not aggregates:
            raise SqlError(
                f"select at least one aggregate of {metric.name}: {self._answerable()}", select
            )
        elif ranked is not None:
            query = self._top(ranked, aggregates, bucket, (start, end), selection, limit, render)
            limit = None  # the ranking's n
        elif bucket is None:
            if metric.sessions is not None:
                raise SqlError(
                    f"{metric.name}'s sessions are counted per window: group by a time bucket "
                    "(one as long as the range gives its total)",
                    select,
                )
            query = TotalQuery.of(self.settings, metric, (start, end), selection, render)
        else:
            max_groups = self.settings.serving.max_groups
            window = (start, end)
            query = SeriesQuery.of(
                self.settings, metric, bucket, window, selection, render, max_groups
            )
        return SqlStatement(self.text, query, columns, limit)

    def _keys(
        self,
        aggregates: list[str],
        bucket: WindowSpec | None,
        window: tuple[int, int],
        filters: tuple[tuple[str, frozenset[str]], ...],
    ) -> KeysQuery:
        """`SELECT DISTINCT <dims>`: the keys seen in the range, after the filters."""
        if aggregates or bucket is not None:
            raise SqlError(
                "SELECT DISTINCT lists key dimensions only (the keys seen in the range)",
                self.select,
            )
        metric, most = self.metric, self.settings.serving.max_keys_limit
        return KeysQuery.of(
            self.settings, metric, window, None, Selection(metric.key, filters), most
        )

    def _top(
        self,
        ranked: str,
        aggregates: list[str],
        bucket: WindowSpec | None,
        window: tuple[int, int],
        selection: Selection,
        limit: int | None,
        render: RenderOptions,
    ) -> TopQuery:
        """`ORDER BY <aggregate> DESC LIMIT n` without a bucket: the groups ranked over the
        range, which must be one window of its size from the epoch."""
        select = self.select
        if bucket is not None:
            raise SqlError(
                "ORDER BY an aggregate ranks the groups of one window: drop the time bucket, "
                "or order by the bucket",
                select.args.get("order"),
            )
        if limit is None:
            raise SqlError("a ranking needs LIMIT n (the top n groups)", select)
        if set(aggregates) != {ranked}:
            raise SqlError(
                f"a ranking answers the aggregate it orders by ({ranked}) alone; select the "
                "others with a GROUP BY statement filtered by the keys it finds",
                select,
            )
        start, end = window
        where = select.args.get("where")
        base = self.metric.base_window_ms
        if (end - start) % base:
            raise SqlError(
                f"a ranking's ts range is one window, a multiple of {self.metric.name}'s "
                f"{format_duration(base)} cells",
                where,
            )
        query = TopQuery.of(
            self.settings, self.metric, ranked, end - start, start, selection, limit, render
        )
        if query.start_ms != start:
            raise SqlError(
                "a ranking's ts range is one window of its size from the epoch: "
                f"ts >= '{format_time(query.start_ms)}' AND ts < '{format_time(query.end_ms)}'",
                where,
            )
        return query

    # ------------------------------------------------------------------ the table

    def _table(self) -> MetricPlan:
        tables = list(self.select.find_all(exp.Table))
        if len(tables) != 1:
            raise SqlError(
                "select from one metric (FROM <metric>): joins and subqueries are not supported",
                tables[1] if len(tables) > 1 else self.select,
            )
        (table,) = tables
        try:
            metric = metric_of(self.settings, table.name)
        except HTTPException as exc:
            raise SqlError(str(exc.detail), table) from None
        return metric

    def _refuse_unsupported(self) -> None:
        select = self.select
        for name in ("joins", "with", "having", "laterals", "windows", "offset"):
            if select.args.get(name):
                raise SqlError(f"{name.upper()} is not supported in this dialect", select)
        for node in select.walk():
            if isinstance(node, exp.Window):
                raise SqlError("window functions (OVER) are not supported", node)
            if isinstance(node, exp.Subquery | exp.Union):
                raise SqlError("subqueries are not supported", node)

    # ------------------------------------------------------------------ WHERE

    def _where(self) -> tuple[int, int, tuple[tuple[str, frozenset[str]], ...]]:
        where = self.select.args.get("where")
        start: int | None = None
        end: int | None = None
        filters: dict[str, frozenset[str]] = {}
        for term in _conjuncts(None if where is None else where.this):
            if isinstance(term, exp.Between) and _is_ts(term.this):  # Grafana's $__timeFilter
                low, high = self._time(term.args["low"]), self._time(term.args["high"])
                start = low if start is None else max(start, low)
                end = high + 1 if end is None else min(end, high + 1)  # windows starting <= high
                continue
            if isinstance(term, exp.GTE | exp.LT | exp.GT | exp.LTE) and _is_ts(term.this):
                if not isinstance(term, exp.GTE | exp.LT):
                    raise SqlError("bound ts as ts >= <start> AND ts < <end> (half-open)", term)
                at = self._time(term.expression)
                if isinstance(term, exp.GTE):
                    start = at if start is None else max(start, at)
                else:
                    end = at if end is None else min(end, at)
                continue
            if isinstance(term, exp.EQ | exp.In) and isinstance(term.this, exp.Column):
                dim = self._dimension(term.this)
                values = [term.expression] if isinstance(term, exp.EQ) else term.expressions
                texts = frozenset(self._text(value, dim) for value in values)
                filters[dim] = filters[dim] & texts if dim in filters else texts
                continue
            raise SqlError(
                "WHERE takes ts >= <start>, ts < <end> and <dimension> = / IN (...) joined by AND",
                term,
            )
        if start is None or end is None:
            raise SqlError(
                "WHERE needs a ts range: ts >= '<start>' AND ts < '<end>' (RFC 3339)",
                where,
            )
        if start >= end:
            raise SqlError(
                "the ts range is empty: send ts >= start AND ts < end, start < end", where
            )
        ordered = tuple((d, filters[d]) for d in self.metric.key if d in filters)
        return start, end, ordered

    def _time(self, node: exp.Expression) -> int:
        literal = node.this if isinstance(node, exp.Cast) else node
        if not isinstance(literal, exp.Literal):
            raise SqlError("compare ts with a time literal, e.g. '2026-12-01T00:00:00Z'", node)
        text = literal.this if literal.is_string else str(literal.this)
        if _DATE.fullmatch(text):
            text += "T00:00:00Z"  # a date: its UTC midnight
        elif _LOCAL_TIME.fullmatch(text):
            text = text.replace(" ", "T") + "Z"  # no offset: the session's TimeZone, UTC
        try:
            return time_of("ts", text.replace(" ", "T", 1))
        except HTTPException as exc:
            raise SqlError(str(exc.detail), node) from None

    def _text(self, node: exp.Expression, dim: str) -> str:
        if not isinstance(node, exp.Literal):  # a number is its text (a bound parameter)
            raise SqlError(f"compare {dim} with a string literal, e.g. {dim} = 'x'", node)
        try:
            check_key_text(dim, node.this)
        except HTTPException as exc:
            raise SqlError(str(exc.detail), node) from None
        return str(node.this)

    def _dimension(self, column: exp.Column) -> str:
        name = column.name
        if name not in self.metric.key:
            raise SqlError(
                f"{self.metric.name} has no dimension {name!r}; its columns are "
                f"{self._column_names()}",
                column,
            )
        return name

    # ------------------------------------------------------------------ GROUP BY

    def _group_by(self) -> tuple[list[str], WindowSpec | None]:
        group = self.select.args.get("group")
        dims: list[str] = []
        bucket: WindowSpec | None = None
        for node in [] if group is None else group.expressions:
            node = self._by_position(node)
            if _bucket_call(node) is not None:
                if bucket is not None:
                    raise SqlError("group by one time bucket", node)
                bucket = self._bucket(node)
            elif isinstance(node, exp.Column):
                dims.append(self._dimension(node))
            else:
                raise SqlError("GROUP BY takes key dimensions and one time bucket", node)
        return dims, bucket

    def _by_position(self, node: exp.Expression) -> exp.Expression:
        """A GROUP BY or ORDER BY item as the select item it names (by position or alias)."""
        items = self.select.expressions
        if isinstance(node, exp.Literal) and not node.is_string:
            at = int(node.this) if str(node.this).isdigit() else 0
            if not 1 <= at <= len(items):
                raise SqlError(f"there is no select item {node.this}", node)
            node = items[at - 1]
        elif isinstance(node, exp.Column) and node.name not in self.metric.key:
            for item in items:
                if isinstance(item, exp.Alias) and item.alias == node.name:
                    node = item
        return node.this if isinstance(node, exp.Alias) else node

    def _bucket(self, node: exp.Expression) -> WindowSpec:
        call = _bucket_call(node)
        assert call is not None
        name, args = call
        if name == "date_trunc":
            unit = args[0]
            text = _DATE_TRUNC_UNITS.get(str(unit.this).upper()) if unit is not None else None
            if text is None:
                raise SqlError(
                    "date_trunc takes 'minute', 'hour' or 'day' here (weeks, months and years "
                    "are not multiples of the base cell from the epoch); or use "
                    "time_bucket('<n>m|h|d', ts)",
                    node,
                )
        else:  # time_bucket, or the epoch bucket (its window made a string above)
            first = args[0]
            if not isinstance(first, exp.Literal) or not first.is_string:
                raise SqlError("time_bucket takes the window as a string, e.g. '1h'", node)
            text = first.this.replace(" ", "")
        if len(args) < 2 or not _is_ts(args[1]):
            raise SqlError(f"{name} buckets ts: {name}('{text}', ts)", node)
        tz = None
        if len(args) > 2:
            zone = args[2]
            if not isinstance(zone, exp.Literal) or not zone.is_string or len(args) > 3:
                raise SqlError(
                    f"{name}'s third argument is an IANA zone, e.g. 'Europe/Berlin'", node
                )
            tz = str(zone.this)
        try:
            return window_spec_of(self.metric, _duration_text(text), None, tz)
        except HTTPException as exc:
            raise SqlError(str(exc.detail), node) from None

    # ------------------------------------------------------------------ select items

    def _item(
        self, node: exp.Expression, dims: list[str], bucket: WindowSpec | None
    ) -> tuple[str, str, exp.Expression]:
        """A select item as (kind, the output it reads, the node): kind `bucket`, `dim`,
        `source` or `aggregate`."""
        inner = node.this if isinstance(node, exp.Alias) else node
        call = _bucket_call(inner)
        if call is not None:
            if bucket is None:
                raise SqlError("a time bucket is selected: group by it too", node)
            return ("epoch" if call[0] == EPOCH_BUCKET else "bucket"), TIME_COLUMN, node
        if isinstance(inner, exp.Column):
            name = inner.name
            if name == SOURCE_COLUMN and name not in self.metric.key:
                return "source", SOURCE_COLUMN, node
            if self.lists_sessions and (name in SESSION_COLUMNS or name == TIME_COLUMN):
                return "session", name, node
            dim = self._dimension(inner)
            listed = self.select.args.get("distinct") or self.lists_sessions
            if dim not in dims and not listed:
                raise SqlError(f"{dim} is selected: group by it too", inner)
            return "dim", dim, node
        if isinstance(inner, exp.Star):
            raise SqlError(f"name the columns: {self._column_names()}", node)
        return "aggregate", self._aggregate(inner), node

    def _aggregate(self, node: exp.Expression) -> str:
        """The output name an aggregate call reads (`count`, `sum`, `distinct_f`, `p99`; of a
        session metric, `sessions`, `bounces`, `duration_*_s` first)."""
        metric = self.metric
        outputs = {a.spec for a in metric.aggregations.aggregations}
        if metric.sessions is not None:
            session_output = self._session_aggregate(node, outputs)
            if session_output is not None:
                return session_output
        if isinstance(node, exp.Count):
            arg = node.this
            if isinstance(arg, exp.Star) and "count" in outputs:
                return "count"
            if isinstance(arg, exp.Distinct):
                raise SqlError(
                    "distinct counts are estimates here: write APPROX_COUNT_DISTINCT(<field>)",
                    node,
                )
        for kind, name in _PLAIN.items():
            if isinstance(node, kind) and self._is_value(node.this) and name in outputs:
                return name
        field = node.this.name if isinstance(node.this, exp.Column) else None
        if isinstance(node, exp.ApproxDistinct) and f"distinct({field})" in outputs:
            return f"distinct_{field}"
        args = node.expressions
        percentile = isinstance(node, exp.Anonymous) and node.name.upper() == "APPROX_PERCENTILE"
        if percentile and len(args) == 2 and isinstance(args[0], exp.Column):
            q = _fraction(args[1])
            if f"quantiles({args[0].name})" in outputs:
                self.quantiles.append(q)
                return quantile_name(q)
        raise SqlError(
            f"{metric.name} cannot answer {node.sql('postgres')}: {self._answerable()}", node
        )

    def _session_aggregate(self, node: exp.Expression, outputs: set[str]) -> str | None:
        """A session output (rule 13) an aggregate over the sessions reads, or None: COUNT(*)
        the sessions, COUNT(*) FILTER (WHERE events = 1) the bounces, SUM(events) the events
        (the metric's `count`), AVG/SUM/MAX(duration_s) and APPROX_PERCENTILE(duration_s, q)
        their durations; any other aggregate is over the sessions' events, as a metric's."""
        if isinstance(node, exp.Filter) and isinstance(node.this, exp.Count):
            condition = node.expression.this if isinstance(node.expression, exp.Where) else None
            one = exp.EQ(this=exp.column("events"), expression=exp.Literal.number(1))
            if isinstance(node.this.this, exp.Star) and condition == one:
                return "bounces"
            raise SqlError("a bounce is COUNT(*) FILTER (WHERE events = 1)", node)
        if isinstance(node, exp.Count) and isinstance(node.this, exp.Star):
            return "sessions"
        column = node.this.name if isinstance(node.this, exp.Column) else None
        if isinstance(node, exp.Sum) and column == "events" and "count" in outputs:
            return "count"
        durations = {exp.Avg: "avg", exp.Sum: "sum", exp.Max: "max"}
        for kind, name in durations.items():
            if isinstance(node, kind) and column == "duration_s":
                return f"duration_{name}_s"
        args = node.expressions
        percentile = isinstance(node, exp.Anonymous) and node.name.upper() == "APPROX_PERCENTILE"
        durations_at = percentile and len(args) == 2 and isinstance(args[0], exp.Column)
        if durations_at and args[0].name == "duration_s":
            q = _fraction(args[1])
            self.quantiles.append(q)
            return f"duration_{quantile_name(q)}_s"
        return None

    def _is_value(self, node: exp.Expression | None) -> bool:
        return isinstance(node, exp.Column) and node.name == self.metric.value

    def _answerable(self) -> str:
        value = self.metric.value
        calls = []
        for aggregation in self.metric.aggregations.aggregations:
            spec = aggregation.spec
            if spec == "count":
                calls.append("COUNT(*)")
            elif spec in ("sum", "min", "max", "avg"):
                calls.append(f"{spec.upper()}({value})")
            elif spec.startswith("distinct("):
                calls.append(f"APPROX_COUNT_DISTINCT({aggregation.field})")
            elif spec.startswith("quantiles("):
                calls.append(f"APPROX_PERCENTILE({aggregation.field}, <q in (0, 1)>)")
        if self.metric.sessions is not None:
            calls = [
                "COUNT(*) (sessions)",
                "COUNT(*) FILTER (WHERE events = 1) (bounces)",
                "AVG/SUM/MAX(duration_s)",
                "APPROX_PERCENTILE(duration_s, <q>)",
                *(
                    ["SUM(events)"]
                    if "count" in {a.spec for a in self.metric.aggregations.aggregations}
                    else []
                ),
                *[c for c in calls if c != "COUNT(*)"],
            ]
        return "it answers " + ", ".join(calls)

    def _column_names(self) -> str:
        sessions = list(SESSION_COLUMNS) if self.metric.sessions is not None else []
        return ", ".join([TIME_COLUMN, *self.metric.key, *sessions, SOURCE_COLUMN])

    # ------------------------------------------------------------------ ORDER BY, LIMIT

    def _ranked(self) -> str | None:
        """The aggregate an `ORDER BY <aggregate> DESC` ranks by (None: no ranking; ordering
        by the bucket or dimensions is the answer's own order)."""
        order = self.select.args.get("order")
        ranked = None
        for ordered in [] if order is None else order.expressions:
            node = self._by_position(ordered.this)
            if _bucket_call(node) is not None or isinstance(node, exp.Column):
                if isinstance(node, exp.Column) and node.name not in self.metric.key:
                    raise SqlError(f"cannot order by {node.name}", node)
                if ordered.args.get("desc"):
                    raise SqlError(
                        "rows come by time bucket then group, ascending; ORDER BY ... DESC "
                        "ranks an aggregate",
                        ordered,
                    )
                continue
            name = self._aggregate(node)
            if not ordered.args.get("desc") or ranked is not None:
                raise SqlError(
                    "rank by one aggregate, descending: ORDER BY <aggregate> DESC", ordered
                )
            ranked = name
        return ranked

    def _limit(self) -> int | None:
        limit = self.select.args.get("limit")
        if limit is None:
            return None
        value = limit.expression
        if not isinstance(value, exp.Literal) or value.is_string or not str(value.this).isdigit():
            raise SqlError("LIMIT takes a positive integer", limit)
        return int(value.this)


def _aggregates_in(select: exp.Select) -> bool:
    """Whether the select list holds an aggregate (APPROX_PERCENTILE included)."""
    return any(
        isinstance(node, exp.AggFunc)
        or (isinstance(node, exp.Anonymous) and node.name.upper() == "APPROX_PERCENTILE")
        for item in select.expressions
        for node in item.walk()
    )


def _conjuncts(node: exp.Expression | None) -> list[exp.Expression]:
    if node is None:
        return []
    if isinstance(node, exp.And):
        return [*_conjuncts(node.this), *_conjuncts(node.expression)]
    if isinstance(node, exp.Paren):
        return _conjuncts(node.this)
    return [node]


def _is_ts(node: exp.Expression | None) -> bool:
    return isinstance(node, exp.Column) and node.name == TIME_COLUMN


EPOCH_BUCKET = "floor(extract(epoch from ts) / n) * n"
"""Grafana's `$__timeGroup(ts, '5m')` as its PostgreSQL data source expands it: the bucket
as epoch seconds."""


def _bucket_call(node: exp.Expression) -> tuple[str, list[Any]] | None:
    """(`time_bucket` | `date_trunc` | `EPOCH_BUCKET`, its arguments: the window, `ts`[, the
    zone]) of a bucketing expression, else None."""
    if isinstance(node, exp.Anonymous) and str(node.this).lower() == "time_bucket":
        return "time_bucket", list(node.expressions)
    if isinstance(node, exp.TimestampTrunc):
        zone = node.args.get("zone")
        return "date_trunc", [node.args.get("unit"), node.this, *([zone] if zone else [])]
    floor = node.this if isinstance(node, exp.Mul) else None
    divided = floor.this if isinstance(floor, exp.Floor) else None
    if isinstance(divided, exp.Div) and isinstance(divided.this, exp.Extract):
        extract, size = divided.this, divided.expression
        epoch = str(extract.this.this).upper() == "EPOCH"
        same = isinstance(size, exp.Literal) and size == node.expression
        if epoch and same:
            return EPOCH_BUCKET, [exp.Literal.string(f"{size.this}s"), extract.expression]
    return None


def _duration_text(text: str) -> str:
    """'1 hour', '15 minutes', '300.000s' (Grafana's seconds), '1h' -> the platform's spelling
    ('1h', '15m', '300s')."""
    units = {"minute": "m", "minutes": "m", "hour": "h", "hours": "h", "day": "d", "days": "d"}
    for word, unit in units.items():
        if text.endswith(word) and text[: -len(word)].isdigit():
            return text[: -len(word)] + unit
    seconds = _WHOLE_SECONDS.fullmatch(text)
    return text if seconds is None else f"{seconds.group(1)}s"


_WHOLE_SECONDS = re.compile(r"([0-9]+)(?:\.0*)?s")


def _fraction(node: exp.Expression) -> Decimal:
    if isinstance(node, exp.Literal) and not node.is_string:
        try:
            q = Decimal(str(node.this))
        except InvalidOperation:
            q = Decimal(0)
        if 0 < q < 1:
            return q
    raise SqlError("APPROX_PERCENTILE's fraction is a number in (0, 1), e.g. 0.99", node)


def _column(kind: str, name: str, node: exp.Expression, row_dims: tuple[str, ...]) -> OutputColumn:
    """A select item's column: named by its alias, else by what it reads."""
    alias = node.alias if isinstance(node, exp.Alias) and node.alias else None
    if kind == "bucket":
        return OutputColumn(alias or TIME_COLUMN, "timestamptz", _bucket_start)
    if kind == "epoch":
        return OutputColumn(alias or TIME_COLUMN, "bigint", _bucket_epoch_s)
    if kind == "dim":
        return OutputColumn(alias or name, "text", _group_value(row_dims.index(name)))
    if kind == "source":
        return OutputColumn(alias or SOURCE_COLUMN, "text", _source)
    if kind == "session":
        return OutputColumn(alias or name, SESSION_COLUMNS.get(name, "timestamptz"), _output(name))
    counted = name in ("count", "sessions", "bounces") or name.startswith("distinct_")
    return OutputColumn(alias or name, "bigint" if counted else "double precision", _output(name))


def _bucket_start(row: RowParts) -> str:
    return format_time(row.window[0])


def _bucket_epoch_s(row: RowParts) -> int:
    return row.window[0] // 1000


def _source(row: RowParts) -> str:
    return row.source


def _group_value(at: int) -> Callable[[RowParts], str]:
    def read(row: RowParts) -> str:
        return row.group[at]

    return read


def _output(name: str) -> Callable[[RowParts], Any]:
    def read(row: RowParts) -> Any:
        return row.values.get(name)

    return read


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
