"""The read plans of the serving layer (`serving_layer/read_plan.py`), pure: which windows a
plan merges from which store at a given W, which batch cells its one statement fetches and
which speed base cells its one Redis round trip reads, what cached points it reuses, and that
planning again at another W makes a new plan instead of changing one."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from serving_layer.batch_view import CellRuns, runs_of
from serving_layer.read_plan import (
    KeySeriesPlan,
    Point,
    SlicedPlan,
    TopPlan,
    WindowPoints,
    keys_speed_starts,
)
from serving_layer.selection import Selection
from serving_layer.served_row import ServedRow
from shared.config import MetricConfig, SourceConfig
from shared.metric_plan import compile_plan
from shared.windows import CellRef

MINUTE = 60_000
HOUR = 60 * MINUTE
METRIC = compile_plan(
    MetricConfig(
        name="m",
        source="s",
        key=("country", "page"),
        value="v",
        aggregations=("count", "distinct(u)"),
        windows=(MINUTE, HOUR),
    ),
    SourceConfig(name="s", topic="s", time_field="ts"),
)
W = 2 * HOUR + 30 * MINUTE
SERVED = ServedRow("100", 7, W)
POINT: WindowPoints = {(): Point.of((0, HOUR), "batch", {"count": 1})}


def test_a_key_series_merges_uncached_batch_windows_and_the_one_straddling_w() -> None:
    starts = range(0, 4 * HOUR, HOUR)
    known = {0: POINT}
    plan = KeySeriesPlan.of(METRIC, ("de", "a"), HOUR, starts, SERVED, known)
    assert (list(plan.batch), list(plan.mixed), list(plan.speed)) == (
        [0, HOUR],
        [2 * HOUR],
        [3 * HOUR],
    )
    assert list(plan.composed) == [HOUR, 2 * HOUR]
    query = plan.cell_query
    assert list(query.refs) == [CellRef(HOUR, HOUR)] + [
        CellRef(MINUTE, start) for start in range(2 * HOUR, W, MINUTE)
    ]
    # the lone hour cell renders its stored distinct summary; the composed window unions sketches
    # asked as two runs: the 30 minutes up to W with their sketches, the hour cell without
    assert [query.params[field] for field in CellRuns._fields] == [
        [MINUTE, HOUR],
        [2 * HOUR, HOUR],
        [W, 2 * HOUR],
        [True, False],
    ]
    assert query.params["key"] == ["de", "a"]
    speed = plan.speed_read
    assert speed.key == ("de", "a")
    assert list(speed.starts) == list(range(W, 4 * HOUR, MINUTE))
    assert plan.mixed_speed_cells == list(range(W, 3 * HOUR, MINUTE))


def test_planning_again_at_a_later_w_makes_a_new_plan() -> None:
    starts = range(0, 4 * HOUR, HOUR)
    first = KeySeriesPlan.of(METRIC, (), HOUR, starts, SERVED, {})
    later = KeySeriesPlan.of(METRIC, (), HOUR, starts, ServedRow("101", 8, 4 * HOUR), {})
    assert list(first.mixed) == [2 * HOUR] and not later.mixed and not later.speed
    assert list(later.composed) == [0, HOUR, 2 * HOUR, 3 * HOUR]
    assert first.served == SERVED and list(first.composed) == [0, HOUR, 2 * HOUR]


def test_nothing_served_reads_every_window_from_the_speed_view() -> None:
    plan = KeySeriesPlan.of(
        METRIC, (), HOUR, range(0, 2 * HOUR, HOUR), ServedRow(None, None, None), {}
    )
    assert not plan.batch and not plan.composed and not plan.cell_query.refs
    assert list(plan.speed_read.starts) == list(range(0, 2 * HOUR, MINUTE))
    assert list(plan.speed) == [0, HOUR] and not plan.mixed_speed_cells


def test_speed_windows_of_the_base_size_are_each_one_base_cell() -> None:
    plan = KeySeriesPlan.of(METRIC, (), MINUTE, range(W, W + 3 * MINUTE, MINUTE), SERVED, {})
    assert list(plan.speed) == [W, W + MINUTE, W + 2 * MINUTE]
    assert plan.speed_read.starts == (W, W + MINUTE, W + 2 * MINUTE)
    assert not plan.composed and not plan.mixed_speed_cells


def test_a_sliced_plan_fetches_each_uncached_cell_once_and_defers_to_a_read_in_flight() -> None:
    windows = [(0, HOUR), (30 * MINUTE, 90 * MINUTE), (2 * HOUR, 3 * HOUR)]
    selection = Selection(METRIC.key, (("country", frozenset({"de"})),), ("page",))
    plan = SlicedPlan.of(METRIC, windows, selection, SERVED, {}, 1000)
    refs = list(plan.cell_query.refs)
    assert refs == sorted(set(refs)) and CellRef(HOUR, 0) in refs
    assert plan.cell_query.params["limit"] == 1001 and plan.cell_query.max_cells == 1000
    assert plan.misses_batch_points
    assert list(plan.speed_read.starts) == list(range(W, 3 * HOUR, MINUTE))
    deferred = plan.deferring()
    assert not deferred.cell_query.refs and not plan.deferred
    cached = SlicedPlan.of(
        METRIC, windows, selection, SERVED, {w: POINT for w in windows[:2]}, 1000
    )
    assert not cached.misses_batch_points
    # only the window straddling W: its batch part, 2:00 to W, in minutes
    assert list(cached.cell_query.refs) == [CellRef(MINUTE, s) for s in range(2 * HOUR, W, MINUTE)]


def test_a_top_plan_reuses_a_cached_ranking_only_for_a_batch_only_window() -> None:
    ranking = METRIC.aggregations.ranking("distinct_u")
    assert ranking is not None
    selection = Selection(METRIC.key, (), ("country",))
    cached = ([(("de",), 3)], 2)
    done = TopPlan.of(METRIC, ranking, selection, HOUR, HOUR, SERVED, cached, 1000)
    assert done.known == cached and not done.cell_query.refs and not done.speed_read.starts
    live = TopPlan.of(METRIC, ranking, selection, 2 * HOUR, HOUR, SERVED, cached, 1000)
    assert live.known is None and live.speed_read.starts
    assert live.cell_query.params["sketch"] == ranking.slot + 1
    assert live.cell_query.params["union"]  # merged over pages: the sketches are unioned


def test_keys_read_the_speed_cells_after_w() -> None:
    assert keys_speed_starts(METRIC, 0, 3 * HOUR, W) == range(W, 3 * HOUR, MINUTE)
    assert keys_speed_starts(METRIC, 1, 2 * MINUTE, None) == range(MINUTE, 2 * MINUTE, MINUTE)


def test_an_unreachable_batch_view_plans_the_windows_from_w_on_and_reads_no_cell() -> None:
    """Rule 12: planned from the row last read, marked unreachable."""
    last = SERVED._replace(reachable=False)
    starts = range(0, 4 * HOUR, HOUR)
    plan = KeySeriesPlan.of(METRIC, (), HOUR, starts, last, {0: POINT})
    assert not plan.batch and not plan.mixed and not plan.composed
    assert list(plan.speed) == [3 * HOUR]  # the hour straddling W (2h30) is omitted
    assert not plan.cell_query.refs
    assert plan.speed_read.starts == tuple(range(3 * HOUR, 4 * HOUR, MINUTE))
    windows = [(0, HOUR), (2 * HOUR, 3 * HOUR), (W, W + HOUR), (3 * HOUR, 4 * HOUR)]
    sliced = SlicedPlan.of(METRIC, windows, Selection(METRIC.key), last, {}, 1000)
    assert list(sliced.windows) == [(W, W + HOUR), (3 * HOUR, 4 * HOUR)]
    assert not sliced.cell_query.refs and not sliced.misses_batch_points


@given(
    st.lists(
        st.tuples(st.sampled_from([MINUTE, HOUR]), st.integers(-50, 50), st.booleans()),
        max_size=60,
    )
)
def test_runs_hold_exactly_the_cells_asked_each_with_its_need_and_are_the_fewest(
    asked: list[tuple[int, int, bool]],
) -> None:
    needs = {CellRef(size, size * i): need for size, i, need in asked}
    runs = list(zip(*runs_of(needs), strict=True))
    held = [
        (CellRef(size, start), need)
        for size, first, end, need in runs
        for start in range(first, end, size)
    ]
    assert sorted(held) == sorted(needs.items())  # each cell in one run, with its need
    ends = {(size, end, need) for size, _, end, need in runs}
    # two neighbouring runs of one window and need would have been one
    assert not any((size, first, need) in ends for size, first, _, need in runs)
