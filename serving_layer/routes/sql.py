"""`POST /v1/sql`: one SELECT over a metric's table, compiled into the serving layer's queries
(`serving_layer.sql`; the dialect in docs/sql.md), answered with its columns and rows."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Body, Request

from serving_layer.auth import ReaderDep
from serving_layer.deps import QueryDep
from serving_layer.read_plan import Answer
from serving_layer.responses import JSONResponse
from serving_layer.schemas import SqlRequest, SqlResponse, problems
from serving_layer.sql import PLAN_COLUMN, SqlStatements, explain
from serving_layer.timefmt import format_time

router = APIRouter(prefix="/v1/sql", tags=["sql"], dependencies=[ReaderDep])


@router.post(
    "",
    response_model=SqlResponse,
    response_class=JSONResponse,
    responses=problems(400, 401, 404, 503),
    description="The answer of one SELECT over a metric's table: its columns (name and "
    "PostgreSQL type) and rows, with the provenance every answer carries (W, the views' "
    "status). A statement the metric's cells cannot answer is a 400 saying where and what the "
    "metric answers.",
)
async def sql(
    request: Request, context: QueryDep, body: Annotated[SqlRequest, Body()]
) -> JSONResponse:
    statements: SqlStatements = request.app.state.sql_statements
    statement = statements.compile(body.query)
    columns = [(c.name, c.type) for c in statement.columns]
    answer: Answer[Any]
    if statement.explain:
        answer = await explain(statement, context.view, context.db)
        columns, rows = [(PLAN_COLUMN, "text")], [(line,) for line in answer.rows]
    else:
        answer = await statement.query.read(context.view, context.db)
        times = [at for at, (_, kind) in enumerate(columns) if kind == "timestamptz"]
        rows = [_rendered(row, times) for row in statement.rows(answer)]
    listed: list[Any] = rows
    if body.format == "objects":
        names = [name for name, _ in columns]
        listed = [dict(zip(names, row, strict=True)) for row in rows]
    watermark = answer.watermark
    return JSONResponse(
        {
            "columns": [{"name": name, "type": kind} for name, kind in columns],
            "rows": listed,
            "metric": statement.query.metric.name,
            "batch_watermark": None if watermark is None else format_time(watermark),
            "batch_status": answer.batch_status,
            "speed_status": answer.speed_status,
        }
    )


def _rendered(row: tuple[Any, ...], times: list[int]) -> tuple[Any, ...]:
    """A row as JSON carries it: its `timestamptz` values (epoch ms) in RFC 3339."""
    if not times:
        return row
    values = list(row)
    for at in times:
        if values[at] is not None:
            values[at] = format_time(values[at])
    return tuple(values)
