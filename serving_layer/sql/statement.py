"""A compiled SQL statement and its answer's rows (docs/sql.md): the query it reads, its
columns (name, PostgreSQL type, how a row's value is read) and the refusal of one the dialect
cannot answer."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from fastapi import HTTPException
from sqlglot import exp

from serving_layer.query import KeysQuery, SeriesQuery, SessionsQuery, TopQuery, TotalQuery
from serving_layer.read_plan import Answer, Group, Point
from serving_layer.sessions import SessionRow, ranked_value
from shared.windows import point_source

Query = SeriesQuery | TotalQuery | TopQuery | KeysQuery | SessionsQuery

TIME_COLUMN = "ts"
SOURCE_COLUMN = "source"
"""A pseudo-column: where a row's cells came from (`batch`, `mixed`, `speed`), as a point's
`source` in the HTTP API."""

SESSION_COLUMNS = {"end": "timestamptz", "events": "bigint", "duration_s": "double precision"}
"""A session metric's table besides `ts` (a session's start) and its key: one row a session."""


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
        keys by group, a ranking best first. A `timestamptz` value is epoch milliseconds: each
        way out renders it (JSON as RFC 3339, the wire protocol as a datetime)."""
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
                        TIME_COLUMN: row.start_ms,
                        "end": row.last_ms,
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


def column_of(
    kind: str, name: str, node: exp.Expression, row_dims: tuple[str, ...]
) -> OutputColumn:
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


def _bucket_start(row: RowParts) -> int:
    return row.window[0]


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


PLAN_COLUMN = "QUERY PLAN"
"""The one column of an `EXPLAIN` answer, as PostgreSQL names it."""
PLAN_OUTPUT = OutputColumn(PLAN_COLUMN, "text", _source)
