"""`/v1/metrics`: the configured metrics, their keys, merged series and top keys."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Query, Request

from serving_layer.auth import ReaderDep
from serving_layer.deps import QueryDep, SettingsDep
from serving_layer.params import (
    DeclaredParamsDep,
    metric_of,
    options_of,
    range_of,
    selection_of,
    time_of,
    window_of,
    window_spec_of,
)
from serving_layer.query import KeysQuery, SeriesQuery, SessionsQuery, TopQuery
from serving_layer.read_plan import Answer, SeriesRows
from serving_layer.responses import JSONResponse
from serving_layer.schemas import (
    GroupedSeriesResponse,
    KeysResponse,
    LookupInfo,
    MetricInfo,
    MetricList,
    SeriesResponse,
    SessionInfo,
    SessionsResponse,
    TopResponse,
    problems,
)
from serving_layer.sessions import (
    SESSION_RANKINGS,
    ranked_value,
    session_outputs,
)
from serving_layer.timefmt import format_time
from shared.aggregations import DEFAULT_RENDER
from shared.config import Settings
from shared.durations import format_duration
from shared.metric_plan import MetricPlan, read_plans
from shared.speed_view.held import SessionPlans
from shared.windows import point_source

router = APIRouter(
    prefix="/v1/metrics",
    tags=["metrics"],
    dependencies=[ReaderDep, DeclaredParamsDep],
    responses=problems(400, 401, 404, 503),
)

WindowQ = Annotated[str, Query(description="one of the metric's windows, e.g. 1h")]
StartQ = Annotated[str, Query(description="RFC 3339 with offset, or epoch milliseconds")]
GroupByQ = Annotated[
    str | None,
    Query(
        description="comma-separated key dimensions: one answer per group of them, every other "
        "dimension merged over",
        examples=["country"],
    ),
]
SERIES_PARAMS = ("window", "start", "end", "group_by", "limit", "step", "tz", "q")
TOP_PARAMS = ("window", "at", "by", "n", "group_by", "q")
QuantilesQ = Annotated[
    str | None,
    Query(
        description="the quantiles a quantiles(<field>) metric renders, each in (0, 1): "
        "0.5,0.9,0.99 (the default) renders p50, p90, p99; 0.999 renders p99.9",
        examples=["0.5,0.9,0.99"],
    ),
]


def _w(watermark: int | None) -> str | None:
    return None if watermark is None else format_time(watermark)


@router.get("", response_model=MetricList)
def list_metrics(settings: SettingsDep) -> MetricList:
    return MetricList(
        metrics=[
            MetricInfo(
                name=m.name,
                source=m.source.name,
                key=list(m.key),
                value=m.value,
                aggregations=_outputs(settings, m),
                by=[*(SESSION_RANKINGS if m.sessions else ()), *m.output_names],
                session=None
                if m.config.session is None
                else SessionInfo(
                    gap=format_duration(m.config.session.gap),
                    max_duration=format_duration(m.config.session.max_duration),
                ),
                windows=[format_duration(w) for w in m.windows_ms],
                retention={format_duration(w): format_duration(r) for w, r in m.config.retention},
                grace=format_duration(m.grace_ms) if m.grace_ms else "0s",
                version=m.version,
                rollups=[list(dims) for dims in m.rollups],
                fields=dict(m.config.fields),
                where=m.config.where,
                lookups=[
                    LookupInfo(table=lookup.table, on=lookup.on, alias=lookup.alias)
                    for lookup in m.config.lookups
                ],
            )
            for m in read_plans(settings.plans.values())
        ]
    )


def _outputs(settings: Settings, metric: MetricPlan) -> list[str]:
    """What a point of `metric` carries by default besides start/end/source."""
    if metric.sessions is None:
        return list(metric.output_names)
    return session_outputs(SessionPlans.of(metric, settings.plans.values()), DEFAULT_RENDER)


@router.get(
    "/{metric_name}/keys",
    response_model=KeysResponse,
    response_class=JSONResponse,
    description="Keys with data in `[start, end)`: batch cells before W, speed cells after.",
)
async def keys(
    metric_name: str,
    request: Request,
    context: QueryDep,
    start: StartQ,
    end: Annotated[str, Query(description="exclusive end")],
    prefix: Annotated[
        str | None, Query(description="keys whose first dimension starts with this")
    ] = None,
    limit: Annotated[int, Query(description="at most this many keys, ascending")] = 100,
) -> JSONResponse:
    metric = metric_of(context.settings, metric_name)
    window = range_of(start, end)
    selection = selection_of(metric, request.query_params, ("start", "end", "prefix", "limit"))
    query = KeysQuery.of(context.settings, metric, window, prefix, selection, limit)
    answer = await query.read(context.view, context.db)
    kept_from = metric.windows.kept_from(metric.base_window_ms, answer.watermark)  # older: gone
    body = {
        "metric": metric.name,
        "start": format_time(window[0] if kept_from is None else max(window[0], kept_from)),
        "end": format_time(window[1]),
        "batch_watermark": _w(answer.watermark),
        "speed_status": answer.speed_status,
        "keys": [dict(zip(metric.key, k, strict=True)) for k in answer.rows[:limit]],
        "truncated": len(answer.rows) > limit,
    }
    return JSONResponse(body)


@router.get(
    "/{metric_name}/series",
    response_model=SeriesResponse | GroupedSeriesResponse,
    response_class=JSONResponse,
    description=(
        "The windows whose start is in `[start, end)`, merged from the batch view (cells ending "
        "at or before W) and the speed view. A key dimension given as `dim=value` fixes it "
        "(repeated: any of the values); `group_by=d1,d2` answers one series per group; every "
        "other dimension is merged over (none given: the metric's total). Empty windows are "
        "omitted."
    ),
)
async def series(
    metric_name: str,
    request: Request,
    context: QueryDep,
    window: WindowQ,
    start: StartQ,
    end: Annotated[str, Query(description="windows starting before this")],
    group_by: GroupByQ = None,
    limit: Annotated[int, Query(description="at most this many groups (with group_by)")] = 100,
    step: Annotated[
        str | None,
        Query(description="hopping windows: a new window every `step` (default: `window`)"),
    ] = None,
    tz: Annotated[
        str | None,
        Query(description="IANA zone aligning windows of whole days to local midnight"),
    ] = None,
    q: QuantilesQ = None,
) -> JSONResponse:
    metric = metric_of(context.settings, metric_name)
    spec = window_spec_of(metric, window, step, tz)
    window_range = range_of(start, end)
    options = options_of(q)
    selection = selection_of(metric, request.query_params, SERIES_PARAMS, group_by)
    query = SeriesQuery.of(context.settings, metric, spec, window_range, selection, options, limit)
    answer = await query.read(context.view, context.db)
    context.observer.observe_merge("series", answer)
    return JSONResponse(_series_body(query, answer))


@router.get(
    "/{metric_name}/sessions",
    response_model=SessionsResponse,
    response_class=JSONResponse,
    description=(
        "One key's sessions (a session metric, rule 13) starting in `[start, end)`, ascending: "
        "the batch view's before W, the speed view's from W on. Every key dimension is given "
        "once."
    ),
)
async def sessions(
    metric_name: str,
    request: Request,
    context: QueryDep,
    start: StartQ,
    end: Annotated[str, Query(description="sessions starting before this")],
    limit: Annotated[int, Query(description="at most this many sessions, the first ones")] = 100,
    q: QuantilesQ = None,
) -> JSONResponse:
    metric = metric_of(context.settings, metric_name)
    window = range_of(start, end)
    options = options_of(q)
    selection = selection_of(metric, request.query_params, ("start", "end", "limit", "q"))
    query = SessionsQuery.of(context.settings, metric, window, selection, limit)
    answer = await query.read(context.view, context.db)
    key_map = selection.fixed
    body = {
        "metric": metric.name,
        "key": key_map,
        "start": format_time(query.start_ms),
        "end": format_time(query.end_ms),
        "batch_watermark": _w(answer.watermark),
        "speed_status": answer.speed_status,
        "sessions": [row.render(metric, key_map, options) for row in answer.rows[:limit]],
        "truncated": len(answer.rows) > limit,
    }
    return JSONResponse(body)


@router.get(
    "/{metric_name}/top",
    response_model=TopResponse,
    response_class=JSONResponse,
    description="Keys ranked by `by` over the window containing `at`, largest first; ties by "
    "key ascending.",
)
async def top(
    metric_name: str,
    request: Request,
    context: QueryDep,
    window: WindowQ,
    at: Annotated[str, Query(description="any instant inside the window")],
    by: Annotated[
        str, Query(description="one of the outputs a point carries (e.g. count, p99)")
    ] = "count",
    n: Annotated[int, Query(description="how many groups")] = 10,
    group_by: GroupByQ = None,
    q: QuantilesQ = None,
) -> JSONResponse:
    metric = metric_of(context.settings, metric_name)
    window_ms = window_of(metric, window)
    at_ms = time_of("at", at)
    options = options_of(q)
    selection = selection_of(
        metric,
        request.query_params,
        TOP_PARAMS,
        ",".join(metric.key) if group_by is None else group_by,
    )
    query = TopQuery.of(context.settings, metric, by, window_ms, at_ms, selection, n, options)
    answer = await query.read(context.view, context.db)
    context.observer.observe_merge("top", answer)
    source = point_source(query.start_ms, query.end_ms, answer.watermark)
    body = {
        "metric": metric.name,
        "window": format_duration(window_ms),
        "start": format_time(query.start_ms),
        "end": format_time(query.end_ms),
        "by": by,
        "batch_watermark": _w(answer.watermark),
        "batch_status": answer.batch_status,
        "speed_status": answer.speed_status,
        "items": [
            {
                "key": dict(zip(selection.group_by, key, strict=True)),
                "value": ranked_value(by, value),
                "source": source,
            }
            for key, value in answer.rows[:n]
        ],
    }
    return JSONResponse(body)


def _series_body(query: SeriesQuery, answer: Answer[SeriesRows]) -> dict[str, Any]:
    """A series answer: one key's points (`SeriesQuery.one_key`), the merge over the keys
    passing the filters, or one series per group, over any windows (of any multiple of the
    base cell, hopping, aligned to a time zone)."""
    spec, selection = query.spec, query.selection
    head: dict[str, Any] = {"metric": query.metric.name, "window": format_duration(spec.size_ms)}
    if spec.step_ms != spec.size_ms:
        head["step"] = format_duration(spec.step_ms)
    if spec.tz is not None:
        head["tz"] = str(spec.tz)
    tail = {
        "batch_watermark": _w(answer.watermark),
        "batch_status": answer.batch_status,
        "speed_status": answer.speed_status,
    }
    if not selection.group_by:
        filters = {} if query.one_key else {"filters": selection.filter_map()}
        points = [point.json for point in answer.rows.get((), [])]
        return {**head, "key": selection.fixed, **filters, **tail, "points": points}
    groups = sorted(answer.rows.items())
    return {
        **head,
        "filters": selection.filter_map(),
        "group_by": list(selection.group_by),
        **tail,
        "groups": [
            {
                "key": dict(zip(selection.group_by, group, strict=True)),
                "points": [point.json for point in points],
            }
            for group, points in groups[: query.limit]
        ],
        "truncated": len(groups) > query.limit,
    }
