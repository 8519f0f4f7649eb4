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

from serving_layer.sql.compiler import SqlStatements, bind_parameters, columns_of, compile_sql
from serving_layer.sql.explain import explain
from serving_layer.sql.statement import (
    PLAN_COLUMN,
    SESSION_COLUMNS,
    SOURCE_COLUMN,
    TIME_COLUMN,
    OutputColumn,
    SqlError,
    SqlStatement,
)

__all__ = [
    "PLAN_COLUMN",
    "SESSION_COLUMNS",
    "SOURCE_COLUMN",
    "TIME_COLUMN",
    "OutputColumn",
    "SqlError",
    "SqlStatement",
    "SqlStatements",
    "bind_parameters",
    "columns_of",
    "compile_sql",
    "explain",
]
