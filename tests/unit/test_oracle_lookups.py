"""Hand-computed cases for the oracle's lookup tables (tests/oracle.py, rule 11 in
docs/semantics.md): as-of joins of a table's versions to each event's time, deletions,
left-join misses, join keys and invalid table records."""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.oracle import OracleResult, Record, compute, compute_cells
from tests.unit.test_oracle import HOUR, MIN, T0, records

PAGES = {"name": "pages", "topic": "pages", "key_field": "page", "time_field": "valid_from"}
USERS = {"name": "users", "topic": "users", "key_field": "uid"}  # valid from the timestamp
BY_SECTION = {
    "name": "by_section",
    "source": "pv",
    "lookups": [{"table": "pages", "on": "page", "as": "p"}],
    "key": ["p.section"],
    "aggregations": ["count"],
    "windows": ["1h"],
}


def config(*metrics: dict[str, Any]) -> dict[str, Any]:
    return {
        "sources": [{"name": "pv", "topic": "pv", "time_field": "ts", "partitions": 1}],
        "tables": [{**PAGES, "partitions": 2}, USERS],
        "metrics": list(metrics),
    }


def metric(name: str, **overrides: Any) -> dict[str, Any]:
    return {**BY_SECTION, "name": name, **overrides}


def page(name: Any, valid_from: Any, section: Any = None, **more: Any) -> dict[str, Any]:
    out = {"page": name, "valid_from": valid_from, **more}
    if section is not None:
        out["section"] = section
    return out


def views(*events: tuple[int, Any]) -> list[Record]:
    """A pageview per (event time, page)."""
    return records("pv", *({"ts": ts, "page": name} for ts, name in events))


def sections(result: OracleResult, name: str = "by_section") -> dict[tuple[str, ...], int]:
    """The metric's counts per key over its hour windows starting at T0."""
    return {
        key: int(outputs["count"])
        for (metric_name, size, start, key), outputs in result.cells.items()
        if metric_name == name and size == HOUR and start == T0
    }


def test_a_table_that_changes_mid_stream() -> None:
    table = records("pages", page("a", T0 + 10 * MIN, "news"), page("a", T0 + 20 * MIN, "sport"))
    events = views(
        (T0 + 5 * MIN, "a"),  # before any version: no match
        (T0 + 15 * MIN, "a"),  # news
        (T0 + 20 * MIN, "a"),  # sport, valid from exactly then
        (T0 + 25 * MIN, "a"),  # sport
    )
    cfg = config(BY_SECTION)
    result = compute(cfg, table + events)
    assert result.cells == {
        ("by_section", HOUR, T0, ("news",)): {"count": 1},
        ("by_section", HOUR, T0, ("sport",)): {"count": 2},
    }
    assert result.skipped == {"by_section": 1}
    assert result.table_malformed == {}
    # the join depends on the event time and the table, not on where the records sit
    assert compute(cfg, events + table[::-1]).cells == result.cells
    # nor on the late rule: every event here is on time in its partition
    assert compute(cfg, events + table, late_rule=True).cells == result.cells


def test_a_back_dated_version_wins_from_its_own_time_on() -> None:
    table = records(
        "pages",
        page("a", T0, "news"),
        page("a", T0 + 30 * MIN, "sport"),
        page("a", T0 + 10 * MIN, "tech"),  # a later offset, valid from an earlier time
    )
    events = views((T0 + 5 * MIN, "a"), (T0 + 15 * MIN, "a"), (T0 + 35 * MIN, "a"))
    assert sections(compute(config(BY_SECTION), events + table)) == {
        ("news",): 1,
        ("tech",): 1,
        ("sport",): 1,
    }


def test_versions_valid_from_the_same_time_the_larger_offset_then_partition_wins() -> None:
    table = [
        *records("pages", page("a", T0, "later"), first_offset=7),
        *records("pages", page("a", T0, "earlier"), first_offset=3),
        # same time and offset in two partitions: the greater partition wins
        *records("pages", page("b", T0, "p1"), partition=1, first_offset=5),
        *records("pages", page("b", T0, "p0"), partition=0, first_offset=5),
    ]
    events = views((T0 + MIN, "a"), (T0 + MIN, "b"))
    assert sections(compute(config(BY_SECTION), table + events)) == {("later",): 1, ("p1",): 1}


def test_deleted_flag_deletes_the_key_from_its_time_on() -> None:
    table = records(
        "pages",
        page("a", T0, "news"),
        page("a", T0 + 10 * MIN, "gone", deleted=True),  # its other fields are never read
        page("a", T0 + 20 * MIN, "sport"),
        page("b", T0, "news"),
        page("b", T0 + 10 * MIN, "still", deleted="true"),  # only JSON true deletes
        page("c", T0, "news"),
        page("c", T0 + 10 * MIN, "also", deleted=1),
    )
    events = views(
        (T0 + 5 * MIN, "a"),  # news
        (T0 + 15 * MIN, "a"),  # deleted: missing
        (T0 + 25 * MIN, "a"),  # sport: a later version brings the key back
        (T0 + 15 * MIN, "b"),
        (T0 + 15 * MIN, "c"),
    )
    result = compute(config(BY_SECTION), table + events)
    assert sections(result) == {("news",): 1, ("sport",): 1, ("still",): 1, ("also",): 1}
    assert result.skipped == {"by_section": 1}


def test_a_tombstone_deletes_its_record_key_from_its_timestamp_on() -> None:
    by_tier = metric(
        "by_tier", lookups=[{"table": "users", "on": "user", "as": "u"}], key=["u.tier"]
    )
    table = [
        Record("users", 0, 0, T0, json.dumps({"uid": "x", "tier": "gold"}).encode()),
        Record("users", 0, 1, T0 + 10 * MIN, None, b"x"),  # tombstone
        Record("users", 0, 2, T0 + 20 * MIN, json.dumps({"uid": "x", "tier": "free"}).encode()),
        Record("users", 0, 3, T0, json.dumps({"uid": 9, "tier": "gold"}).encode()),
        Record("users", 0, 4, T0 + 10 * MIN, None, b"9"),  # the text of the integer key 9
    ]
    events = records(
        "pv",
        {"ts": T0 + 5 * MIN, "user": "x"},  # gold
        {"ts": T0 + 15 * MIN, "user": "x"},  # deleted
        {"ts": T0 + 25 * MIN, "user": "x"},  # free
        {"ts": T0 + 5 * MIN, "user": 9},  # gold
        {"ts": T0 + 15 * MIN, "user": 9},  # deleted
    )
    result = compute(config(by_tier), events + table)
    assert sections(result, "by_tier") == {("gold",): 2, ("free",): 1}
    assert result.skipped == {"by_tier": 2}
    assert result.table_malformed == {}


def test_a_key_absent_from_the_table_is_a_left_join_miss() -> None:
    with_default = metric(
        "with_default",
        fields={"section": "COALESCE(p.section, 'none')"},
        key=["section"],
    )
    table = records("pages", page("a", T0, "news"), page("b", T0, None))  # b: no section
    events = views((T0 + MIN, "a"), (T0 + MIN, "zzz"), (T0 + MIN, "b"), (T0 + MIN, None))
    result = compute(config(BY_SECTION, with_default), table + events)
    # a raw `p.section` is missing: the event is skipped
    assert sections(result) == {("news",): 1}
    assert result.skipped["by_section"] == 3
    # an expression reads NULL
    assert sections(result, "with_default") == {("news",): 1, ("none",): 3}
    assert result.skipped["with_default"] == 0


def test_join_keys_are_compared_by_their_text() -> None:
    table = records(
        "pages",
        page("7", T0, "seven"),  # a string key "7"
        page(8, T0, "eight"),  # an integer key 8
        page(True, T0, "bool"),  # no key at all: invalid
    )
    events = views(
        (T0 + MIN, 7),  # BIGINT 7 -> "7"
        (T0 + MIN, "8"),  # STRING "8"
        (T0 + MIN, 7.0),  # DOUBLE: matches nothing
        (T0 + MIN, 8.5),
        (T0 + MIN, True),  # BOOLEAN: matches nothing
        (T0 + MIN, "07"),  # another text than "7"
    )
    result = compute(config(BY_SECTION), table + events)
    assert sections(result) == {("seven",): 1, ("eight",): 1}
    assert result.skipped == {"by_section": 4}
    assert result.table_malformed == {"pages": 1}


def test_on_may_be_an_expression_of_the_event() -> None:
    lowered = metric("lowered", lookups=[{"table": "pages", "on": "lower(page)", "as": "p"}])
    numbered = metric(
        "numbered", lookups=[{"table": "pages", "on": "CAST(n + 1 AS STRING)", "as": "p"}]
    )
    table = records("pages", page("home", T0, "main"), page("3", T0, "three"))
    events = records(
        "pv",
        {"ts": T0 + MIN, "page": "HOME", "n": 2},
        {"ts": T0 + MIN, "page": "Home", "n": 2.0},  # n + 1 is a DOUBLE: no text
        {"ts": T0 + MIN, "page": "Höme", "n": "2"},  # only ASCII letters are lowered
    )
    result = compute(config(lowered, numbered), table + events)
    assert sections(result, "lowered") == {("main",): 2}
    assert sections(result, "numbered") == {("three",): 1}
    assert result.skipped == {"lowered": 1, "numbered": 2}


def test_nested_table_paths_and_values_read_the_joined_version() -> None:
    by_city = metric(
        "by_city",
        key=["p.geo.city"],
        value="p.weight",
        aggregations=["count", "sum", "distinct(p.editor)"],
    )
    table = records(
        "pages",
        page("a", T0, geo={"city": "Berlin"}, weight=2, editor="ann"),
        page("b", T0, geo={"city": "Berlin"}, weight=3, editor="bob"),
        page("c", T0, geo="Berlin", weight=4, editor="cy"),  # a step through a non-object
        page("d", T0, geo={"city": "Paris"}, weight="5", editor="dan"),  # not a number
    )
    events = views(*((T0 + MIN, name) for name in "aabcd"))
    result = compute(config(by_city), table + events)
    assert result.cells == {
        ("by_city", HOUR, T0, ("Berlin",)): {"count": 3, "sum": 7.0, "distinct_p.editor": 2}
    }
    assert result.skipped == {"by_city": 2}


def test_fields_and_where_read_lookups_and_a_lookup_hides_an_event_field() -> None:
    news_only = metric(
        "news_only",
        where="p.section = 'news'",
        fields={"tag": "upper(p.section)"},
        key=["tag"],
    )
    table = records("pages", page("a", T0, "news"), page("b", T0, "sport"))
    events = records(
        "pv",
        {"ts": T0 + MIN, "page": "a", "p": {"section": "own"}},  # hidden by the lookup
        {"ts": T0 + MIN, "page": "b"},  # dropped by `where`
        {"ts": T0 + MIN, "page": "zzz", "p": {"section": "own"}},  # no match: p is absent
    )
    result = compute(config(BY_SECTION, news_only), table + events)
    assert sections(result) == {("news",): 1, ("sport",): 1}
    assert result.skipped["by_section"] == 1
    assert sections(result, "news_only") == {("NEWS",): 1}
    assert result.skipped["news_only"] == 0


def test_two_lookups_each_join_on_the_event_itself() -> None:
    both = metric(
        "both",
        lookups=[
            {"table": "pages", "on": "page", "as": "p"},
            {"table": "users", "on": "user", "as": "u"},
        ],
        key=["p.section", "u.tier"],
    )
    table = [
        *records("pages", page("a", T0, "news")),
        Record("users", 0, 0, T0 + 10 * MIN, json.dumps({"uid": "x", "tier": "gold"}).encode()),
    ]
    events = records(
        "pv",
        {"ts": T0 + 5 * MIN, "page": "a", "user": "x"},  # before x's first version
        {"ts": T0 + 15 * MIN, "page": "a", "user": "x"},
    )
    result = compute(config(both), table + events)
    assert sections(result, "both") == {("news", "gold"): 1}
    assert result.skipped == {"both": 1}


def test_invalid_table_records_are_counted_and_join_nothing() -> None:
    bad = [
        b"not json",
        b"[1, 2]",
        b'{"page": "a", "valid_from": NaN, "section": "x"}',
        page(None, T0, "null key"),
        {"valid_from": T0, "section": "no key field"},
        page(1.5, T0, "double key"),
        page("a\u0000b", T0, "nul"),
        page("x" * 1025, T0, "too long"),
        {"page": "a", "section": "no time"},
        page("a", "yesterday", "bad time"),
        page("a", "2024-01-01T00:00:00", "no offset"),
        page("a", 253_402_300_800_000, "year 10000"),
        page("a", True, "bool time"),
    ]
    table = [
        *records("pages", *bad),
        Record("pages", 0, 100, T0, None),  # a tombstone without a key
        Record("pages", 0, 101, T0, None, b"\xff"),  # a key that is not UTF-8
        *records("pages", page("x" * 1024, T0, "long but fine"), first_offset=200),
    ]
    events = views((T0 + MIN, "a"), (T0 + MIN, "a\u0000b"), (T0 + MIN, "x" * 1024))
    result = compute(config(BY_SECTION), events + table)
    assert result.table_malformed == {"pages": len(bad) + 2}
    assert result.malformed == {}
    assert sections(result) == {("long but fine",): 1}
    assert result.skipped == {"by_section": 2}


def test_a_tombstone_in_a_timed_table_is_valid_from_its_timestamp() -> None:
    table = [
        *records("pages", page("a", T0, "news")),
        Record("pages", 0, 1, T0 + 10 * MIN, None, b"a"),
    ]
    events = views((T0 + 5 * MIN, "a"), (T0 + 15 * MIN, "a"))
    result = compute(config(BY_SECTION), table + events)
    assert sections(result) == {("news",): 1}
    assert result.skipped == {"by_section": 1}


def test_without_table_records_every_lookup_misses() -> None:
    with_default = metric("with_default", fields={"s": "COALESCE(p.section, 'none')"}, key=["s"])
    cells = compute_cells(config(BY_SECTION, with_default), views((T0, "a")))
    assert cells == {
        ("with_default", HOUR, T0, ("none",)): {"count": 1},
    }


def test_record_key_is_optional_and_last() -> None:
    record = Record("pv", 0, 1, T0, b"{}")
    assert record.key is None
    assert Record("pv", 0, 1, T0, None, b"k").key == b"k"


def test_a_lookup_of_an_unknown_table_is_refused() -> None:
    unknown = metric("unknown", lookups=[{"table": "nope", "on": "page", "as": "p"}])
    with pytest.raises(ValueError, match="nope"):
        compute(config(unknown), [])
