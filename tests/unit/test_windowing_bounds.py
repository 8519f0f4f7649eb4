"""A query is bounded before it allocates: `WindowSpec.extent` counts the windows of a range
and finds where they begin and end by arithmetic, and must agree with the windows
`WindowSpec.windows` builds (UTC, hopping, local days across DST changes); local days and
times are computed safely up to the ends of years 1 and 9999."""

from __future__ import annotations

from datetime import datetime
from zoneinfo import ZoneInfo, available_timezones

import pytest
from fastapi import HTTPException
from hypothesis import given, settings
from hypothesis import strategies as st

from serving_layer.params import check_windows
from serving_layer.timefmt import format_time, parse_time
from serving_layer.windowing import DAY_MS, WindowSpec
from shared.config import Settings
from shared.events import MAX_EVENT_MS, MIN_EVENT_MS
from tests.conftest import platform_config

MINUTE = 60_000
CYCLE_MS = 146_097 * DAY_MS
"""400 Gregorian years."""
DST_ZONES = [
    "Europe/Berlin",
    "America/New_York",
    "America/Santiago",  # DST starts at midnight: that day begins at 01:00
    "Asia/Tehran",
    "America/Havana",
    "Australia/Lord_Howe",  # a 30-minute DST shift
    "Asia/Kolkata",
]


def ms(text: str) -> int:
    return int(datetime.fromisoformat(text).timestamp() * 1000)


def assert_extent_is_the_windows(spec: WindowSpec, start: int, end: int) -> None:
    windows = spec.windows(start, end)
    extent = spec.extent(start, end)
    assert extent.windows == len(windows), (spec, start, end)
    if windows:
        assert (extent.first_ms, extent.end_ms) == (windows[0][0], windows[-1][1])
        for n in {0, len(windows) // 2, len(windows) - 1}:
            assert spec.nth_start(start, n) == windows[n][0]
    else:
        assert extent.first_ms == extent.end_ms >= start


@settings(max_examples=300, deadline=None, derandomize=True)
@given(
    size=st.integers(1, 3 * 24 * 60),
    step=st.integers(1, 3 * 24 * 60),
    start=st.integers(-(10**13), 10**13),
    length=st.integers(0, 5 * DAY_MS),
)
def test_utc_and_hopping_windows_are_counted_exactly(
    size: int, step: int, start: int, length: int
) -> None:
    assert_extent_is_the_windows(WindowSpec(size * MINUTE, step * MINUTE), start, start + length)


@settings(max_examples=300, deadline=None, derandomize=True)
@given(
    tz=st.sampled_from(DST_ZONES),
    size=st.integers(1, 3),
    step=st.integers(1, 3),
    start=st.integers(ms("2020-01-01T00:00:00+00:00"), ms("2024-01-01T00:00:00+00:00")),
    length=st.integers(0, 60 * DAY_MS),
)
def test_local_days_across_dst_are_counted_exactly(
    tz: str, size: int, step: int, start: int, length: int
) -> None:
    spec = WindowSpec(size * DAY_MS, step * DAY_MS, ZoneInfo(tz))
    assert_extent_is_the_windows(spec, start, start + length)


def test_a_day_a_zone_skipped_is_counted_but_has_no_window() -> None:
    """Samoa skipped 2011-12-30: the count is an upper bound by exactly that day."""
    spec = WindowSpec(DAY_MS, DAY_MS, ZoneInfo("Pacific/Apia"))
    start, end = ms("2011-12-25T00:00:00+00:00"), ms("2012-01-05T00:00:00+00:00")
    windows = spec.windows(start, end)
    assert spec.extent(start, end).windows == len(windows) + 1
    assert spec.extent(start, end).end_ms == windows[-1][1]


@pytest.mark.parametrize("size_days, step_days", [(1, 1), (7, 1), (1, 3)])
def test_local_days_at_the_ends_of_years_1_and_9999_in_every_zone(
    size_days: int, step_days: int
) -> None:
    """datetime cannot hold year 0 or 10000: such local days are computed 400 years inwards
    (no zone has a transition near the ends), never raising."""
    for name in sorted(available_timezones()):
        spec = WindowSpec(size_days * DAY_MS, step_days * DAY_MS, ZoneInfo(name))
        for start, end in (
            (MIN_EVENT_MS, MIN_EVENT_MS + 9 * DAY_MS),
            (MAX_EVENT_MS - 9 * DAY_MS, MAX_EVENT_MS),
        ):
            assert_extent_is_the_windows(spec, start, end)


@settings(max_examples=100, deadline=None, derandomize=True)
@given(
    tz=st.sampled_from([*DST_ZONES, "Pacific/Kiritimati", "Pacific/Pago_Pago", "Europe/London"]),
    day=st.integers(0, 300 * 366),
    low=st.booleans(),
)
def test_zones_repeat_every_400_years_at_both_ends(tz: str, day: int, low: bool) -> None:
    """What computing 400 years inwards relies on, checked where datetime computes both
    sides directly: before a zone's first transition (years 2-302 against 402-702) and after
    its last (years 8600-8900 against 9000-9300)."""
    origin = ms("0002-01-01T00:00:00+00:00" if low else "8600-01-01T00:00:00+00:00")
    spec = WindowSpec(DAY_MS, DAY_MS, ZoneInfo(tz))
    start = origin + day * DAY_MS
    near = spec.windows(start, start + 3 * DAY_MS)
    far = spec.windows(start + CYCLE_MS, start + CYCLE_MS + 3 * DAY_MS)
    assert [(s + CYCLE_MS, e + CYCLE_MS) for s, e in near] == far


def test_times_are_written_for_every_bound() -> None:
    assert format_time(MAX_EVENT_MS + 1) == "10000-01-01T00:00:00Z"
    assert format_time(MAX_EVENT_MS) == "9999-12-31T23:59:59.999Z"
    assert format_time(MIN_EVENT_MS) == "0001-01-01T00:00:00Z"
    assert format_time(MIN_EVENT_MS - 1) == "0000-12-31T23:59:59.999Z"


@settings(max_examples=300, deadline=None, derandomize=True)
@given(moment=st.integers(MIN_EVENT_MS, MAX_EVENT_MS))
def test_written_times_read_back(moment: int) -> None:
    assert parse_time(format_time(moment)) == moment
    assert parse_time(str(moment)) == moment


def test_epoch_milliseconds_are_ascii_digits() -> None:
    arabic_indic = "".join(chr(0x660 + int(d)) for d in "1700000000000")
    assert int(arabic_indic) == 1_700_000_000_000  # what `int` alone would have read
    assert parse_time(arabic_indic) is None
    assert parse_time("\u00b2") is None  # superscript two
    assert parse_time(str(MAX_EVENT_MS + 1)) is None


# --------------------------------------------------------------------------- the cost bound

SETTINGS = Settings(**platform_config("bounds"))  # views_by_page: base 1m, max_cells 50,000
VIEWS = SETTINGS.plans["views_by_page"]
T0 = ms("2026-01-01T00:00:00+00:00")


def refusal(spec: WindowSpec, start: int, end: int) -> str:
    with pytest.raises(HTTPException) as refused:
        check_windows(SETTINGS, VIEWS, spec, start, end)
    assert refused.value.status_code == 400
    return str(refused.value.detail)


def test_hopping_windows_count_each_cell_once_per_window() -> None:
    """`window=1d&step=1m` over a month spans 46,080 cells but merges 64 million."""
    detail = refusal(WindowSpec(DAY_MS, MINUTE), T0, T0 + 31 * DAY_MS)
    assert "64281600 cells" in detail and "44640 windows of 1d, 1440 x 1m cells each" in detail
    assert "at most 34 windows (end=2026-01-01T00:34:00Z)" in detail
    assert "step=1d reads each cell once" in detail
    check_windows(SETTINGS, VIEWS, WindowSpec(DAY_MS, MINUTE), T0, T0 + 34 * MINUTE)
    check_windows(SETTINGS, VIEWS, WindowSpec(DAY_MS, DAY_MS), T0, T0 + 31 * DAY_MS)


def test_a_window_larger_than_the_limit_names_the_largest() -> None:
    detail = refusal(WindowSpec(60 * DAY_MS, 60 * DAY_MS), 0, 1)
    assert "send a window of at most 50000m" in detail


def test_windows_past_year_9999_are_refused_with_the_supported_range() -> None:
    berlin, tokyo = WindowSpec(DAY_MS, DAY_MS, ZoneInfo("Europe/Berlin")), ZoneInfo("Asia/Tokyo")
    last = ms("9999-12-31T00:00:00+00:00")
    check_windows(SETTINGS, VIEWS, WindowSpec(DAY_MS, DAY_MS), last, MAX_EVENT_MS)
    berlin_new_year = ms("9999-12-31T23:00:00+00:00")  # local 10000-01-01 begins there
    check_windows(SETTINGS, VIEWS, berlin, last - DAY_MS, berlin_new_year)
    assert "10000-01-01T23:00:00Z" in refusal(berlin, last - DAY_MS, berlin_new_year + 1)
    detail = refusal(WindowSpec(DAY_MS, DAY_MS, tokyo), last, MAX_EVENT_MS)
    assert "[0001-01-01T00:00:00Z, 10000-01-01T00:00:00Z)" in detail
    assert "10000-01-01T15:00:00Z" in detail and "send an earlier end" in detail
    assert "send an earlier end" in refusal(WindowSpec(7 * DAY_MS, DAY_MS), last, MAX_EVENT_MS)
