"""The batch view's time ranges ("Time partitions" in docs/architecture.md): whichever cells
and ranges a generation already has, the ranges added give every cell exactly one range, never
overlap, and stay few however the cells' times are spread; plans are grouped by retention so
that each group splits the windows it retains."""

from __future__ import annotations

import itertools
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from shared.config import Settings
from shared.db.cell_tables import (
    DAY_MS,
    NEW_RANGES_PER_WINDOW,
    REST,
    RetentionGroup,
    TimeRange,
    range_span_ms,
    ranges_to_add,
    retention_groups,
    split_windows,
)
from shared.metric_plan import SESSION_WINDOW_MS, MetricPlan

MINUTE = 60_000
YEAR_1 = -62_135_596_800_000
YEAR_9999 = 253_402_300_740_000


def test_spans_follow_the_window() -> None:
    assert range_span_ms(MINUTE) == 7 * DAY_MS
    assert range_span_ms(5 * MINUTE) == 35 * DAY_MS
    assert range_span_ms(1_000) == DAY_MS
    assert range_span_ms(3_600_000) == 364 * DAY_MS
    assert range_span_ms(86_400_000) == 364 * DAY_MS
    assert range_span_ms(SESSION_WINDOW_MS) == 7 * DAY_MS


def test_a_new_generation_gets_aligned_ranges_of_its_span() -> None:
    starts = [0, MINUTE, 8 * DAY_MS, 8 * DAY_MS + 5 * MINUTE]
    assert ranges_to_add(MINUTE, [], starts) == [
        TimeRange(MINUTE, 0, 7 * DAY_MS),
        TimeRange(MINUTE, 7 * DAY_MS, 14 * DAY_MS),
    ]


def test_a_late_cell_fills_the_gap_it_lies_in_and_a_new_week_gets_its_range() -> None:
    existing = [
        TimeRange(MINUTE, 7 * DAY_MS, 14 * DAY_MS),
        TimeRange(MINUTE, 28 * DAY_MS, 35 * DAY_MS),
    ]
    added = ranges_to_add(MINUTE, existing, [DAY_MS, 20 * DAY_MS, 36 * DAY_MS, 13 * DAY_MS])
    assert added == [
        TimeRange(MINUTE, None, 7 * DAY_MS),
        TimeRange(MINUTE, 14 * DAY_MS, 28 * DAY_MS),
        TimeRange(MINUTE, 35 * DAY_MS, 42 * DAY_MS),
    ]


def test_times_spread_from_year_1_to_9999_add_few_ranges() -> None:
    starts = [YEAR_1 + i * 97 * DAY_MS for i in range(3_000)] + [0, YEAR_9999 - MINUTE]
    added = ranges_to_add(MINUTE, [], starts)
    assert len(added) <= 2 * NEW_RANGES_PER_WINDOW + 1
    assert all(sum(r.holds(s) for r in added) == 1 for s in starts)


bounds = st.integers(min_value=YEAR_1 // MINUTE, max_value=YEAR_9999 // MINUTE)


@st.composite
def existing_ranges(draw: st.DrawFn) -> list[TimeRange]:
    """Non-overlapping ranges, the first and last possibly unbounded."""
    cuts = sorted(set(draw(st.lists(bounds, max_size=12))))
    pairs = list(zip(cuts[::2], cuts[1::2], strict=False))
    ranges = [TimeRange(MINUTE, lo * MINUTE, hi * MINUTE) for lo, hi in pairs]
    if ranges and draw(st.booleans()):
        ranges[0] = TimeRange(MINUTE, None, ranges[0].hi)
    if ranges and draw(st.booleans()):
        ranges[-1] = TimeRange(MINUTE, ranges[-1].lo, None)
    return ranges


@settings(max_examples=300, deadline=None)
@given(
    existing_ranges(),
    st.lists(st.one_of(bounds, st.integers(0, 30 * 1440)), max_size=60),
)
def test_every_cell_has_exactly_one_range(existing: list[TimeRange], minutes: list[int]) -> None:
    starts = [m * MINUTE for m in minutes]
    added = ranges_to_add(MINUTE, existing, starts)
    every = [*existing, *added]
    assert all(sum(r.holds(s) for r in every) == 1 for s in starts)
    edges = sorted(every, key=lambda r: -float("inf") if r.lo is None else r.lo)
    for lower, upper in itertools.pairwise(edges):
        assert lower.hi is not None and upper.lo is not None and lower.hi <= upper.lo
    assert len(added) <= NEW_RANGES_PER_WINDOW + len(existing) + 1
    span = range_span_ms(MINUTE)
    aligned = [r for r in added if r.lo is not None and r.hi is not None and r.hi - r.lo == span]
    assert all(any(r.holds(s) for s in starts) for r in aligned)


def _plans(metrics: list[dict[str, Any]]) -> list[MetricPlan]:
    source = {"name": "pv", "topic": "pv", "time_field": "ts", "partitions": 1}
    return list(Settings(sources=[source], tables=[], metrics=metrics).plans.values())


VIEWS = {
    "name": "views",
    "source": "pv",
    "key": ["page"],
    "windows": ["1m", "1h", "1d"],
    "retention": {"1m": "7d", "1h": "90d"},
    "rollups": [[]],
}
TOTALS = {"name": "totals", "source": "pv", "key": [], "windows": ["1h"]}
VISITS = {
    "name": "visits",
    "source": "pv",
    "key": ["user"],
    "session": {"gap": "30m", "max_duration": "4h"},
    "windows": ["1m", "1h"],
    "retention": {"1m": "2d", "1h": "30d"},
}
HOUR = 3_600_000


def test_only_windows_every_metric_retains_are_split() -> None:
    # views' rollup keeps views' retention; totals keeps its 1h cells forever; visits'
    # sessions (window 0) go with its 1m cells
    assert split_windows(_plans([VIEWS, TOTALS, VISITS])) == {
        MINUTE: 7 * DAY_MS,
        SESSION_WINDOW_MS: 2 * DAY_MS,
    }
    assert split_windows(_plans([VIEWS])) == {MINUTE: 7 * DAY_MS, HOUR: 90 * DAY_MS}


def test_plans_are_grouped_by_retention_and_each_group_splits_what_it_retains() -> None:
    clicks = {**VIEWS, "name": "clicks", "rollups": []}
    groups = retention_groups(_plans([VIEWS, TOTALS, VISITS, clicks]))
    assert [(g.name, sorted(g.plans)) for g in groups] == [
        (
            "r0",
            [
                "visits",
                "visits(bounces)",
                "visits(bounces)[]",
                "visits(sessions)",
                "visits(sessions)[]",
                "visits[]",
            ],
        ),
        ("r1", ["clicks", "views", "views[]"]),
        (REST, []),  # the plans keeping every window forever, and any metric no group lists
    ]
    assert groups[0].split == {MINUTE: 2 * DAY_MS, SESSION_WINDOW_MS: 2 * DAY_MS, HOUR: 30 * DAY_MS}
    assert groups[1].split == {MINUTE: 7 * DAY_MS, HOUR: 90 * DAY_MS}
    assert groups[2] == RetentionGroup(REST, frozenset(), {})
