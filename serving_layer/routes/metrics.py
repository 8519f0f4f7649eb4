"""`/v1/metrics`: the configured metrics, their keys, merged series and top keys."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Annotated, Any

from fastapi import APIRouter, Query, Request

from serving_layer.auth import ReaderDep
from serving_layer.deps import AsyncDbDep, ObserverDep, SettingsDep, ViewDep
from serving_layer.errors import BatchViewUnsettled, bad_request
from serving_layer.merged_view import MergedView, ReadResult, SlicedResult
from serving_layer.observability import ServingMetrics
from serving_layer.params import (
    DeclaredParamsDep,
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
from serving_layer.pools import AsyncDb
from serving_layer.read_plan import check_retained
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
from serving_layer.selection import Selection
from serving_layer.sessions import (
    SESSION_RANKINGS,
    SessionRow,
    join_points,
    ranked_value,
    session_outputs,
    speed_sessions,
)
from serving_layer.timefmt import format_time
from serving_layer.windowing import WindowSpec
from shared.aggregations import DEFAULT_RENDER, Ranking, RenderOptions
from shared.config import Settings
from shared.durations import format_duration
from shared.metric_plan import MetricPlan, read_plans
from shared.speed_view import encode_key
from shared.speed_view.held import SessionPlans
from shared.windows import point_source, window_start, window_starts

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
    kept_from = metric.windows.kept_from(base, result.watermark)  # older cells are gone
    body = {
        "metric": metric.name,
        "start": format_time(start_ms if kept_from is None else max(start_ms, kept_from)),
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
    read = SeriesRead(
        settings,
        view,
        db,
        spec,
        (start_ms, end_ms),
        selection,
        options,
        step is None and tz is None,
    )
    if metric.sessions is None:
        result = await read.of(metric)
    else:
        result = await read.sessions(SessionPlans.of(metric, settings.plans.values()))
    if isinstance(result, SlicedResult):
        return _sliced_answer(observer, metric, spec, selection, limit, result)
    observer.observe_merge("series", result)
    body = {
        "metric": metric.name,
        "window": format_duration(window_ms),
        "key": selection.fixed,
        "batch_watermark": _w(result.watermark),
        "batch_status": result.batch_status,
        "speed_status": result.speed_status,
        "points": result.points,
    }
    return JSONResponse(body)


@dataclass(frozen=True)
class SeriesRead:
    """A series request, read for a plan through the one read pipeline (`merged_view`)."""

    settings: Settings
    view: MergedView
    db: AsyncDb
    spec: WindowSpec
    window: tuple[int, int]
    selection: Selection
    options: RenderOptions
    plain: bool
    """No `step` or `tz` was asked."""

    async def of(self, metric: MetricPlan) -> ReadResult | SlicedResult:
        """One key of a configured window by its exact, cached path (`ReadResult`); any other
        series merged over the keys passing the filters, of the metric or its smallest
        covering rollup (`SlicedResult`)."""
        start_ms, end_ms = self.window
        size = self.spec.size_ms
        pre_rolled = self.plain and size in metric.windows_ms
        key = self.selection.exact_key
        if key is not None and pre_rolled:
            starts = window_starts(start_ms, end_ms, size)
            return await self.view.series(self.db, metric, size, starts, key, self.options)
        windows = windows_of(metric, self.spec, start_ms, end_ms)
        plan, read = answering_plan(self.settings, metric, self.selection)
        rolled_key = read.exact_key
        if rolled_key is None or not pre_rolled:
            return await self.view.sliced_series(self.db, plan, windows, read, self.options)
        starts = window_starts(start_ms, end_ms, size)  # one key of a rollup: its exact path
        one = await self.view.series(self.db, plan, size, starts, rolled_key, self.options)
        return SlicedResult(
            one.watermark,
            one.speed_status,
            one.batch_cells,
            one.speed_states,
            {(): one.points},
            one.batch_status,
            one.stamp,
        )

    async def sessions(self, plans: SessionPlans) -> ReadResult | SlicedResult:
        """A session metric's series: its three plans read alike, under one served row
        (read again when a run published between them), joined window by window."""
        for _ in range(_SESSION_READS):
            events, sessions, bounces = await asyncio.gather(
                self.of(plans.metric), self.of(plans.sessions), self.of(plans.bounces)
            )
            if events.stamp == sessions.stamp == bounces.stamp:
                break
        else:
            raise BatchViewUnsettled("the batch view changed during the read several times; retry")
        events.batch_cells += sessions.batch_cells + bounces.batch_cells
        events.speed_states += sessions.speed_states + bounces.speed_states
        if isinstance(events, ReadResult):
            assert isinstance(sessions, ReadResult) and isinstance(bounces, ReadResult)
            events.points = join_points(events.points, sessions.points, bounces.points)
            return events
        assert isinstance(sessions, SlicedResult) and isinstance(bounces, SlicedResult)
        for group, points in events.groups.items():
            events.groups[group] = join_points(
                points, sessions.groups.get(group, []), bounces.groups.get(group, [])
            )
        return events


_SESSION_READS = 4
"""How often a session series reads its three plans before answering 503 (a run published
between them each time)."""


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
    settings: SettingsDep,
    db: AsyncDbDep,
    view: ViewDep,
    start: StartQ,
    end: Annotated[str, Query(description="sessions starting before this")],
    limit: Annotated[int, Query(description="at most this many sessions, the first ones")] = 100,
    q: QuantilesQ = None,
) -> JSONResponse:
    metric = metric_of(settings, metric_name)
    if metric.sessions is None:
        raise bad_request(f"{metric.name} is not a session metric; use /series")
    start_ms, end_ms = range_of(start, end)
    check_supported(start_ms, end_ms, "[start, end)", "send times in years 1 to 9999")
    options = options_of(q)
    if not 1 <= limit <= settings.serving.max_keys_limit:
        raise bad_request(f"limit must be between 1 and {settings.serving.max_keys_limit}")
    selection = selection_of(metric, request.query_params, ("start", "end", "limit", "q"))
    key = selection.exact_key
    if key is None:
        dims = ", ".join(f"{d}=..." for d in metric.key)
        raise bad_request(f"name one key: give each of {metric.name}'s dimensions once ({dims})")
    plans = SessionPlans.of(metric, settings.plans.values())
    window = (start_ms, end_ms)
    (served, stored), (status, held) = await asyncio.gather(  # independent: both at once
        view.batch.sessions(db, metric, plans.sessions, key, window, limit + 1),
        view.speed.read_held(metric, encode_key(key)),
    )
    first_bucket = window_start(start_ms, metric.base_window_ms)  # a session's, by its start
    check_retained(metric, [(first_bucket, first_bucket + metric.base_window_ms)], served.watermark)
    rows = [SessionRow(s.start_ms, s.start_ms + s.duration_ms, s.state, "batch") for s in stored]
    rows += speed_sessions(held, served.watermark, window)
    key_map = selection.fixed
    body = {
        "metric": metric.name,
        "key": key_map,
        "start": format_time(start_ms),
        "end": format_time(end_ms),
        "batch_watermark": _w(served.watermark),
        "speed_status": status,
        "sessions": [row.render(metric, key_map, options) for row in rows[:limit]],
        "truncated": len(rows) > limit,
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
    ranked_plan, ranking = _ranking_of(settings, metric, by, options_of(q))
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
    plan, read = answering_plan(settings, ranked_plan, selection)
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
                "value": ranked_value(by, value),
                "source": source,
            }
            for key, value in ranked[:n]
        ],
    }
    return JSONResponse(body)


def _ranking_of(
    settings: Settings, metric: MetricPlan, by: str, options: RenderOptions
) -> tuple[MetricPlan, Ranking]:
    """The plan `top` reads and how it ranks it: a session output through the part holding
    it (`SESSION_RANKINGS`), else one of the metric's outputs."""
    if metric.sessions is None:
        return metric, by_of(metric, by, options)
    plans = SessionPlans.of(metric, settings.plans.values())
    if by in SESSION_RANKINGS:
        part_name, part_by = SESSION_RANKINGS[by]
        part = plans.sessions if part_name == "sessions" else plans.bounces
        return part, by_of(part, part_by, options)
    if by not in plans.metric.aggregations.output_names(options):
        names = [*SESSION_RANKINGS, *metric.aggregations.output_names(options)]
        raise bad_request(
            f"by={by!r} is not an output of {metric.name}; use one of " + ", ".join(names)
        )
    return metric, by_of(metric, by, options)


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
