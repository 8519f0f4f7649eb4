"""Lateness (rule 2) and the batch watermark W (rule 5)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shared.lateness import batch_watermark, id_bucket_closed, is_late, latest_late_start

MIN = 60_000
GRACE = 2 * MIN
T0 = 1_704_067_200_000


# --------------------------------------------------------------------------- is_late


def test_grace_boundary() -> None:
    cell_end = T0 + MIN
    assert is_late(cell_end, GRACE, cell_end + GRACE, None)
    assert not is_late(cell_end, GRACE, cell_end + GRACE - 1, None)
    assert is_late(cell_end, GRACE, cell_end + GRACE + 1, None)


def test_zero_grace() -> None:
    assert is_late(T0, 0, T0, None)
    assert not is_late(T0, 0, T0 - 1, None)


def test_no_stream_time_yet() -> None:
    assert not is_late(T0, GRACE, None, None)
    assert not is_late(T0, 0, None, T0 - 1)


@pytest.mark.parametrize(
    ("watermark", "late"),
    [(T0, True), (T0 + MIN, True), (T0 - 1, False), (T0 - MIN, False), (None, False)],
)
def test_cells_the_batch_serves_are_late(watermark: int | None, late: bool) -> None:
    assert is_late(T0, GRACE, T0 - 10 * MIN, watermark) is late


def test_either_clause_makes_an_event_late() -> None:
    assert is_late(T0, GRACE, T0 + GRACE, T0 - MIN)
    assert is_late(T0, GRACE, T0, T0)
    assert not is_late(T0, GRACE, T0 + GRACE - 1, T0 - 1)


@settings(max_examples=200, deadline=None)
@given(
    cell_end=st.integers(-(10**13), 10**13),
    grace=st.integers(0, 10**9),
    stream_time=st.none() | st.integers(-(10**13), 10**13),
    watermark=st.none() | st.integers(-(10**13), 10**13),
)
def test_is_late_is_rule_2(
    cell_end: int, grace: int, stream_time: int | None, watermark: int | None
) -> None:
    by_grace = stream_time is not None and cell_end + grace <= stream_time
    by_batch = watermark is not None and cell_end <= watermark
    assert is_late(cell_end, grace, stream_time, watermark) is (by_grace or by_batch)


# --------------------------------------------------------------------------- batch_watermark


def test_first_watermark_floors_to_the_base() -> None:
    assert batch_watermark(None, [T0 + 5 * MIN + 30_000], GRACE, MIN) == T0 + 3 * MIN
    assert batch_watermark(None, [T0 + GRACE], GRACE, MIN) == T0
    assert batch_watermark(None, [T0 + GRACE - 1], GRACE, MIN) == T0 - MIN


def test_the_newest_partition_decides() -> None:
    """An idle partition (old stream time) never holds W back."""
    assert batch_watermark(None, [T0, T0 + 60 * MIN, T0 - 500 * MIN], 0, MIN) == T0 + 60 * MIN


def test_watermark_never_moves_back() -> None:
    assert batch_watermark(T0 + 10 * MIN, [T0], GRACE, MIN) == T0 + 10 * MIN
    assert batch_watermark(T0, [T0 + 10 * MIN], GRACE, MIN) == T0 + 8 * MIN


def test_no_stream_times() -> None:
    assert batch_watermark(None, [], GRACE, MIN) is None
    assert batch_watermark(T0, [], GRACE, MIN) == T0


def test_accepts_any_iterable() -> None:
    assert batch_watermark(None, iter([T0 + MIN, T0]), 0, MIN) == T0 + MIN


def test_negative_times_floor_down() -> None:
    assert batch_watermark(None, [-1], 0, MIN) == -MIN


@settings(max_examples=200, deadline=None)
@given(
    previous=st.none() | st.integers(-1000, 1000),
    stream_times=st.lists(st.integers(-(10**6), 10**6), max_size=8),
    grace=st.integers(0, 5000),
    base=st.integers(1, 500),
)
def test_watermark_properties(
    previous: int | None, stream_times: list[int], grace: int, base: int
) -> None:
    if previous is not None:
        previous *= base
    w = batch_watermark(previous, stream_times, grace, base)
    if not stream_times:
        assert w == previous
        return
    assert w is not None
    if previous is not None:
        assert w >= previous, "monotonic"
    assert w % base == 0, "floored to the base"
    floored = (max(stream_times) - grace) // base * base
    assert floored <= max(stream_times) - grace < floored + base
    assert w == (floored if previous is None else max(previous, floored))


@settings(max_examples=200, deadline=None)
@given(
    base=st.integers(1, 100),
    grace=st.integers(0, 1000),
    previous=st.none() | st.integers(-50, 50),
    stream_times=st.lists(st.integers(-10_000, 10_000), min_size=1, max_size=6),
    cell_index=st.integers(-200, 200),
)
def test_every_late_by_grace_cell_lies_at_or_before_w(
    base: int,
    grace: int,
    previous: int | None,
    stream_times: list[int],
    cell_index: int,
) -> None:
    """Rule 5: whatever rule 2 calls late on some partition, the batch serves after its run."""
    w = batch_watermark(None if previous is None else previous * base, stream_times, grace, base)
    assert w is not None
    cell_end = cell_index * base
    for stream_time in stream_times:
        if is_late(cell_end, grace, stream_time, None):
            assert cell_end <= w
            assert is_late(cell_end, grace, None, w)


def test_an_id_bucket_stays_while_a_later_cell_it_overlaps_is_open() -> None:
    """Bucket [2m, 4m) of a source with 2m and 3m metrics: the 3m metric's cell [3m, 6m)
    holds its events at 3m..4m, so the ids stay until that cell is late too."""
    minute = 60_000
    metrics = [(2 * minute, 0, None), (3 * minute, 0, None)]
    assert not id_bucket_closed(2 * minute, 2 * minute, metrics, stream_time_ms=5 * minute)
    assert id_bucket_closed(2 * minute, 2 * minute, metrics, stream_time_ms=6 * minute)


@given(
    bucket=st.integers(0, 10**6),
    bases=st.lists(st.integers(1, 500), min_size=1, max_size=3),
    grace=st.integers(0, 300),
    stream_time=st.integers(0, 2 * 10**6),
)
@settings(max_examples=200)
def test_a_closed_id_bucket_has_no_event_that_is_not_late(
    bucket: int, bases: list[int], grace: int, stream_time: int
) -> None:
    size = min(bases)
    start = bucket - bucket % size
    metrics = [(base, grace, None) for base in bases]
    if id_bucket_closed(start, size, metrics, stream_time):
        for t in range(start, start + size):
            for base in bases:
                cell_end = t - t % base + base
                assert is_late(cell_end, grace, stream_time, None)


@given(
    base=st.sampled_from([1_000, 60_000, 300_000]),
    grace=st.integers(0, 600_000),
    start_cells=st.integers(-1_000, 1_000),
    stream_time=st.one_of(st.none(), st.integers(-(10**9), 10**9)),
    watermark_cells=st.one_of(st.none(), st.integers(-1_000, 1_000)),
)
def test_latest_late_start_bounds_exactly_the_late_cells(
    base: int, grace: int, start_cells: int, stream_time: int | None, watermark_cells: int | None
) -> None:
    start = start_cells * base
    watermark = None if watermark_cells is None else watermark_cells * base
    late = is_late(start + base, grace, stream_time, watermark)
    assert late == (start <= latest_late_start(base, grace, stream_time, watermark))
