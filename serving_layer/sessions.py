"""A session metric's answers (rule 13 in docs/semantics.md), without I/O.

A session metric is stored as three plans bucketed alike by each session's first event: the
metric's own cells (its aggregations over the sessions' events) and its parts `<m>(sessions)`
(count, sum, max and quantiles of the sessions' durations in ms) and `<m>(bounces)` (count).
A series of sessions reads the three through the one read pipeline (`merged_view`) and joins
their points window by window, by their values (`join_points`): `sessions`, `bounces`,
`duration_*_s`, then the metric's aggregations. `top` ranks by a session output through the
part that holds it (`SESSION_RANKINGS`). One key's sessions are its window-0 cells before W
and, from W on, its session index in the speed view (`speed_sessions`)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

from serving_layer.read_plan import Point
from serving_layer.timefmt import format_time
from shared.aggregations import CellState, RenderOptions
from shared.metric_plan import MetricPlan
from shared.speed_view.held import KeyIndex, SessionPlans

SESSION_RANKINGS: Mapping[str, tuple[str, str]] = {
    "sessions": ("sessions", "count"),
    "bounces": ("bounces", "count"),
    "duration_sum_s": ("sessions", "sum"),
    "duration_max_s": ("sessions", "max"),
}
"""`top?by=` of a session output -> (the part holding it, the part's output it ranks by)."""

_MS_PER_S = 1000.0
_NOT_QUANTILES = ("count", "sum", "max")


def session_outputs(plans: SessionPlans, options: RenderOptions) -> list[str]:
    """What a session point carries besides start/end/source, in order."""
    quantiles = [f"duration_{name}_s" for name in _duration_quantiles(plans, options)]
    return [
        "sessions",
        "bounces",
        "duration_avg_s",
        "duration_sum_s",
        "duration_max_s",
        *quantiles,
        *plans.metric.aggregations.output_names(options),
    ]


def _duration_quantiles(plans: SessionPlans, options: RenderOptions) -> list[str]:
    """The `sessions` part's quantile outputs (`p50`, ...) under `options`."""
    plain = {"count", "sum", "max"}
    return [n for n in plans.sessions.aggregations.output_names(options) if n not in plain]


def session_values(
    events: Mapping[str, Any], sessions: Mapping[str, Any] | None, bounces: Mapping[str, Any] | None
) -> dict[str, Any]:
    """One window's session outputs from the rendered values of the three plans' points (no
    `sessions` point: no session starts there)."""
    count = 0 if sessions is None else int(sessions["count"])
    values: dict[str, Any] = {
        "sessions": count,
        "bounces": 0 if bounces is None else int(bounces["count"]),
    }
    if sessions is not None and count:
        total = float(sessions["sum"])
        values["duration_avg_s"] = total / count / _MS_PER_S
        values["duration_sum_s"] = total / _MS_PER_S
        values["duration_max_s"] = float(sessions["max"]) / _MS_PER_S
        for name, value in sessions.items():
            if name not in _NOT_QUANTILES:
                values[f"duration_{name}_s"] = None if value is None else value / _MS_PER_S
    values.update(events)
    return values


def join_points(
    events: Sequence[Point], sessions: Sequence[Point], bounces: Sequence[Point]
) -> list[Point]:
    """One group's session points: the metric's points (windows with a session starting in
    them), each joined with the parts' points of the same window, by their values."""
    by_start = [{point.window: point.values for point in part} for part in (sessions, bounces)]
    return [
        Point.of(
            point.window,
            point.source,
            session_values(
                point.values, by_start[0].get(point.window), by_start[1].get(point.window)
            ),
        )
        for point in events
    ]


def ranked_value(by: str, value: Any) -> Any:
    """A ranked part's value as the session output `by` shows it (durations in seconds)."""
    if value is None or not by.startswith("duration_"):
        return value
    return value / _MS_PER_S


class SessionRow(NamedTuple):
    """One of a key's sessions as the API lists it."""

    start_ms: int
    last_ms: int
    state: CellState
    source: str
    """`batch` (a window-0 cell before W) or `speed` (the speed view's index from W on)."""

    def render(
        self, metric: MetricPlan, key: Mapping[str, str], options: RenderOptions
    ) -> dict[str, Any]:
        values = metric.aggregations.render(self.state, options) or {}
        return {
            "key": key,
            "start": format_time(self.start_ms),
            "end": format_time(self.last_ms),
            "source": self.source,
            "events": self.state.count,
            "duration_s": (self.last_ms - self.start_ms) / _MS_PER_S,
            **values,
        }


def speed_sessions(
    indexes: Sequence[bytes], watermark: int | None, window: tuple[int, int]
) -> list[SessionRow]:
    """One key's sessions in the speed view starting in `window`, at or after W (before it
    the batch view serves them): its session index on each partition holding one."""
    floor = window[0] if watermark is None else max(window[0], watermark)
    rows = [
        SessionRow(held.first, held.last, held.state, "speed")
        for data in indexes
        for held in KeyIndex.decode(data).sessions
        if floor <= held.first < window[1]
    ]
    return sorted(rows, key=lambda row: row.start_ms)
