"""Query parameters checked once, each failure a 400/404 that says what to send."""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import get_args

from fastapi import Depends, HTTPException, Request
from fastapi.routing import APIRoute
from starlette.datastructures import QueryParams

from serving_layer.errors import bad_request, not_found
from serving_layer.selection import Selection
from serving_layer.timefmt import format_time, parse_time
from serving_layer.windowing import WindowError, WindowSpec
from shared.aggregations import DEFAULT_RENDER, Ranking, RenderOptions, parse_quantiles
from shared.config import Settings
from shared.durations import format_duration, parse_duration
from shared.events import MAX_EVENT_MS, MIN_EVENT_MS
from shared.expressions.zones import zone_info
from shared.metric_plan import MetricPlan

SUPPORTED_MS = (MIN_EVENT_MS, MAX_EVENT_MS + 1)
"""Where every time a query names and every window it reaches must lie: the years 1-9999 an
event time may have (so every stored cell of a base window dividing a day is reachable)."""


def metric_of(settings: Settings, name: str) -> MetricPlan:
    metric = settings.plan(name)
    if metric is None or metric.rollup is not None or metric.session_part is not None:
        known = ", ".join(m.name for m in settings.metrics) or "none"
        raise not_found(f"unknown metric {name!r}; configured metrics: {known}")
    return metric


def window_of(metric: MetricPlan, text: str) -> int:
    """A window size: any positive multiple of the metric's base window."""
    return _multiple_of_base(metric, "window", text)


def window_spec_of(metric: MetricPlan, window: str, step: str | None, tz: str | None) -> WindowSpec:
    """The windows a series asks for: `window` and `step` multiples of the base window
    (`step` defaults to `window`), `tz` an IANA zone aligning whole-day windows to local
    midnight."""
    size = window_of(metric, window)
    step_ms = size if step is None else _multiple_of_base(metric, "step", step)
    if tz is None:
        return WindowSpec(size, step_ms)
    zone = zone_info(tz)
    if zone is None:
        raise bad_request(f"tz={tz!r} is not an IANA time zone name; send e.g. tz=Europe/Berlin")
    return WindowSpec(size, step_ms, zone)


def _multiple_of_base(metric: MetricPlan, name: str, text: str) -> int:
    base = format_duration(metric.base_window_ms)
    configured = ", ".join(format_duration(w) for w in metric.windows_ms)
    check_plain(name, text, format_duration(metric.windows_ms[0]))
    try:
        value = parse_duration(text)
    except ValueError:
        raise bad_request(
            f"{name}={text!r} is not a duration; send a multiple of {metric.name}'s base window "
            f"{base}, e.g. one of {configured}"
        ) from None
    if value <= 0 or value % metric.base_window_ms:
        raise bad_request(
            f"{name}={text!r} is not a positive multiple of {metric.name}'s base window {base}; "
            f"send e.g. one of {configured}"
        )
    return value


def time_of(name: str, text: str) -> int:
    check_plain(name, text, "2024-05-01T00:00:00Z")
    try:
        value = parse_time(text.replace(" ", "+"))  # an unencoded '+' arrives as ' '
    except (ValueError, OverflowError):
        value = None
    if value is None:
        raise bad_request(
            f"{name}={text!r} is not a time; send RFC 3339 with an offset "
            "(e.g. 2024-05-01T00:00:00Z) or integer epoch milliseconds, in years 1 to 9999"
        )
    return value


def range_of(start: str, end: str) -> tuple[int, int]:
    start_ms, end_ms = time_of("start", start), time_of("end", end)
    if start_ms >= end_ms:
        raise bad_request("start must be before end; send start < end")
    return start_ms, end_ms


def selection_of(
    metric: MetricPlan,
    query: QueryParams,
    accepted: Iterable[str],
    group_by: str | None = None,
) -> Selection:
    """The query's filters (`dim=value`, repeated for any of several values) and `group_by`
    (a comma-separated subset of the key); any other parameter than `accepted` and the key
    dimensions is a 400 naming what may be sent."""
    accepted = set(accepted)
    for name in query:
        if name not in accepted and name not in metric.key:
            dims = ", ".join(metric.key) or "none"
            raise bad_request(
                f"unknown parameter {name!r}; {metric.name}'s dimensions are {dims}, and this "
                f"query also takes {', '.join(sorted(accepted))}"
            )
    filters = tuple((dim, frozenset(query.getlist(dim))) for dim in metric.key if dim in query)
    for dim, values in filters:
        for value in values:
            check_key_text(dim, value)
    grouped: tuple[str, ...] = ()
    if group_by is not None:
        grouped = tuple(d.strip() for d in group_by.split(",") if d.strip())
        unknown = [d for d in grouped if d not in metric.key]
        if unknown or len(set(grouped)) != len(grouped):
            dims = ", ".join(metric.key) or "none: it has one global series"
            raise bad_request(
                f"group_by={group_by!r} must name distinct dimensions of {metric.name}'s key "
                f"({dims}), comma-separated"
            )
    return Selection(metric.key, filters, grouped)


def options_of(q: str | None) -> RenderOptions:
    """The rendering a query asks for: `q` picks the quantiles a `quantiles(f)` point carries
    (a metric without one renders none and ignores it)."""
    if q is None:
        return DEFAULT_RENDER
    check_plain("q", q, "0.5,0.9,0.99", separator=",")
    try:
        return RenderOptions(parse_quantiles(q))
    except ValueError as exc:
        raise bad_request(f"q={q!r}: {exc}") from None


def by_of(metric: MetricPlan, by: str, options: RenderOptions) -> Ranking:
    """How `top` ranks: `by` must be one of the outputs a point carries under `options`."""
    names = metric.aggregations.output_names(options)
    ranking = metric.aggregations.ranking(by) if by in names else None
    if ranking is None:
        raise bad_request(
            f"by={by!r} is not an aggregation of {metric.name}; use one of " + ", ".join(names)
        )
    return ranking


def check_cells(settings: Settings, cells: int, how: str) -> None:
    limit = settings.serving.max_cells
    if cells > limit:
        raise _too_many_cells(limit, cells, how)


def _too_many_cells(limit: int, cells: int, how: str) -> HTTPException:
    return bad_request(
        f"the query spans {cells} cells, more than the limit of {limit} "
        f"(LAMBDA_SERVING__MAX_CELLS); {how}"
    )


def check_plain(name: str, text: str, example: str, separator: str | None = None) -> None:
    """A number, time or duration is sent in ASCII with no space around it (each of the
    `separator`-separated ones, for a list): Python's `int`, `float` and `Decimal` read other
    scripts' digits (fullwidth or Arabic-Indic ones) and skip surrounding space, so a value
    mistyped or pasted with a space would be read as if it were plain. Every such parameter is
    checked here, before it is parsed."""
    parts = [text] if separator is None else text.split(separator)
    if not text.isascii():
        problem = "holds characters other than ASCII"
    elif any(part != part.strip() for part in parts):
        problem = "has a space around a value"
    else:
        return
    raise bad_request(
        f"{name}={text!r} {problem}; write it in ASCII (digits 0-9) with nothing around it, "
        f"e.g. {name}={example}"
    )


INTEGER = re.compile(r"-?[0-9]+")
"""An integer parameter as sent (`n`, `limit`): pydantic would also read `+5`, `1_0` and
`10.0`."""


async def check_declared(request: Request) -> None:
    """Every query parameter a route declares is sent at most once (Starlette's `get` would
    keep the last one silently: `window=1h&window=1m` asked for 1m windows), and one declared
    as an integer is ASCII digits. The others are a metric's key dimensions, which a query
    repeats for any of several values (`selection_of`). A router dependency: one check for
    every route, before any parameter is parsed."""
    route = request.scope.get("route")
    if not isinstance(route, APIRoute):
        return
    query = request.query_params
    for field in route.dependant.query_params:
        name, info = field.alias, field.field_info
        values = query.getlist(name)
        if len(values) > 1:
            raise bad_request(
                f"{name} is sent {len(values)} times; send it once (only a key dimension, "
                "dim=value, may repeat: any of its values)"
            )
        if values and int in (get_args(info.annotation) or (info.annotation,)):
            example = str(info.default if isinstance(info.default, int) else 1)
            check_plain(name, values[0], example)
            if not INTEGER.fullmatch(values[0]):
                raise bad_request(
                    f"{name}={values[0]!r} is not an integer; send digits 0-9, e.g. "
                    f"{name}={example}"
                )


DeclaredParamsDep = Depends(check_declared)


def check_key_text(name: str, value: str) -> None:
    """A value compared with key dimensions holds no NUL: no key can (an event with one is
    skipped as `key_invalid`: PostgreSQL text cannot hold it)."""
    if "\x00" in value:
        raise bad_request(
            f"{name}={value!r} holds a NUL character (%00), which no key can hold; send the "
            "value without it"
        )


def check_supported(start_ms: int, end_ms: int, what: str, how: str) -> None:
    """`[start_ms, end_ms)` (`what`) must lie within `SUPPORTED_MS`; else a 400 saying `how`
    to get there."""
    low, high = SUPPORTED_MS
    if start_ms < low or end_ms > high:
        raise bad_request(
            f"{what} would span [{format_time(start_ms)}, {format_time(end_ms)}), outside the "
            f"supported times [{format_time(low)}, {format_time(high)}) (years 1 to 9999); {how}"
        )


def windows_of(
    metric: MetricPlan, spec: WindowSpec, start_ms: int, end_ms: int
) -> list[tuple[int, int]]:
    """The windows a series asks for (call `check_windows` first), each bound on a cell
    boundary of `metric`."""
    windows = spec.windows(start_ms, end_ms)
    try:
        spec.check_cells(windows, metric.base_window_ms)
    except WindowError as exc:
        raise bad_request(str(exc)) from None
    return windows


def check_windows(
    settings: Settings, metric: MetricPlan, spec: WindowSpec, start_ms: int, end_ms: int
) -> None:
    """Before anything is built: the windows starting in `[start_ms, end_ms)` lie within the
    supported times, and they compose at most `serving.max_cells` cells — a cell counted once
    per window holding it, as the merge composes it (a local day counts as 24 hours)."""
    extent = spec.extent(start_ms, end_ms)
    check_supported(
        extent.first_ms, extent.end_ms, "the windows", "send an earlier end or a smaller window"
    )
    base = metric.base_window_ms
    per_window = spec.size_ms // base
    cells = extent.windows * per_window
    limit = settings.serving.max_cells
    if cells <= limit:
        return
    size = format_duration(spec.size_ms)
    asked = f"{extent.windows} windows of {size}, {per_window} x {format_duration(base)} cells each"
    fit = limit // per_window
    if not fit:
        raise _too_many_cells(
            limit, cells, f"{asked}; send a window of at most {format_duration(limit * base)}"
        )
    fewer = (
        f"{asked}; narrow [start, end) to at most {fit} windows "
        f"(end={format_time(spec.nth_start(start_ms, fit))})"
    )
    if spec.step_ms < spec.size_ms:
        fewer += f", or send a larger step (step={size} reads each cell once)"
    raise _too_many_cells(limit, cells, fewer)
