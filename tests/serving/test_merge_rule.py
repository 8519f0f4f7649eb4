"""Pure properties of the serving merge: cutting a series at W agrees with each point's
`source` and with `plan_window`, and merging cells' plain columns and sketch bytes equals
merging the aggregate states."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from serving_layer.merged_view import Cell, merge_cells, parse_state, split_starts
from shared.aggregates import AggState, merge_all
from shared.config import MetricConfig, SourceConfig
from shared.metric_plan import compile_plan
from shared.windows import plan_window, point_source, window_starts

MINUTE = 60_000
METRIC = compile_plan(
    MetricConfig(
        name="m",
        source="s",
        key=("k",),
        value="v",
        aggregations=("count", "sum", "min", "max", "avg", "distinct(u)"),
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
def test_merge_cells_equals_merged_states(groups: list[list[tuple[float, str]]], cut: int) -> None:
    states = []
    for group in groups:
        state = AggState.empty(1)
        for value, user in group:
            state.add(value, [user])
        states.append(state)
    # Some parts come as batch rows (plain columns + sketch bytes), the rest as speed blobs.
    parts = [
        Cell(
            s.count,
            s.total,
            s.minimum,
            s.maximum,
            [s.sketches[0].serialize_compact()],
            s.distinct_estimates(),
        )
        for s in states[:cut]
    ] + [parse_state(s.to_bytes(), True) for s in states[cut:]]
    got = merge_cells(METRIC, parts)
    merged = merge_all(states)
    if merged is None or merged.count == 0:
        assert got is None
        return
    want = merged.outputs(METRIC)
    assert got is not None
    assert got["count"] == want["count"]
    for name in ("sum", "min", "max", "avg"):
        assert got[name] == pytest.approx(want[name], rel=1e-9, abs=1e-6)
    assert got["distinct_u"] == want["distinct_u"]
