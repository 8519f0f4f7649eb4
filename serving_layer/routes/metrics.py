"""`/v1/metrics`: the configured metrics, their keys, merged series and top keys."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query, Request

from serving_layer.auth import ReaderDep
from serving_layer.deps import AsyncDbDep, ObserverDep, SettingsDep, ViewDep
from serving_layer.errors import bad_request
from serving_layer.params import (
    by_of,
    check_cells,
    key_of,
    metric_of,
    options_of,
    range_of,
    time_of,
    window_of,
)
from serving_layer.responses import JSONResponse
from serving_layer.schemas import (
    KeysResponse,
    MetricInfo,
    MetricList,
    SeriesResponse,
    TopResponse,
    problems,
)
from serving_layer.timefmt import format_time
from shared.durations import format_duration
from shared.windows import point_source, window_start, window_starts

router = APIRouter(
    prefix="/v1/metrics",
    tags=["metrics"],
    dependencies=[ReaderDep],
    responses=problems(400, 401, 404, 503),
)

WindowQ = Annotated[str, Query(description="one of the metric's windows, e.g. 1h")]
StartQ = Annotated[str, Query(description="RFC 3339 with offset, or epoch milliseconds")]
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
            )
            for m in settings.plans.values()
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
    result, found = await view.keys(db, metric, start_ms, end_ms, prefix)
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
    response_model=SeriesResponse,
    response_class=JSONResponse,
    description=(
        "The windows whose start is in `[start, end)`, merged from the batch view (cells ending "
        "at or before W) and the speed view. Every key dimension is a required query parameter "
        "(`?page=/home`). Empty windows are omitted."
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
    q: QuantilesQ = None,
) -> JSONResponse:
    metric = metric_of(settings, metric_name)
    window_ms = window_of(metric, window)
    start_ms, end_ms = range_of(start, end)
    options = options_of(q)
    key = key_of(metric, request.query_params)
    starts = window_starts(start_ms, end_ms, window_ms)
    check_cells(
        settings,
        len(starts) * (window_ms // metric.base_window_ms),
        "narrow [start, end) or use a larger window",
    )
    result = await view.series(db, metric, window_ms, starts, key, options)
    observer.observe_merge("series", result.batch_cells, result.speed_states)
    if result.speed_status == "unavailable":
        observer.speed_unavailable.inc()
    body = {
        "metric": metric.name,
        "window": format_duration(window_ms),
        "key": dict(zip(metric.key, key, strict=True)),
        "batch_watermark": _w(result.watermark),
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
    settings: SettingsDep,
    db: AsyncDbDep,
    view: ViewDep,
    observer: ObserverDep,
    window: WindowQ,
    at: Annotated[str, Query(description="any instant inside the window")],
    by: Annotated[
        str, Query(description="one of the outputs a point carries (e.g. count, p99)")
    ] = "count",
    n: Annotated[int, Query(description="how many keys")] = 10,
    q: QuantilesQ = None,
) -> JSONResponse:
    metric = metric_of(settings, metric_name)
    window_ms = window_of(metric, window)
    at_ms = time_of("at", at)
    ranking = by_of(metric, by, options_of(q))
    if not 1 <= n <= settings.serving.max_top_n:
        raise bad_request(f"n must be between 1 and {settings.serving.max_top_n}")
    check_cells(
        settings, window_ms // metric.base_window_ms, "use a smaller window for top queries"
    )
    start_ms = window_start(at_ms, window_ms)
    end_ms = start_ms + window_ms
    result, ranked = await view.top(db, metric, window_ms, start_ms, ranking)
    observer.observe_merge("top", result.batch_cells, result.speed_states)
    if result.speed_status == "unavailable":
        observer.speed_unavailable.inc()
    source = point_source(start_ms, end_ms, result.watermark)
    body = {
        "metric": metric.name,
        "window": format_duration(window_ms),
        "start": format_time(start_ms),
        "end": format_time(end_ms),
        "by": by,
        "batch_watermark": _w(result.watermark),
        "speed_status": result.speed_status,
        "items": [
            {"key": dict(zip(metric.key, key, strict=True)), "value": value, "source": source}
            for key, value in ranked[:n]
        ],
    }
    return JSONResponse(body)
