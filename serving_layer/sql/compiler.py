"""The dialect's compiler (the package's doc says what it answers): a statement's text, its
parameters bound, compiled into one of the serving layer's queries and the columns it answers;
a statement it cannot answer is a `SqlError` saying where and what the metric answers."""

from __future__ import annotations

import re
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import replace
from decimal import Decimal
from typing import Any

import sqlglot
from fastapi import HTTPException
from sqlglot import exp

from serving_layer.params import check_key_text, metric_of, time_of, window_spec_of
from serving_layer.query import KeysQuery, SeriesQuery, SessionsQuery, TopQuery, TotalQuery
from serving_layer.selection import Selection
from serving_layer.sql.aggregates import aggregate_output, answerable
from serving_layer.sql.statement import (
    PLAN_OUTPUT,
    SESSION_COLUMNS,
    SOURCE_COLUMN,
    TIME_COLUMN,
    OutputColumn,
    Query,
    SqlError,
    SqlStatement,
    column_of,
)
from serving_layer.timefmt import format_time
from serving_layer.windowing import WindowSpec
from shared.aggregations import RenderOptions
from shared.config import Settings
from shared.durations import format_duration
from shared.metric_plan import MetricPlan

_DATE_TRUNC_UNITS = {"MINUTE": "1m", "HOUR": "1h", "DAY": "1d"}


_EXPLAIN = re.compile(r"\s*EXPLAIN\s", re.IGNORECASE)


def compile_sql(settings: Settings, text: str, params: Sequence[str | None] = ()) -> SqlStatement:
    """The statement `text` compiled against the configured metrics (raises SqlError), its
    parameters `$1`, `$2`, ... bound to `params` (as the wire protocol's Bind sends them:
    text, a number where it reads as one). `EXPLAIN <statement>` compiles the statement."""
    explained, select = _parsed(text)
    bind_parameters(select, params)
    statement = _Compiler(settings, text, select).compile()
    return statement if not explained else replace(statement, explain=True)


def columns_of(settings: Settings, text: str) -> tuple[OutputColumn, ...]:
    """The columns `text` answers, from its select list alone (its parameters unbound): what
    the wire protocol's Describe of a statement asks before any Bind."""
    explained, select = _parsed(text)
    if explained:
        return (PLAN_OUTPUT,)
    return _Compiler(settings, text, select).columns()


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


def bind_parameters(
    query: exp.Expr, params: Sequence[str | None], unbound_null: bool = False
) -> None:
    """Each `$n` in `query` replaced by the literal of `params[n - 1]` (as the wire protocol's
    Bind sends them: text, a number where it reads as one), in place. A `$n` past `params` is
    a SqlError, or NULL with `unbound_null` (a catalog query described before its Bind)."""
    for parameter in list(query.find_all(exp.Parameter)):
        at = parameter.this
        number = int(at.this) if isinstance(at, exp.Literal) and str(at.this).isdigit() else 0
        if not 1 <= number <= len(params) and not unbound_null:
            raise SqlError(f"${number} is not bound: send {number} parameters or more", parameter)
        value = params[number - 1] if 1 <= number <= len(params) else None
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
        return tuple(column_of(kind, name, node, row_dims) for kind, name, node in items)

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
                f"select at least one aggregate of {metric.name}: {answerable(self.metric)}", select
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
        return "aggregate", aggregate_output(self.metric, inner, self.quantiles), node

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
            name = aggregate_output(self.metric, node, self.quantiles)
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
