"""Pure properties of the serving merge: cutting a series at W agrees with each point's
`source` and with `plan_window`, and merging cells as they are stored (batch rows and speed
blobs) renders the aggregate over the union of their events."""

from __future__ import annotations

import bisect
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from serving_layer.merged_view import render_merge
from serving_layer.read_plan import split_starts
from shared.aggregations import DEFAULT_RENDER, decode_state, encode_state, fold_inputs
from shared.config import MetricConfig, SourceConfig
from shared.db.cells import BatchCell
from shared.metric_plan import compile_plan
from shared.windows import plan_window, point_source, window_starts

MINUTE = 60_000
METRIC = compile_plan(
    MetricConfig(
        name="m",
        source="s",
        key=("k",),
        value="v",
        aggregations=("count", "sum", "min", "max", "avg", "distinct(u)", "quantiles(v)"),
        windows=(MINUTE, 60 * MINUTE),
    ),
    SourceConfig(name="s", topic="s", time_field="ts"),
)


@given(
    st.integers(-2_000, 2_000),
    st.integers(0, 300),
    st.sampled_from([MINUTE, 60 * MINUTE]),
    st.one_of(st.none(), st.integers(-3_000, 3_000)),
)
def test_split_at_w_matches_each_points_source_and_plan(
    first_minute: int, minutes: int, window_ms: int, w_minutes: int | None
) -> None:
    starts = window_starts(first_minute * MINUTE, (first_minute + minutes) * MINUTE, window_ms)
    watermark = None if w_minutes is None else w_minutes * MINUTE
    batch, mixed, speed = split_starts(starts, window_ms, watermark)
    assert [*batch, *mixed, *speed] == list(starts)
    assert len(mixed) <= 1
    for part, source in ((batch, "batch"), (mixed, "mixed"), (speed, "speed")):
        for start in part:
            assert point_source(start, start + window_ms, watermark) == source
            plan = plan_window(start, window_ms, MINUTE, watermark, METRIC.windows_ms)
            assert bool(plan.batch_cells) == (source != "speed")
            assert bool(plan.speed_cells) == (source != "batch")


events = st.lists(
    st.tuples(st.floats(-1e6, 1e6, allow_nan=False), st.integers(0, 200).map(str)),
    min_size=0,
    max_size=30,
)


@settings(max_examples=60)
@given(st.lists(events, min_size=1, max_size=6), st.integers(0, 5))
def test_rendered_merge_of_stored_forms_equals_the_union_of_events(
    groups: list[list[tuple[float, str]]], cut: int
) -> None:
    """Some parts come as batch rows (plain columns, sketch bytes and summaries), the rest as
    speed blobs; their rendered merge is the aggregate over all their events."""
    states = [
        fold_inputs(
            METRIC.kinds,
            None,
            [v for v, _ in group],
            [[u for _, u in group], [v for v, _ in group]],
            len(group),
        )
        for group in groups
    ]
    row = BatchCell("m", METRIC.version, MINUTE, 0, ["k"], 0, 0.0, None, None, [], [])
    parts = [row.with_state(s, METRIC.kinds).state() for s in states[:cut]]
    parts += [decode_state(encode_state(s)) for s in states[cut:]]
    got = render_merge(METRIC, parts, DEFAULT_RENDER)
    values = sorted(v for group in groups for v, _ in group)
    if not values:
        assert got is None
        return
    assert got is not None
    assert got["count"] == len(values)
    assert got["sum"] == pytest.approx(math.fsum(values), rel=1e-9, abs=1e-6)
    assert (got["min"], got["max"]) == (values[0], values[-1])
    assert got["avg"] == pytest.approx(math.fsum(values) / len(values), rel=1e-9, abs=1e-6)
    users = {u for group in groups for _, u in group}
    assert got["distinct_u"] == len(users)  # HLL is exact this small
    assert values[0] <= got["p50"] <= values[-1]
    rank = bisect.bisect_right(values, got["p50"]) / len(values)
    assert rank >= 0.5  # at most 180 values: KLL keeps them all, so the quantile is exact
    assert bisect.bisect_left(values, got["p50"]) / len(values) <= 0.5
