"""Hand-computed cases for the oracle's slicing (tests/oracle.py): local days and DST, hopping
and zoned windows, the base a zone needs, and sliced series / top / keys over rule 8's split."""

from __future__ import annotations

import json
from datetime import UTC, date, datetime
from typing import Any

import pytest

from tests.oracle import (
    DAY_MS,
    ExactQuantile,
    Record,
    format_duration,
    local_day_ms,
    local_midnight,
    point_source,
    required_base,
    series_windows,
    sliced_keys,
    sliced_series,
    sliced_top,
    view,
)

MIN, HOUR = 60_000, 3_600_000
T0 = 1_767_225_600_000  # 2026-01-01T00:00:00Z
LATER = T0 + 400 * DAY_MS  # a CreateTime no event is "in the future" of


def ms(text: str) -> int:
    return int(datetime.fromisoformat(text).timestamp() * 1000)


# --------------------------------------------------------------------------- days and windows


@pytest.mark.parametrize(
    ("tz", "day", "hours", "midnight"),
    [
        ("Europe/Berlin", date(2026, 3, 29), 23, "2026-03-28T23:00:00+00:00"),
        ("Europe/Berlin", date(2026, 10, 25), 25, "2026-10-24T22:00:00+00:00"),
        ("Europe/Berlin", date(2026, 10, 26), 24, "2026-10-25T23:00:00+00:00"),
        ("America/New_York", date(2026, 3, 8), 23, "2026-03-08T05:00:00+00:00"),
        ("America/New_York", date(2026, 11, 1), 25, "2026-11-01T04:00:00+00:00"),
        ("Asia/Kolkata", date(2026, 11, 1), 24, "2026-10-31T18:30:00+00:00"),
        ("UTC", date(2026, 3, 29), 24, "2026-03-29T00:00:00+00:00"),
        # Chile skips local midnight: the day starts at 01:00 -03, and lasts 23 hours
        ("America/Santiago", date(2026, 9, 6), 23, "2026-09-06T04:00:00+00:00"),
    ],
)
def test_local_days_last_23_or_25_hours_across_dst(
    tz: str, day: date, hours: int, midnight: str
) -> None:
    assert local_midnight(day, tz) == ms(midnight)
    assert local_day_ms(day, tz) == hours * HOUR


def test_tumbling_windows_start_in_the_range_aligned_to_the_epoch() -> None:
    assert series_windows(T0 + 17_000, T0 + 3 * HOUR, HOUR) == [
        (T0 + HOUR, T0 + 2 * HOUR),
        (T0 + 2 * HOUR, T0 + 3 * HOUR),
    ]
    assert series_windows(T0, T0 + 1, HOUR) == [(T0, T0 + HOUR)]
    assert series_windows(T0 + 1, T0 + HOUR, HOUR) == []
    # a zone does not move windows shorter than a day
    assert series_windows(T0, T0 + 3 * HOUR, HOUR, tz="Asia/Kolkata") == series_windows(
        T0, T0 + 3 * HOUR, HOUR
    )


def test_hopping_windows_start_every_step() -> None:
    windows = series_windows(T0, T0 + 3 * HOUR, 2 * HOUR, step_ms=HOUR)
    assert windows == [(T0 + h * HOUR, T0 + (h + 2) * HOUR) for h in range(3)]
    # a step larger than the window leaves gaps; starts are multiples of the step
    sampled = series_windows(T0 - 30 * MIN, T0 + 3 * HOUR, 5 * MIN, step_ms=HOUR)
    assert sampled == [(T0 + h * HOUR, T0 + h * HOUR + 5 * MIN) for h in range(3)]
    assert len(series_windows(T0, T0 + DAY_MS, DAY_MS, step_ms=15 * MIN)) == 96
    with pytest.raises(ValueError):
        series_windows(T0, T0 + HOUR, HOUR, step_ms=0)


def test_zoned_day_windows_start_at_local_midnight() -> None:
    start, end = ms("2026-10-23T00:00:00+00:00"), ms("2026-10-27T00:00:00+00:00")
    windows = series_windows(start, end, DAY_MS, tz="Europe/Berlin")
    assert [w[0] for w in windows] == [
        ms("2026-10-23T22:00:00+00:00"),
        ms("2026-10-24T22:00:00+00:00"),
        ms("2026-10-25T23:00:00+00:00"),
        ms("2026-10-26T23:00:00+00:00"),
    ]
    assert [(e - s) // HOUR for s, e in windows] == [24, 25, 24, 24]
    # two local days every day: the windows overlap, one of them 49 hours long
    two = series_windows(start, end, 2 * DAY_MS, step_ms=DAY_MS, tz="Europe/Berlin")
    assert [(e - s) // HOUR for s, e in two] == [49, 49, 48, 48]
    # UTC days in a zone equal epoch-aligned days; step days count from 1970-01-01
    assert series_windows(T0, T0 + 9 * DAY_MS, 2 * DAY_MS, tz="UTC") == series_windows(
        T0, T0 + 9 * DAY_MS, 2 * DAY_MS
    )
    # 2026-10-24 is day 20750 since 1970-01-01, an even one
    assert series_windows(start, end, DAY_MS, step_ms=2 * DAY_MS, tz="America/New_York") == [
        (ms("2026-10-24T04:00:00+00:00"), ms("2026-10-25T04:00:00+00:00")),
        (ms("2026-10-26T04:00:00+00:00"), ms("2026-10-27T04:00:00+00:00")),
    ]
    # a day window with a step of hours is not counted in local days
    hourly = series_windows(T0, T0 + 2 * HOUR, DAY_MS, step_ms=HOUR, tz="Asia/Kolkata")
    assert hourly == [(T0, T0 + DAY_MS), (T0 + HOUR, T0 + HOUR + DAY_MS)]


def test_the_base_a_zone_needs() -> None:
    kolkata = series_windows(T0, T0 + 3 * DAY_MS, DAY_MS, tz="Asia/Kolkata")
    assert len(kolkata) == 3
    assert required_base(kolkata, HOUR) == 30 * MIN
    assert format_duration(required_base(kolkata, HOUR) or 0) == "30m"
    assert required_base(kolkata, MIN) is None
    assert required_base(kolkata, 30 * MIN) is None
    kathmandu = series_windows(T0, T0 + 3 * DAY_MS, DAY_MS, tz="Asia/Kathmandu")
    assert format_duration(required_base(kathmandu, HOUR) or 0) == "15m"
    assert required_base(series_windows(T0, T0 + DAY_MS, DAY_MS, tz="Europe/Berlin"), HOUR) is None
    assert required_base([], HOUR) is None


def test_point_source_by_position() -> None:
    assert point_source(0, 10, None) == "speed"
    assert point_source(0, 10, 10) == "batch"
    assert point_source(10, 20, 10) == "speed"
    assert point_source(0, 20, 10) == "mixed"


# --------------------------------------------------------------------------- sliced answers

CONFIG: dict[str, Any] = {
    "sources": [
        {"name": "pv", "topic": "pv", "time_field": "ts", "id_field": "id", "partitions": 1}
    ],
    "metrics": [
        {
            "name": "m",
            "source": "pv",
            "key": ["country", "page"],
            "value": "lat",
            "aggregations": ["count", "sum", "avg", "distinct(user)", "quantiles(lat)"],
            "windows": ["1m", "1h"],
        }
    ],
}


def records(*events: dict[str, Any]) -> list[Record]:
    return [
        Record("pv", 0, i, LATER, json.dumps({"id": f"e{i}", **e}).encode())
        for i, e in enumerate(events)
    ]


def ev(ts: int, country: Any, page: Any, user: str, lat: float) -> dict[str, Any]:
    return {"ts": ts, "country": country, "page": page, "user": user, "lat": lat}


EVENTS = records(
    ev(T0 + 10_000, "de", "/a", "u1", 1.0),
    ev(T0 + 20_000, "de", "/b", "u1", 2.0),
    ev(T0 + 30_000, "fr", "/a", "u2", 3.0),
    ev(T0 + 30_000, 7, "/a", "u3", 4.0),
    ev(T0 + 2 * MIN, "7", "/b", "u3", 5.0),
    ev(T0 + 3 * MIN, "de", "/a", "u4", 6.0),
    ev(T0 + 10_000, "fr", "/b", "u9", 7.0),  # late: its cell ended 2 minutes before
    ev(T0 + 3 * MIN, "de", None, "u5", 8.0),  # skipped: key_invalid
)


def test_a_total_pools_the_events_of_every_key() -> None:
    v = view(CONFIG, "m", speed_records=EVENTS)
    (point,) = sliced_series(v, series_windows(T0, T0 + HOUR, HOUR))[()]
    assert point["start"] == T0 and point["end"] == T0 + HOUR and point["source"] == "speed"
    assert point["count"] == 6 and point["sum"] == 21.0 and point["avg"] == 3.5
    assert point["distinct_user"] == 4  # u1 twice, u3 twice: a union, not a sum
    assert isinstance(point["p50"], ExactQuantile) and point["p50"] == 3.0


def test_filters_and_group_by() -> None:
    v = view(CONFIG, "m", speed_records=EVENTS)
    windows = series_windows(T0, T0 + 5 * MIN, MIN)
    grouped = sliced_series(v, windows, {"country": ["de", "7"]}, ("page", "country"))
    assert list(grouped) == [("/a", "7"), ("/a", "de"), ("/b", "7"), ("/b", "de")]
    assert [(p["start"], p["count"]) for p in grouped[("/a", "de")]] == [(T0, 1), (T0 + 3 * MIN, 1)]
    by_page = sliced_series(v, windows, {"page": ["/a"]}, ("country",))
    assert {g: [p["count"] for p in ps] for g, ps in by_page.items()} == {
        ("7",): [1],
        ("de",): [1, 1],
        ("fr",): [1],
    }
    first = sliced_series(v, windows, {"country": ["de"]})[()][0]
    assert first["count"] == 2 and first["distinct_user"] == 1
    assert sliced_series(v, windows, {"country": ["zz"]}) == {}
    with pytest.raises(ValueError, match="city"):
        sliced_series(v, windows, {"city": ["x"]})
    hourly = view(
        CONFIG | {"metrics": [{**CONFIG["metrics"][0], "windows": ["1h"]}]},
        "m",
        speed_records=EVENTS,
    )
    kolkata = series_windows(T0, T0 + 2 * DAY_MS, DAY_MS, tz="Asia/Kolkata")
    with pytest.raises(ValueError, match="base window dividing 30m"):
        sliced_series(hourly, kolkata)


def test_rule_8_split_across_w() -> None:
    w = T0 + 2 * MIN
    after = records(
        *(json.loads(r.value or b"") for r in EVENTS),
        ev(T0 + 4 * MIN, "fr", "/b", "u6", 9.0),
        ev(T0 + 40_000, "fr", "/b", "u7", 10.0),  # in a cell W covers: late for the speed side
    )
    v = view(CONFIG, "m", speed_records=after, batch_records=EVENTS, watermark=w)
    total = sliced_series(v, series_windows(T0, T0 + 5 * MIN, MIN))[()]
    assert [(p["start"], p["source"], p["count"]) for p in total] == [
        (T0, "batch", 5),  # the late event counted by the batch
        (T0 + 2 * MIN, "speed", 1),
        (T0 + 3 * MIN, "speed", 1),
        (T0 + 4 * MIN, "speed", 1),
    ]
    (hour,) = sliced_series(v, series_windows(T0, T0 + HOUR, HOUR))[()]
    assert hour["source"] == "mixed" and hour["count"] == 8
    down = view(CONFIG, "m", speed_records=None, batch_records=EVENTS, watermark=w)
    (hour,) = sliced_series(down, series_windows(T0, T0 + HOUR, HOUR))[()]
    assert hour["source"] == "mixed" and hour["count"] == 5
    assert sliced_keys(down, T0 + 2 * MIN, T0 + HOUR) == []
    with pytest.raises(ValueError):
        view(CONFIG, "m", speed_records=None, batch_records=EVENTS)


def test_top_ranks_groups_with_ties_by_key() -> None:
    v = view(CONFIG, "m", speed_records=EVENTS)
    start, end, ranked = sliced_top(v, HOUR, T0 + 30 * MIN, "count", group_by=("page",))
    assert (start, end) == (T0, T0 + HOUR)
    assert ranked == [(("/a",), 4), (("/b",), 2)]
    _, _, ranked = sliced_top(v, MIN, T0, "count")
    assert ranked == [(("7", "/a"), 1), (("de", "/a"), 1), (("de", "/b"), 1), (("fr", "/a"), 1)]
    _, _, ranked = sliced_top(v, HOUR, T0, "distinct_user", {"page": ["/a"]}, ("country",))
    assert ranked == [(("de",), 2), (("7",), 1), (("fr",), 1)]
    with pytest.raises(ValueError):
        sliced_top(v, HOUR, T0, "p42")


def test_keys_after_filters_and_prefix() -> None:
    v = view(CONFIG, "m", speed_records=EVENTS)
    assert sliced_keys(v, T0, T0 + HOUR) == [
        ("7", "/a"),
        ("7", "/b"),
        ("de", "/a"),
        ("de", "/b"),
        ("fr", "/a"),
    ]
    assert sliced_keys(v, T0 + MIN, T0 + HOUR, {"page": ["/a", "/c"]}) == [("de", "/a")]
    assert sliced_keys(v, T0, T0 + HOUR, prefix="d") == [("de", "/a"), ("de", "/b")]
    assert sliced_keys(v, T0 + 1, T0 + MIN) == []


def test_day_windows_pool_the_local_day() -> None:
    berlin = ms("2026-10-24T22:00:00+00:00")  # local midnight starting the 25-hour day
    events = records(
        ev(berlin - 1, "de", "/a", "u1", 1.0),
        ev(berlin, "de", "/a", "u1", 2.0),
        ev(berlin + 24 * HOUR + 30 * MIN, "de", "/a", "u2", 3.0),
        ev(berlin + 25 * HOUR, "de", "/a", "u3", 4.0),
    )
    v = view(CONFIG, "m", speed_records=events)
    windows = series_windows(berlin - HOUR, berlin + 2 * DAY_MS, DAY_MS, tz="Europe/Berlin")
    points = sliced_series(v, windows)[()]
    assert [(p["end"] - p["start"], p["count"]) for p in points] == [(25 * HOUR, 2), (24 * HOUR, 1)]
    assert datetime.fromtimestamp(points[1]["start"] / 1000, UTC).hour == 23


@pytest.mark.parametrize(
    "tz",
    [
        "Europe/Berlin",
        "America/New_York",
        "Asia/Kolkata",
        "America/Santiago",  # DST starts at midnight: that day begins at 01:00
        "Asia/Tehran",  # the same until 2022
        "America/Havana",
        "Pacific/Apia",  # skipped 2011-12-30 entirely: that local day has no window
    ],
)
def test_the_api_windows_are_the_oracle_windows(tz: str) -> None:
    """The serving layer's window arithmetic (`serving_layer.windowing`, which the oracle does
    not import) against the oracle's, over years of DST changes."""
    from zoneinfo import ZoneInfo

    from serving_layer.windowing import WindowSpec

    start, end = ms("2011-06-01T00:00:00+00:00"), ms("2012-06-01T00:00:00+00:00")
    start2, end2 = ms("2021-01-01T00:00:00+00:00"), ms("2022-12-31T00:00:00+00:00")
    for size, step in ((DAY_MS, DAY_MS), (2 * DAY_MS, DAY_MS), (DAY_MS, 3 * DAY_MS), (HOUR, HOUR)):
        spec = WindowSpec(size, step, ZoneInfo(tz))
        for a, b in ((start, end), (start2, end2)):
            # A local day a zone skipped is an empty window: no event lies in it, so the
            # answers are the same whether it is listed (the oracle) or not (the API).
            want = [w for w in series_windows(a, b, size, step, tz) if w[1] > w[0]]
            assert spec.windows(a, b) == want, (size, step)
