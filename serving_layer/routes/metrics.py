"""`/v1/metrics`: the configured metrics and their merged series."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Query, Request

from serving_layer.deps import DbDep, RedisDep, SettingsDep
from serving_layer.errors import bad_request, not_found
from serving_layer.merged_view import read_series
from serving_layer.timefmt import format_time, parse_time
from shared.config import MetricConfig, Settings
from shared.durations import format_duration, parse_duration
from shared.windows import window_starts

router = APIRouter(prefix="/v1/metrics", tags=["metrics"])


def _metric(settings: Settings, name: str) -> MetricConfig:
    metric = settings.metric(name)
    if metric is None:
        known = ", ".join(m.name for m in settings.metrics) or "none"
        raise not_found(f"unknown metric {name!r}; configured metrics: {known}")
    return metric


def _window(metric: MetricConfig, text: str) -> int:
    allowed = ", ".join(format_duration(w) for w in metric.windows)
    try:
        window = parse_duration(text)
    except ValueError:
        raise bad_request(f"window={text!r} is not a duration; use one of {allowed}") from None
    if window not in metric.windows:
        raise bad_request(f"window {text!r} is not configured for {metric.name}; use {allowed}")
    return window


def _time(name: str, text: str) -> int:
    value = parse_time(text)
    if value is None:
        raise bad_request(
            f"{name}={text!r} is not a time; send RFC 3339 with an offset "
            "(e.g. 2024-05-01T00:00:00Z) or integer epoch milliseconds"
        )
    return value


@router.get("")
def list_metrics(settings: SettingsDep) -> dict[str, Any]:
    return {
        "metrics": [
            {
                "name": m.name,
                "source": m.source,
                "key": list(m.key),
                "value": m.value,
                "aggregations": list(m.output_names),
                "windows": [format_duration(w) for w in m.windows],
                "grace": format_duration(m.grace) if m.grace else "0s",
                "version": settings.metric_version(m),
            }
            for m in settings.metrics
        ]
    }


@router.get("/{metric_name}/series")
def series(
    metric_name: str,
    request: Request,
    settings: SettingsDep,
    db: DbDep,
    redis_client: RedisDep,
    window: str = Query(..., description="one of the metric's windows, e.g. 1h"),
    start: str = Query(..., description="RFC 3339 or epoch ms; windows starting at or after"),
    end: str = Query(..., description="RFC 3339 or epoch ms; windows starting before"),
) -> dict[str, Any]:
    metric = _metric(settings, metric_name)
    window_ms = _window(metric, window)
    start_ms, end_ms = _time("start", start), _time("end", end)
    if start_ms >= end_ms:
        raise bad_request("start must be before end")
    key = []
    for dim in metric.key:
        value = request.query_params.get(dim)
        if value is None:
            raise bad_request(
                f"missing key dimension {dim!r}; {metric.name} needs "
                + ", ".join(f"{d}=<value>" for d in metric.key)
            )
        key.append(value)
    starts = window_starts(start_ms, end_ms, window_ms)
    cells = len(starts) * max(1, window_ms // metric.base_window)
    if cells > settings.serving.max_cells:
        raise bad_request(
            f"the query spans {cells} cells, more than the limit of {settings.serving.max_cells}; "
            "narrow [start, end) or use a larger window"
        )
    result = read_series(settings, db, redis_client, metric, window_ms, list(starts), tuple(key))
    return {
        "metric": metric.name,
        "window": format_duration(window_ms),
        "key": dict(zip(metric.key, key, strict=True)),
        "batch_watermark": None
        if result.watermark_ms is None
        else format_time(result.watermark_ms),
        "speed_status": result.speed_status,
        "points": result.points,
    }
