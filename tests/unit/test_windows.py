"""Tumbling windows and the merge rule's composition (rules 1 and 8 in docs/semantics.md)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shared.windows import CellRef, plan_window, point_source, window_start, window_starts

MIN = 60_000
HOUR = 3_600_000
DAY = 86_400_000


# --------------------------------------------------------------------------- window_start


@pytest.mark.parametrize(
    ("time_ms", "size", "expected"),
    [
        (0, MIN, 0),
        (1, MIN, 0),
        (MIN - 1, MIN, 0),
        (MIN, MIN, MIN),
        (-1, MIN, -MIN),
        (-MIN, MIN, -MIN),
        (-MIN - 1, MIN, -2 * MIN),
        (1_704_067_259_999, MIN, 1_704_067_200_000),
        (1_704_153_599_999, DAY, 1_704_067_200_000),
    ],
)
def test_window_start(time_ms: int, size: int, expected: int) -> None:
    assert window_start(time_ms, size) == expected


@settings(max_examples=200, deadline=None)
@given(time_ms=st.integers(-(10**15), 10**15), size=st.integers(1, 10**9))
def test_window_start_contains_the_time(time_ms: int, size: int) -> None:
    start = window_start(time_ms, size)
    assert start % size == 0
    assert start <= time_ms < start + size


# --------------------------------------------------------------------------- window_starts


def test_window_starts_examples() -> None:
    assert list(window_starts(0, 3 * MIN, MIN)) == [0, MIN, 2 * MIN]
    assert list(window_starts(1, 3 * MIN, MIN)) == [MIN, 2 * MIN]
    assert list(window_starts(0, 3 * MIN + 1, MIN)) == [0, MIN, 2 * MIN, 3 * MIN]
    assert list(window_starts(-MIN - 1, 1, MIN)) == [-MIN, 0]
    assert list(window_starts(5, 5, MIN)) == []
    assert list(window_starts(MIN, 0, MIN)) == []
    assert list(window_starts(1, MIN, MIN)) == []


@settings(max_examples=200, deadline=None)
@given(
    size=st.integers(1, 12),
    start=st.integers(-60, 60),
    length=st.integers(-10, 60),
)
def test_window_starts_are_the_aligned_starts_in_range(size: int, start: int, length: int) -> None:
    end = start + length
    expected = [t for t in range(start - 20, end + 20) if t % size == 0 and start <= t < end]
    assert list(window_starts(start, end, size)) == expected


# --------------------------------------------------------------------------- plan_window


def test_plan_window_all_batch_uses_the_coarsest_cell() -> None:
    plan = plan_window(0, DAY, MIN, DAY, [HOUR, DAY])
    assert plan.batch_cells == (CellRef(DAY, 0),)
    assert plan.speed_cells == ()


def test_plan_window_split_inside_the_window() -> None:
    w = 5 * HOUR + 30 * MIN
    plan = plan_window(0, DAY, MIN, w, [HOUR, DAY])
    assert plan.batch_cells == tuple(CellRef(HOUR, h * HOUR) for h in range(5)) + tuple(
        CellRef(MIN, 5 * HOUR + m * MIN) for m in range(30)
    )
    assert plan.speed_cells == tuple(range(w, DAY, MIN))
    assert len(plan.speed_cells) == 24 * 60 - 330


def test_plan_window_without_watermark_is_all_speed() -> None:
    plan = plan_window(HOUR, HOUR, MIN, None, [HOUR])
    assert plan.batch_cells == ()
    assert plan.speed_cells == tuple(range(HOUR, 2 * HOUR, MIN))


def test_plan_window_before_the_watermark_start_is_all_speed() -> None:
    plan = plan_window(2 * HOUR, HOUR, MIN, HOUR, [HOUR])
    assert plan.batch_cells == ()
    assert len(plan.speed_cells) == 60


def test_plan_window_base_window_itself() -> None:
    assert plan_window(MIN, MIN, MIN, 2 * MIN, []).batch_cells == (CellRef(MIN, MIN),)
    assert plan_window(MIN, MIN, MIN, MIN, []).speed_cells == (MIN,)


@st.composite
def plans(draw: st.DrawFn) -> tuple[int, int, int, int | None, list[int]]:
    base = draw(st.sampled_from([1, 3, 5, MIN]))
    multiple = draw(st.integers(1, 48))
    size = base * multiple
    start = size * draw(st.integers(-4, 4))
    batch_sizes = [base * m for m in draw(st.lists(st.integers(1, 60), max_size=5))]
    where = draw(st.sampled_from(["none", "before", "inside", "after"]))
    if where == "none":
        watermark = None
    elif where == "before":
        watermark = start - base * draw(st.integers(0, 100))
    elif where == "inside":
        watermark = start + base * draw(st.integers(0, multiple))
    else:
        watermark = start + size + base * draw(st.integers(0, 100))
    return start, size, base, watermark, batch_sizes


@settings(max_examples=200, deadline=None)
@given(plans())
def test_plan_window_properties(case: tuple[int, int, int, int | None, list[int]]) -> None:
    start, size, base, watermark, batch_sizes = case
    end = start + size
    plan = plan_window(start, size, base, watermark, batch_sizes)
    stored = {*batch_sizes, base}
    batch_end = start if watermark is None else min(end, max(start, watermark))

    position = start
    for cell in plan.batch_cells:
        assert cell.start_ms == position, "batch cells are contiguous from the window start"
        assert cell.size_ms in stored
        assert cell.start_ms % cell.size_ms == 0, "batch cells are aligned"
        assert watermark is not None
        assert cell.start_ms + cell.size_ms <= watermark, "a batch cell ends at or before W"
        coarser = [
            s
            for s in stored
            if s > cell.size_ms and position % s == 0 and position + s <= batch_end
        ]
        assert coarser == [], "the coarsest stored cell that fits is used"
        position += cell.size_ms
    assert position == batch_end, "batch cells cover [start, min(end, max(start, W)))"

    speed_from = start if watermark is None else max(start, watermark)
    assert list(plan.speed_cells) == list(range(speed_from, end, base))
    covered = sum(c.size_ms for c in plan.batch_cells) + base * len(plan.speed_cells)
    assert covered == size, "together the cells cover the window exactly once"


@settings(max_examples=100, deadline=None)
@given(
    hours_before_w=st.integers(0, 24),
    minutes=st.integers(0, 59),
)
def test_plan_window_with_nested_sizes_uses_the_fewest_cells(
    hours_before_w: int, minutes: int
) -> None:
    w = hours_before_w * HOUR + (minutes if hours_before_w < 24 else 0) * MIN
    plan = plan_window(0, DAY, MIN, w, [HOUR, DAY])
    if w == DAY:
        assert len(plan.batch_cells) == 1
    else:
        assert len(plan.batch_cells) == hours_before_w + minutes


# --------------------------------------------------------------------------- point_source


@pytest.mark.parametrize(
    ("start", "end", "watermark", "expected"),
    [
        (0, MIN, MIN, "batch"),
        (0, MIN, 2 * MIN, "batch"),
        (0, MIN, MIN - 1, "mixed"),
        (0, MIN, 1, "mixed"),
        (0, MIN, 0, "speed"),
        (0, MIN, -MIN, "speed"),
        (0, MIN, None, "speed"),
        (0, HOUR, 30 * MIN, "mixed"),
    ],
)
def test_point_source(start: int, end: int, watermark: int | None, expected: str) -> None:
    assert point_source(start, end, watermark) == expected


@settings(max_examples=200, deadline=None)
@given(
    start=st.integers(-1000, 1000),
    length=st.integers(1, 500),
    watermark=st.none() | st.integers(-2000, 2000),
)
def test_point_source_by_position(start: int, length: int, watermark: int | None) -> None:
    end = start + length
    source = point_source(start, end, watermark)
    if watermark is None or start >= watermark:
        assert source == "speed"
    elif end <= watermark:
        assert source == "batch"
    else:
        assert source == "mixed"
