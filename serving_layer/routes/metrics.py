"""`/v1/metrics`: the configured metrics, their keys, merged series and top keys."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Query, Request

from serving_layer.auth import ReaderDep
from serving_layer.deps import AsyncDbDep, ObserverDep, SettingsDep, ViewDep
from serving_layer.errors import bad_request
from serving_layer.merged_view import SlicedResult
from serving_layer.observability import ServingMetrics
from serving_layer.params import (
    answering_plan,
    by_of,
    check_cells,
    check_key_text,
    check_supported,
    check_windows,
    metric_of,
    options_of,
    range_of,
    selection_of,
    time_of,
    window_of,
    window_spec_of,
    windows_of,
)
from serving_layer.responses import JSONResponse
from serving_layer.schemas import (
    GroupedSeriesResponse,
    KeysResponse,
    LookupInfo,
    MetricInfo,
    MetricList,
    SeriesResponse,
    TopResponse,
    problems,
)
from serving_layer.selection import Selection
from serving_layer.timefmt import format_time
from serving_layer.windowing import WindowSpec
from shared.durations import format_duration
from shared.metric_plan import MetricPlan, read_plans
from shared.windows import point_source, window_start, window_starts

router = APIRouter(
    prefix="/v1/metrics",
    tags=["metrics"],
    dependencies=[ReaderDep],
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
                aggregations=list(m.output_names),
                by=list(m.output_names),
                windows=[format_duration(w) for w in m.windows_ms],
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


@router.get(
    "/{metric_name}/keys",
    response_model=KeysResponse,
    response_class=JSONResponse,
    description="Keys with data in `[start, end)`: batch cells before W, speed cells after.",
)
async def keys(
    metric_name: str,
    request: Request,
    settings: SettingsDep,
    db: AsyncDbDep,
    view: ViewDep,
    start: StartQ,
    end: Annotated[str, Query(description="exclusive end")],
    prefix: Annotated[
        str | None, Query(description="keys whose first dimension starts with this")
    ] = None,
    limit: Annotated[int, Query(description="at most this many keys, ascending")] = 100,
) -> JSONResponse:
    metric = metric_of(settings, metric_name)
    start_ms, end_ms = range_of(start, end)
    if not 1 <= limit <= settings.serving.max_keys_limit:
        raise bad_request(f"limit must be between 1 and {settings.serving.max_keys_limit}")
    base = metric.base_window_ms
    check_cells(
        settings,
        (end_ms - start_ms + base - 1) // base,
        f"narrow [start, end) to at most {settings.serving.max_cells} "
        f"{format_duration(base)} cells",
    )
    if prefix is not None:
        check_key_text("prefix", prefix)
    selection = selection_of(metric, request.query_params, ("start", "end", "prefix", "limit"))
    result, found = await view.keys(db, metric, start_ms, end_ms, prefix, selection)
    body = {
        "metric": metric.name,
        "start": format_time(start_ms),
        "end": format_time(end_ms),
        "batch_watermark": _w(result.watermark),
        "speed_status": result.speed_status,
        "keys": [dict(zip(metric.key, k, strict=True)) for k in found[:limit]],
        "truncated": len(found) > limit,
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
    settings: SettingsDep,
    db: AsyncDbDep,
    view: ViewDep,
    observer: ObserverDep,
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
    metric = metric_of(settings, metric_name)
    spec = window_spec_of(metric, window, step, tz)
    window_ms = spec.size_ms
    start_ms, end_ms = range_of(start, end)
    options = options_of(q)
    selection = selection_of(metric, request.query_params, SERIES_PARAMS, group_by)
    if not 1 <= limit <= settings.serving.max_groups:
        raise bad_request(f"limit must be between 1 and {settings.serving.max_groups}")
    check_windows(settings, metric, spec, start_ms, end_ms)
    pre_rolled = step is None and tz is None and window_ms in metric.windows_ms
    key = selection.exact_key
    if key is None or not pre_rolled:
        windows = windows_of(metric, spec, start_ms, end_ms)
        plan, read = answering_plan(settings, metric, selection)
        rolled_key = read.exact_key
        if rolled_key is not None and pre_rolled:  # one key of a rollup: its cached exact path
            one = await view.series(
                db, plan, window_ms, window_starts(start_ms, end_ms, window_ms), rolled_key, options
            )
            sliced = SlicedResult(
                one.watermark,
                one.speed_status,
                one.batch_cells,
                one.speed_states,
                {(): one.points},
                one.batch_status,
            )
        else:
            sliced = await view.sliced_series(db, plan, windows, read, options)
        return _sliced_answer(observer, metric, spec, selection, limit, sliced)
    result = await view.series(
        db, metric, window_ms, window_starts(start_ms, end_ms, window_ms), key, options
    )
    observer.observe_merge("series", result)
    body = {
        "metric": metric.name,
        "window": format_duration(window_ms),
        "key": dict(zip(metric.key, key, strict=True)),
        "batch_watermark": _w(result.watermark),
        "batch_status": result.batch_status,
        "speed_status": result.speed_status,
        "points": result.points,
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
    settings: SettingsDep,
    db: AsyncDbDep,
    view: ViewDep,
    observer: ObserverDep,
    window: WindowQ,
    at: Annotated[str, Query(description="any instant inside the window")],
    by: Annotated[
        str, Query(description="one of the outputs a point carries (e.g. count, p99)")
    ] = "count",
    n: Annotated[int, Query(description="how many groups")] = 10,
    group_by: GroupByQ = None,
    q: QuantilesQ = None,
) -> JSONResponse:
    metric = metric_of(settings, metric_name)
    window_ms = window_of(metric, window)
    at_ms = time_of("at", at)
    ranking = by_of(metric, by, options_of(q))
    selection = selection_of(
        metric,
        request.query_params,
        TOP_PARAMS,
        ",".join(metric.key) if group_by is None else group_by,
    )
    if not 1 <= n <= settings.serving.max_top_n:
        raise bad_request(f"n must be between 1 and {settings.serving.max_top_n}")
    check_cells(
        settings, window_ms // metric.base_window_ms, "use a smaller window for top queries"
    )
    start_ms = window_start(at_ms, window_ms)
    end_ms = start_ms + window_ms
    check_supported(start_ms, end_ms, "the window holding `at`", "send a smaller window")
    plan, read = answering_plan(settings, metric, selection)
    result, ranked = await view.top(db, plan, window_ms, start_ms, ranking, read)
    observer.observe_merge("top", result)
    source = point_source(start_ms, end_ms, result.watermark)
    body = {
        "metric": metric.name,
        "window": format_duration(window_ms),
        "start": format_time(start_ms),
        "end": format_time(end_ms),
        "by": by,
        "batch_watermark": _w(result.watermark),
        "batch_status": result.batch_status,
        "speed_status": result.speed_status,
        "items": [
            {
                "key": dict(zip(selection.group_by, key, strict=True)),
                "value": value,
                "source": source,
            }
            for key, value in ranked[:n]
        ],
    }
    return JSONResponse(body)


def _sliced_answer(
    observer: ServingMetrics,
    metric: MetricPlan,
    spec: WindowSpec,
    selection: Selection,
    limit: int,
    result: SlicedResult,
) -> JSONResponse:
    """A series merged over the keys passing the filters (one, or one per group), over any
    windows: of any multiple of the base cell, hopping, aligned to a time zone."""
    observer.observe_merge("series", result)
    head: dict[str, Any] = {"metric": metric.name, "window": format_duration(spec.size_ms)}
    if spec.step_ms != spec.size_ms:
        head["step"] = format_duration(spec.step_ms)
    if spec.tz is not None:
        head["tz"] = str(spec.tz)
    tail = {
        "batch_watermark": _w(result.watermark),
        "batch_status": result.batch_status,
        "speed_status": result.speed_status,
    }
    if not selection.group_by:
        points = result.groups.get((), [])
        return JSONResponse(
            {
                **head,
                "key": selection.fixed,
                "filters": selection.filter_map(),
                **tail,
                "points": points,
            }
        )
    groups = sorted(result.groups.items())
    body = {
        **head,
        "filters": selection.filter_map(),
        "group_by": list(selection.group_by),
        **tail,
        "groups": [
            {"key": dict(zip(selection.group_by, group, strict=True)), "points": points}
            for group, points in groups[:limit]
        ],
        "truncated": len(groups) > limit,
    }
    return JSONResponse(body)
