"""A metric's window kind (`shared.window_kind.TumblingWindows`): the cell arithmetic every layer
asks it for agrees with the rules it binds (rules 1, 2, 5 and 8 in docs/semantics.md), checked
against a brute force over the windows' own definitions."""

from __future__ import annotations

from itertools import pairwise

import pytest
from hypothesis import given
from hypothesis import strategies as st

from shared.lateness import is_late
from shared.window_kind import TumblingWindows

MIN = 60_000
HOUR = 3_600_000
DAY = 86_400_000

SIZES = st.sampled_from([(MIN,), (MIN, HOUR), (MIN, 5 * MIN, HOUR, DAY), (HOUR, DAY), (90_000,)])
TIMES = st.integers(-(10**13), 10**13)


@given(SIZES, TIMES)
def test_an_event_falls_in_the_one_base_cell_holding_its_time(
    sizes: tuple[int, ...], t: int
) -> None:
    windows = TumblingWindows(sizes)
    start = windows.cell_start(t)
    assert start <= t < windows.cell_end(start)
    assert start % sizes[0] == 0


@given(SIZES, TIMES, st.integers(0, 3 * DAY))
def test_cell_starts_are_the_base_cells_starting_in_the_range(
    sizes: tuple[int, ...], start: int, length: int
) -> None:
    windows = TumblingWindows(sizes)
    starts = list(windows.cell_starts(start, start + length))
    base = sizes[0]
    assert all(start <= s < start + length and s % base == 0 for s in starts)
    assert all(b - a == base for a, b in pairwise(starts))
    first = starts[0] if starts else start + length
    assert first - base < start  # none missed before the first
    assert not starts or starts[-1] + base >= start + length  # nor after the last


@given(
    SIZES,
    TIMES,
    st.integers(0, DAY),
    st.one_of(st.none(), TIMES),
    st.one_of(st.none(), TIMES),
)
def test_the_latest_late_start_is_the_bound_of_the_lateness_rule(
    sizes: tuple[int, ...],
    t: int,
    grace: int,
    stream_time: int | None,
    watermark: int | None,
) -> None:
    windows = TumblingWindows(sizes)
    start = windows.cell_start(t)
    late = start <= windows.latest_late_start(grace, stream_time, watermark)
    assert late == is_late(windows.cell_end(start), grace, stream_time, watermark)


@given(SIZES, st.lists(TIMES, max_size=4), st.integers(0, DAY), st.one_of(st.none(), TIMES))
def test_w_is_the_newest_stream_time_less_grace_on_a_cell_boundary_and_never_moves_back(
    sizes: tuple[int, ...], stream_times: list[int], grace: int, previous: int | None
) -> None:
    windows = TumblingWindows(sizes)
    watermark = windows.watermark(previous, stream_times, grace)
    if not stream_times:
        assert watermark == previous
        return
    assert watermark is not None
    candidate = windows.cell_start(max(stream_times) - grace)
    assert watermark == (candidate if previous is None else max(previous, candidate))


@given(SIZES, TIMES, st.integers(1, 30), st.one_of(st.none(), TIMES))
def test_a_window_is_composed_of_cells_that_tile_it_batch_cells_before_w(
    sizes: tuple[int, ...], t: int, cells: int, watermark: int | None
) -> None:
    windows = TumblingWindows(sizes)
    start, size = windows.cell_start(t), cells * sizes[0]
    if watermark is not None:  # W lies on a base cell boundary (rule 5)
        watermark = windows.cell_start(watermark)
    plan = windows.compose(start, size, watermark)
    covered = [(ref.start_ms, ref.start_ms + ref.size_ms) for ref in plan.batch_cells]
    covered += [(s, windows.cell_end(s)) for s in plan.speed_cells]
    assert sorted(covered) == covered
    assert [a for a, _ in covered] == [start, *(b for _, b in covered[:-1])]
    assert covered[-1][1] == start + size
    for ref in plan.batch_cells:
        assert ref.size_ms in sizes and ref.start_ms % ref.size_ms == 0
        assert watermark is not None and ref.start_ms + ref.size_ms <= watermark


@given(SIZES, TIMES)
def test_floor_aligned_starts_a_window_of_every_size(sizes: tuple[int, ...], t: int) -> None:
    floored = TumblingWindows(sizes).floor_aligned(t)
    assert floored <= t
    assert all(floored % size == 0 for size in sizes)


@pytest.mark.parametrize("sizes", [(), (MIN, 90_000)])
def test_windows_that_are_not_multiples_of_the_smallest_are_refused(
    sizes: tuple[int, ...],
) -> None:
    with pytest.raises(ValueError, match="multiples of the smallest"):
        TumblingWindows(sizes)


RETAINED = st.sampled_from(
    [
        ((MIN, 2 * HOUR),),
        ((MIN, 2 * HOUR), (HOUR, 3 * DAY)),
        ((MIN, 90 * MIN), (5 * MIN, 6 * HOUR), (HOUR, 2 * DAY)),
    ]
)


@given(
    RETAINED,
    TIMES,
    st.integers(0, 2),
    st.integers(-3 * HOUR, 3 * HOUR),
    st.sampled_from([MIN, 5 * MIN, HOUR, DAY]),
)
def test_a_window_needs_a_removed_cell_exactly_when_one_it_merges_ended_by_w_minus_retention(
    retention: tuple[tuple[int, int], ...], watermark: int, which: int, near: int, size: int
) -> None:
    """Rule 14 by its definition: a stored cell is removed when it ended at or before W minus
    its window's retention. `kept_from` is the first start not removed; `expired_cell` names
    a cell of the window's composition (rule 8) that is removed, exactly when there is one;
    `retention_bound` is a start from which on no window needs one."""
    windows = TumblingWindows((MIN, 5 * MIN, HOUR, DAY), retention)
    watermark -= watermark % MIN  # W is on a base cell boundary (rule 5)
    kept = dict(retention)
    for cell_size, keep in retention:
        first = windows.kept_from(cell_size, watermark)
        assert first is not None and first % cell_size == 0
        assert first + cell_size > watermark - keep >= first  # the first kept ends after it
    assert windows.kept_from(DAY, watermark) is None, "a window without retention is kept"
    edge = watermark - retention[which % len(retention)][1] + near  # about where cells go
    start = edge - edge % MIN
    removed = [
        cell
        for cell in windows.compose(start, size, watermark).batch_cells
        if cell.size_ms in kept and cell.start_ms + cell.size_ms <= watermark - kept[cell.size_ms]
    ]
    found = windows.expired_cell(start, size, watermark)
    assert found == (removed[0] if removed else None)
    bound = windows.retention_bound(watermark)
    assert bound is not None
    if start >= bound:
        assert found is None
