"""Query parameters checked once, each failure a 400/404 that says what to send."""

from __future__ import annotations

from collections.abc import Mapping

from serving_layer.errors import bad_request, not_found
from serving_layer.timefmt import parse_time
from shared.aggregations import DEFAULT_RENDER, Ranking, RenderOptions, parse_quantiles
from shared.config import Settings
from shared.durations import format_duration, parse_duration
from shared.metric_plan import MetricPlan


def metric_of(settings: Settings, name: str) -> MetricPlan:
    metric = settings.plan(name)
    if metric is None:
        known = ", ".join(m.name for m in settings.metrics) or "none"
        raise not_found(f"unknown metric {name!r}; configured metrics: {known}")
    return metric


def window_of(metric: MetricPlan, text: str) -> int:
    allowed = ", ".join(format_duration(w) for w in metric.windows_ms)
    try:
        window = parse_duration(text)
    except ValueError:
        raise bad_request(f"window={text!r} is not a duration; use one of {allowed}") from None
    if window not in metric.windows_ms:
        raise bad_request(
            f"window {text!r} is not configured for {metric.name}; use one of {allowed}"
        )
    return window


def time_of(name: str, text: str) -> int:
    if " " in text.strip():
        text = text.strip().replace(" ", "+")  # an unencoded '+' in a query string
    try:
        value = parse_time(text)
    except (ValueError, OverflowError):
        value = None
    if value is None:
        raise bad_request(
            f"{name}={text!r} is not a time; send RFC 3339 with an offset "
            "(e.g. 2024-05-01T00:00:00Z) or integer epoch milliseconds"
        )
    return value


def range_of(start: str, end: str) -> tuple[int, int]:
    start_ms, end_ms = time_of("start", start), time_of("end", end)
    if start_ms >= end_ms:
        raise bad_request("start must be before end; send start < end")
    return start_ms, end_ms


def key_of(metric: MetricPlan, query: Mapping[str, str]) -> tuple[str, ...]:
    key = []
    for dim in metric.key:
        value = query.get(dim)
        if value is None:
            raise bad_request(
                f"missing key dimension {dim!r}; {metric.name} needs "
                + "&".join(f"{d}=<value>" for d in metric.key)
            )
        key.append(value)
    return tuple(key)


def options_of(q: str | None) -> RenderOptions:
    """The rendering a query asks for: `q` picks the quantiles a `quantiles(f)` point carries
    (a metric without one renders none and ignores it)."""
    if q is None:
        return DEFAULT_RENDER
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
        raise bad_request(
            f"the query spans {cells} cells, more than the limit of {limit} "
            f"(LAMBDA_SERVING__MAX_CELLS); {how}"
        )
