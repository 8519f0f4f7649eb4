"""Hand-computed cases for the brute-force oracle (tests/oracle.py)."""

from __future__ import annotations

import copy
import json
import pickle
import sys
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tests.oracle import (
    KLL_RANK_EPS,
    ExactQuantile,
    Record,
    batch_watermark,
    compare,
    compute,
    compute_cells,
    exact_quantile,
    parse_rfc3339_ms,
    quantile_name,
    rank_bounds,
    window_start,
)

T0 = 1_704_067_200_000  # 2024-01-01T00:00:00Z
MIN = 60_000
HOUR = 3_600_000
DAY = 86_400_000
LATER = T0 + 10 * DAY  # a CreateTime no test event is "in the future" of

CONFIG: dict[str, Any] = {
    "sources": [
        {"name": "pv", "topic": "pv", "time_field": "ts", "id_field": "id", "partitions": 2},
        {
            "name": "plain",
            "topic": "plain",
            "time_field": "ts",
            "partitions": 1,
            "max_future": "1s",
        },
    ],
    "metrics": [
        {
            "name": "by_page",
            "source": "pv",
            "key": ["page"],
            "value": "lat",
            "aggregations": ["count", "sum", "min", "max", "avg", "distinct(user)"],
            "windows": ["1m", "1h", "1d"],
            "grace": "2m",
        },
        {"name": "total", "source": "pv", "key": [], "aggregations": ["count"], "windows": ["1m"]},
        {
            "name": "plain_count",
            "source": "plain",
            "key": ["k"],
            "aggregations": ["count", "distinct(u)"],
            "windows": ["1m", "1d"],
        },
    ],
}


def records(
    topic: str, *values: Any, partition: int = 0, first_offset: int = 0, create: int = LATER
) -> list[Record]:
    """One record per value (dicts are JSON-encoded; bytes and None are taken as they are)."""
    out = []
    for i, value in enumerate(values):
        raw = json.dumps(value).encode() if isinstance(value, dict) else value
        out.append(Record(topic, partition, first_offset + i, create, raw))
    return out


def pv(n: int, ts: Any, page: Any = "home", user: Any = "u1", lat: Any = 1) -> dict[str, Any]:
    return {"id": f"e{n}", "ts": ts, "page": page, "user": user, "lat": lat}


def test_rfc3339_parsing() -> None:
    assert parse_rfc3339_ms("2024-01-01T00:00:00Z") == T0
    assert parse_rfc3339_ms("2024-01-01T02:00:00+02:00") == T0
    assert parse_rfc3339_ms("2023-12-31T22:30:00-01:30") == T0
    assert parse_rfc3339_ms("2024-01-01t00:00:00z") == T0
    assert parse_rfc3339_ms("2024-01-01T00:00:00.123456Z") == T0 + 123
    assert parse_rfc3339_ms("2024-01-01T00:00:00.5Z") == T0 + 500
    assert parse_rfc3339_ms("1969-12-31T23:59:59.9995Z") == -1  # floored, not truncated
    assert parse_rfc3339_ms("1970-01-01T00:00:00.0009Z") == 0
    for bad in (
        "2024-01-01T00:00:00",
        "2024-01-01 00:00:00Z",
        "2024-01-01T00:00:00+0200",
        "2024-01-01T00:00:00.1234567Z",
        "2024-01-01T00:00:00.Z",
        "2024-01-01T00:00:60Z",
        "2024-02-30T00:00:00Z",
        "2024-01-01T00:00:00+24:00",
        "24-01-01T00:00:00Z",
        "2024-01-01T00:00:00Z\n",
        "\uff12\uff10\uff12\uff14-01-01T00:00:00Z",  # non-ASCII digits
    ):
        assert parse_rfc3339_ms(bad) is None, bad


def test_int_and_rfc3339_times_land_in_the_same_cells() -> None:
    recs = records(
        "plain",
        {"ts": T0 + 30_000, "k": "a", "u": 1},
        {"ts": "2024-01-01T00:00:30Z", "k": "a", "u": 2},
        {"ts": "2024-01-01T02:00:30.999+02:00", "k": "a", "u": 3},
        {"ts": "2023-12-31T23:00:59-01:00", "k": "a", "u": 4},
        {"ts": "2024-01-01T00:01:00Z", "k": "a", "u": 5},
    )
    assert compute_cells(CONFIG, recs) == {
        ("plain_count", MIN, T0, ("a",)): {"count": 4, "distinct_u": 4},
        ("plain_count", MIN, T0 + MIN, ("a",)): {"count": 1, "distinct_u": 1},
        ("plain_count", DAY, T0, ("a",)): {"count": 5, "distinct_u": 5},
    }


def test_int_and_string_are_one_canonical_value() -> None:
    recs = records(
        "plain",
        {"ts": T0, "k": 7, "u": 7},
        {"ts": T0, "k": "7", "u": "7"},
        {"ts": T0, "k": "7", "u": "07"},
        {"ts": T0, "k": -7, "u": -7},
    )
    cells = compute_cells(CONFIG, recs)
    assert cells[("plain_count", MIN, T0, ("7",))] == {"count": 3, "distinct_u": 2}
    assert cells[("plain_count", MIN, T0, ("-7",))] == {"count": 1, "distinct_u": 1}
    assert len(cells) == 4


def test_every_malformed_reason() -> None:
    plain = records(
        "plain",
        None,
        b"not json",
        b"[1, 2]",
        b'"a string"',
        b"\xff\xfe{}",
        b'{"ts": NaN, "k": "a", "u": 1}',
        b'{"ts": 1, "k": "a"',
        {"k": "a", "u": 1},
        {"ts": True, "k": "a", "u": 1},
        {"ts": float(T0), "k": "a", "u": 1},
        {"ts": None, "k": "a", "u": 1},
        {"ts": [T0], "k": "a", "u": 1},
        {"ts": "2024-01-01T00:00:00", "k": "a", "u": 1},
        {"ts": "2024-01-01T00:00:00.1234567Z", "k": "a", "u": 1},
        {"ts": "2024-02-30T00:00:00Z", "k": "a", "u": 1},
        {"ts": "0001-01-01T00:00:00+00:01", "k": "a", "u": 1},
        {"ts": -62_135_596_800_001, "k": "a", "u": 1},
        {"ts": T0, "k": "ok", "u": 1},
    )
    future = records("plain", {"ts": T0 + 1_001, "k": "a", "u": 1}, create=T0, first_offset=100)
    edge = records("plain", {"ts": T0 + 1_000, "k": "edge", "u": 1}, create=T0, first_offset=200)
    ids = records(
        "pv",
        {"ts": T0, "page": "p", "user": "u", "lat": 1},
        {"id": True, "ts": T0, "page": "p", "user": "u", "lat": 1},
        {"id": 1.5, "ts": T0, "page": "p", "user": "u", "lat": 1},
        {"id": None, "ts": T0, "page": "p", "user": "u", "lat": 1},
        {"id": ["x"], "ts": T0, "page": "p", "user": "u", "lat": 1},
    )
    result = compute(CONFIG, plain + future + edge + ids)
    assert result.malformed == {
        "not_json_object": 7,
        "time_missing": 1,
        "time_invalid": 7,
        "time_out_of_range": 2,
        "time_in_future": 1,
        "id_missing": 1,
        "id_invalid": 4,
    }
    assert set(result.cells) == {
        ("plain_count", MIN, T0, ("ok",)),
        ("plain_count", DAY, T0, ("ok",)),
        ("plain_count", MIN, T0, ("edge",)),
        ("plain_count", DAY, T0, ("edge",)),
    }
    assert result.skipped == {"by_page": 0, "total": 0, "plain_count": 0}
    # the edge event lies 1 s after its record's timestamp: stream time stops at the timestamp
    assert result.stream_time == {("plain", 0): T0}


def test_default_max_future_is_five_minutes() -> None:
    recs = records("pv", pv(1, T0 + 300_000), pv(2, T0 + 300_001), create=T0)
    result = compute(CONFIG, recs)
    assert result.malformed == {"time_in_future": 1}
    assert result.cells[("total", MIN, T0 + 5 * MIN, ())] == {"count": 1}


def test_metric_level_skips_affect_only_that_metric() -> None:
    skipped = [
        {"id": "a", "ts": T0, "user": "u", "lat": 1},
        pv(2, T0, page=True),
        pv(3, T0, page=1.5),
        pv(4, T0, page=None),
        {"id": "b", "ts": T0, "page": "p", "lat": 1},
        pv(6, T0, user={"x": 1}),
        {"id": "c", "ts": T0, "page": "p", "user": "u"},
        pv(8, T0, lat="3"),
        pv(9, T0, lat=False),
        pv(10, T0, lat=None),
        pv(11, T0, lat=10**400),
    ]
    infinite = b'{"id": "inf", "ts": %d, "page": "p", "user": "u", "lat": 1e999}' % T0
    recs = records("pv", *skipped, infinite, pv(12, T0, lat=2), pv(13, T0, lat=2.5))
    result = compute(CONFIG, recs)
    assert result.malformed == {}
    assert result.skipped == {"by_page": 12, "total": 0, "plain_count": 0}
    assert result.cells[("total", MIN, T0, ())] == {"count": 14}
    assert result.cells[("by_page", MIN, T0, ("home",))]["count"] == 2


def test_aggregates_have_exactly_the_configured_fields_in_every_window() -> None:
    recs = records(
        "pv",
        pv(1, T0 + 1, lat=1, user="a"),
        pv(2, T0 + 2, lat=2.5, user="b"),
        pv(3, T0 + 59_999, lat=-4, user="a"),
    )
    cells = compute_cells(CONFIG, recs)
    expected = {
        "count": 3,
        "sum": -0.5,
        "min": -4.0,
        "max": 2.5,
        "avg": -0.5 / 3,
        "distinct_user": 2,
    }
    for size in (MIN, HOUR, DAY):
        assert cells[("by_page", size, T0, ("home",))] == expected
    assert cells[("total", MIN, T0, ())] == {"count": 3}
    assert len(cells) == 4


def test_duplicates() -> None:
    p0 = records(
        "pv",
        pv(1, T0, lat=1),
        pv(1, T0 + 5 * MIN, lat=100),  # same id, another time: another event
        pv(1, T0, lat=100),  # same id and time, another payload: a duplicate
        {"id": 7, "ts": T0, "page": "home", "user": "u", "lat": 1},
        {"id": "7", "ts": T0, "page": "home", "user": "u", "lat": 1},
        {"id": "y", "page": "home", "user": "u", "lat": 1},  # malformed copy does not claim y
        {"id": "y", "ts": T0, "page": "home", "user": "u", "lat": 1},
        {"id": "z", "ts": T0, "page": "home", "user": "u", "lat": 1},
    )
    p1 = records(
        "pv",
        {"id": "z", "ts": T0, "page": "x", "user": "u", "lat": 1},
        {"id": "z", "ts": T0 + MIN, "page": "x", "user": "u", "lat": 1},
        partition=1,
    )
    result = compute(CONFIG, p1 + p0)  # partition order decides, not list order
    assert result.duplicates == 3
    assert result.malformed == {"time_missing": 1}
    assert result.cells[("by_page", MIN, T0, ("home",))]["count"] == 4
    assert result.cells[("by_page", MIN, T0 + 5 * MIN, ("home",))]["count"] == 1
    assert ("by_page", MIN, T0, ("x",)) not in result.cells
    assert result.cells[("by_page", MIN, T0 + MIN, ("x",))]["count"] == 1
    assert result.stream_time == {("pv", 0): T0 + 5 * MIN, ("pv", 1): T0 + MIN}


def test_late_rule_with_grace_per_partition() -> None:
    p0 = records(
        "pv",
        pv(1, T0 + 30_000),
        pv(2, T0 + 3 * MIN),  # stream time T0+3m
        pv(3, T0 + 59_999),  # base cell ends T0+1m; +2m grace <= T0+3m: late
        pv(4, T0 + 90_000),  # ends T0+2m; +2m = T0+4m > T0+3m: on time
    )
    p1 = records(
        "pv",
        pv(5, T0 + 10_000),  # partition 1 has its own stream time
        pv(2, T0 + 3 * MIN),  # duplicate of e2: dropped, but counts for stream time
        pv(9, T0 + 10 * MIN),  # stream time T0+10m
        pv(7, T0 + 7 * MIN),  # ends T0+8m; +2m <= T0+10m: late
        pv(8, T0 + 8 * MIN + 1),  # ends T0+9m; +2m > T0+10m: on time
        partition=1,
    )
    result = compute(CONFIG, p0 + p1, late_rule=True)
    assert result.late == {"by_page": 2, "total": 4, "plain_count": 0}
    assert result.duplicates == 1
    cells = result.cells
    assert cells[("by_page", MIN, T0, ("home",))]["count"] == 2
    assert cells[("by_page", MIN, T0 + MIN, ("home",))]["count"] == 1
    assert ("by_page", MIN, T0 + 7 * MIN, ("home",)) not in cells
    assert cells[("by_page", HOUR, T0, ("home",))]["count"] == 6  # late ones left out here too
    assert cells[("by_page", DAY, T0, ("home",))]["count"] == 6
    # grace 0: a later event of an earlier cell is late at once
    assert {c[2]: v["count"] for c, v in cells.items() if c[0] == "total"} == {
        T0: 2,
        T0 + 3 * MIN: 1,
        T0 + 10 * MIN: 1,
    }
    everything = compute_cells(CONFIG, p0 + p1)
    assert everything[("by_page", HOUR, T0, ("home",))]["count"] == 8


def test_late_rule_with_watermark() -> None:
    recs = records("pv", pv(1, T0 + 2 * MIN - 1), pv(2, T0 + 2 * MIN), pv(3, T0))
    result = compute(CONFIG, recs, late_rule=True, watermarks={"by_page": T0 + 2 * MIN})
    assert result.late == {"by_page": 2, "total": 1, "plain_count": 0}
    assert result.cells[("by_page", HOUR, T0, ("home",))]["count"] == 1
    assert result.cells[("total", MIN, T0 + MIN, ())] == {"count": 1}
    with pytest.raises(ValueError):
        compute(CONFIG, recs, watermarks={"by_page": T0})


def test_window_alignment_negative_times_and_days() -> None:
    assert window_start(-1, MIN) == -MIN
    assert window_start(-MIN, MIN) == -MIN
    assert window_start(-MIN - 1, MIN) == -2 * MIN
    assert window_start(-1, DAY) == -DAY
    assert window_start(T0 + DAY - 1, DAY) == T0
    recs = records(
        "plain",
        {"ts": -1, "k": "a", "u": 1},
        {"ts": "1969-12-31T23:59:00Z", "k": "a", "u": 1},
        {"ts": 0, "k": "a", "u": 1},
    )
    march_11 = 1_710_115_200_000  # 2024-03-11T00:00:00Z
    recs += records(
        "plain",
        {"ts": "2024-03-10T23:59:59.999-01:00", "k": "b", "u": 1},  # UTC: 2024-03-11 00:59
        first_offset=10,
        create=march_11 + DAY,
    )
    cells = compute_cells(CONFIG, recs)
    assert {k: v["count"] for k, v in cells.items()} == {
        ("plain_count", MIN, -MIN, ("a",)): 2,
        ("plain_count", MIN, 0, ("a",)): 1,
        ("plain_count", DAY, -DAY, ("a",)): 2,
        ("plain_count", DAY, 0, ("a",)): 1,
        ("plain_count", MIN, march_11 + 59 * MIN, ("b",)): 1,
        ("plain_count", DAY, march_11, ("b",)): 1,
    }


def test_batch_watermark() -> None:
    recs = records("pv", pv(1, T0 + 3 * MIN), pv(1, T0 + 10 * MIN + 30_000)) + records(
        "pv", pv(3, T0 + 5 * MIN), {"ts": T0 + DAY}, partition=1
    )
    # max_p L_p = T0+10m30s (a duplicate's time counts); -2m grace; floor to 1m
    assert batch_watermark(CONFIG, recs, "by_page") == T0 + 8 * MIN
    assert batch_watermark(CONFIG, recs, "by_page", prev=T0 + 9 * MIN) == T0 + 9 * MIN
    assert batch_watermark(CONFIG, recs, "by_page", prev=T0) == T0 + 8 * MIN
    assert batch_watermark(CONFIG, recs, "total") == T0 + 10 * MIN
    assert batch_watermark(CONFIG, recs, "plain_count") is None
    assert batch_watermark(CONFIG, recs, "plain_count", prev=T0) == T0
    assert batch_watermark(CONFIG, [], "by_page") is None


def test_compare() -> None:
    a = ("m", MIN, T0, ("x",))
    b = ("m", MIN, T0 + MIN, ("x",))
    c = ("m", MIN, T0 + 2 * MIN, ("x",))
    expected = {
        a: {"count": 3, "sum": 0.3, "distinct_u": 1000},
        b: {"count": 1, "sum": 0.0, "distinct_u": 1},
    }
    ok = {
        a: {"count": 3, "sum": 0.1 + 0.2, "distinct_u": 1049},
        b: {"count": 1.0, "sum": 1e-17, "distinct_u": 2},
    }
    assert compare(expected, ok) == []
    bad = {
        a: {"count": 4, "sum": 0.31, "distinct_u": 1052, "max": 1},
        c: {"count": 1},
    }
    lines = compare(expected, bad)
    assert len(lines) == 6, lines
    assert lines[0].startswith("missing cell ('m', 60000, 1704067260000")
    assert lines[1].startswith("extra cell ('m', 60000, 1704067320000")
    assert any("unexpected field max" in line for line in lines)
    assert any("count expected 3, got 4" in line for line in lines)
    assert any("sum expected 0.3, got 0.31" in line for line in lines)
    assert any("distinct_u expected 1000, got 1052" in line for line in lines)
    assert compare({a: {"count": 1}}, {a: {}}) == [f"cell {a}: field count missing (expected 1)"]


QCONFIG: dict[str, Any] = {
    "sources": [{"name": "q", "topic": "q", "time_field": "ts", "partitions": 1}],
    "metrics": [
        {
            "name": "lat_q",
            "source": "q",
            "key": ["page"],
            "aggregations": ["count", "quantiles( lat )"],
            "windows": ["1m", "1h"],
        },
        {
            "name": "with_value",
            "source": "q",
            "key": [],
            "value": "v",
            "aggregations": ["count", "sum", "distinct(u)", "quantiles(lat)"],
            "windows": ["1m"],
        },
    ],
}


def q_event(ts: int, lat: Any, page: str = "home", v: Any = 1, u: Any = "a") -> dict[str, Any]:
    return {"ts": ts, "page": page, "lat": lat, "v": v, "u": u}


def test_exact_quantiles_are_inclusive_lower_quantiles() -> None:
    lats = [5, 1, 4, 2, 3, 10, 9, 8, 7, 6]
    recs = records("q", *(q_event(T0 + i, lat) for i, lat in enumerate(lats)))
    recs += records(
        "q",
        q_event(T0 + MIN, 2, page="dup"),
        q_event(T0 + MIN, 7.5, page="dup"),
        q_event(T0 + MIN + 1, 2, page="dup"),
        q_event(T0 + MIN + 2, 2.0, page="dup"),
        q_event(T0 + 2 * MIN, -1.5, page="neg"),
        q_event(T0 + 2 * MIN, 3, page="neg"),
        q_event(T0 + 2 * MIN, 0.25, page="neg"),
        first_offset=100,
    )
    cells = compute_cells(QCONFIG, recs)
    # n=10, values 1..10: p50 = ordered[ceil(5)-1], p90 = [ceil(9)-1], p99 = [ceil(9.9)-1]
    assert cells[("lat_q", MIN, T0, ("home",))] == {"count": 10, "p50": 5, "p90": 9, "p99": 10}
    # n=4, values 2, 2, 2, 7.5: #{<= 2} = 3 >= 0.5*4 but < 0.9*4
    assert cells[("lat_q", MIN, T0 + MIN, ("dup",))] == {
        "count": 4,
        "p50": 2,
        "p90": 7.5,
        "p99": 7.5,
    }
    assert cells[("lat_q", MIN, T0 + 2 * MIN, ("neg",))] == {
        "count": 3,
        "p50": 0.25,
        "p90": 3,
        "p99": 3,
    }
    # a larger window holds the same values: its own exact list, not a merge of quantiles
    hour = cells[("lat_q", HOUR, T0, ("home",))]
    assert hour == {"count": 10, "p50": 5, "p90": 9, "p99": 10}
    p50 = hour["p50"]
    assert isinstance(p50, ExactQuantile)
    assert p50.values == tuple(float(x) for x in range(1, 11))
    assert str(p50.q) == "0.5"
    assert cells[("with_value", MIN, T0, ())] == {
        "count": 10,
        "sum": 10.0,
        "distinct_u": 1,
        "p50": 5,
        "p90": 9,
        "p99": 10,
    }


def test_quantile_fractions_names_and_exact_arithmetic() -> None:
    assert [quantile_name(q) for q in ("0.5", 0.9, 0.99, 0.999, "0.25", "0.50")] == [
        "p50",
        "p90",
        "p99",
        "p99.9",
        "p25",
        "p50",
    ]
    hundred = [float(i) for i in range(1, 101)]
    # 0.07 * 100 is 7.000000000000001 in floats; q n is taken exactly: the 7th value
    assert exact_quantile(hundred, 0.07) == 7.0
    assert exact_quantile(hundred, "0.071") == 8.0
    assert exact_quantile([3.0], "0.001") == 3.0
    recs = records("q", *(q_event(T0, lat) for lat in range(1, 1001)))
    cells = compute_cells(QCONFIG, recs, quantiles=("0.25", 0.999))
    assert cells[("lat_q", MIN, T0, ("home",))] == {"count": 1000, "p25": 250, "p99.9": 999}
    for bad in (0, 1, "1.5", "x", float("nan")):
        with pytest.raises(ValueError):
            compute(QCONFIG, recs, quantiles=(bad,))
    twice = {
        **QCONFIG,
        "metrics": [{**QCONFIG["metrics"][1], "aggregations": ["quantiles(a)", "quantiles(b)"]}],
    }
    with pytest.raises(ValueError, match="at most one quantiles"):
        compute(twice, recs)


def test_invalid_quantile_fields_skip_the_event_for_that_metric() -> None:
    skipped = [
        q_event(T0, True),
        q_event(T0, False),
        q_event(T0, "3"),
        q_event(T0, None),
        q_event(T0, [1]),
        q_event(T0, {"x": 1}),
        q_event(T0, 10**400),  # an integer too large for a double
        {"ts": T0, "page": "home", "v": 1, "u": "a"},  # missing
    ]
    infinite = b'{"ts": %d, "page": "home", "lat": 1e999, "v": 1, "u": "a"}' % T0
    nan = b'{"ts": %d, "page": "home", "lat": NaN, "v": 1, "u": "a"}' % T0  # not JSON
    valid = [q_event(T0, 3), q_event(T0, 2.5), q_event(T0, -(2**60))]
    value_bad = [q_event(T0, 1, v=True), q_event(T0, 1, u=1.5)]  # only with_value skips these
    recs = records("q", *skipped, infinite, nan, *valid, *value_bad)
    result = compute(QCONFIG, recs)
    assert result.malformed == {"not_json_object": 1}
    assert result.skipped == {"lat_q": 9, "with_value": 11}
    cell = result.cells[("lat_q", MIN, T0, ("home",))]
    assert cell["count"] == 5
    p50 = cell["p50"]
    assert isinstance(p50, ExactQuantile)
    assert p50.values == (-(2.0**60), 1.0, 1.0, 2.5, 3.0)
    assert result.cells[("with_value", MIN, T0, ())]["count"] == 3
    assert result.cells[("with_value", MIN, T0, ())]["p50"] == 2.5


def test_quantile_rank_bounds() -> None:
    ordered = [1.0, 2.0, 2.0, 2.0, 5.0]
    assert rank_bounds(ordered, 2.0) == (0.2, 0.8)
    assert rank_bounds(ordered, 3.0) == (0.8, 0.8)
    assert rank_bounds(ordered, 0.0) == (0.0, 0.0)
    assert rank_bounds(ordered, 5.0) == (0.8, 1.0)
    assert KLL_RANK_EPS == 0.0133


def test_compare_judges_quantiles_by_rank() -> None:
    a = ("m", MIN, T0, ())
    thousand = [float(i) for i in range(1000, 0, -1)]
    p50 = ExactQuantile("0.5", thousand)
    assert p50 == 500.0
    expected: dict[Any, dict[str, Any]] = {a: {"count": 1000, "p50": p50}}
    # rank_lo(513) = 0.512, 0.512 - 0.0133 <= 0.5; rank_hi(487) = 0.487, + 0.0133 >= 0.5
    for ok in (500, 500.0, 510, 513, 487, 500.5):
        assert compare(expected, {a: {"count": 1000, "p50": ok}}) == [], ok
    for bad in (515, 486, 1e6, -1, None, "500", True, float("inf"), float("nan"), 10**400):
        lines = compare(expected, {a: {"count": 1000, "p50": bad}})
        assert len(lines) == 1 and "p50 expected 500.0" in lines[0], (bad, lines)
    assert "q=0.5" in compare(expected, {a: {"count": 1000, "p50": 515}})[0]
    # with no error allowed, both 500 (inclusive rank 0.5) and 501 (exclusive rank 0.5) fit
    for v, fits in ((499, False), (500, True), (501, True), (502, False)):
        assert (compare(expected, {a: {"count": 1000, "p50": v}}, rank_eps=0) == []) is fits, v
    assert compare(expected, {a: {"count": 1000, "p50": 502}}, rank_eps=0.002) == []
    assert compare(expected, {a: {"count": 1000, "p50": 504}}, rank_eps=0.002) != []
    # ties: 600 zeros then 400 ones; a value's rank spans [rank_lo, rank_hi]
    ties = [0.0] * 600 + [1.0] * 400
    expected = {a: {"p50": ExactQuantile(0.5, ties), "p99": ExactQuantile(0.99, ties)}}
    assert compare(expected, {a: {"p50": 0, "p99": 1}}) == []
    assert len(compare(expected, {a: {"p50": 1, "p99": 0}})) == 2
    # other outputs of the cell compare as before; a plain float p50 compares by value
    assert compare({a: {"count": 3, "p50": 2.0}}, {a: {"count": 3, "p50": 2.0000001}}) != []
    assert compare({a: {"count": 3, "p50": p50}}, {a: {"count": 4, "p50": 500}}) == [
        f"cell {a}: count expected 3, got 4"
    ]
    assert compare({a: {"p50": p50}}, {a: {}}) == [f"cell {a}: field p50 missing (expected 500.0)"]


def test_exact_quantiles_survive_copies() -> None:
    p90 = ExactQuantile(0.9, [3.0, 1.0, 2.0])
    for twin in (copy.deepcopy(p90), pickle.loads(pickle.dumps(p90))):
        assert isinstance(twin, ExactQuantile)
        assert twin == 3.0 and twin.values == (1.0, 2.0, 3.0) and twin.q == p90.q
    assert json.dumps({"p90": p90}) == '{"p90": 3.0}'
