"""Lookup tables (rule 11 in docs/semantics.md) as pure logic: a table record's validity, the
as-of join `TableVersions` answers (against a brute force, in any arrival order, before and
after pruning), the speed layer's metric inputs against the oracle, and config errors."""

from __future__ import annotations

from collections import Counter
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shared.config import Settings, TableConfig
from shared.events import Malformed, Skipped, metric_inputs
from shared.tables import TableRecord, TableVersions, parse_table_record
from tests import oracle

TABLE = TableConfig(name="pages", topic="pages", key_field="page", time_field="from")
NOW = 1_780_000_000_000


def _parse(value: object, key: bytes | None = None, table: TableConfig = TABLE) -> object:
    encoded = value if value is None or isinstance(value, bytes) else orjson.dumps(value)
    return parse_table_record(key, encoded, NOW, table)


@pytest.mark.parametrize(
    ("value", "key", "expected"),
    [
        (
            {"page": "/a", "from": 5, "s": 1},
            None,
            TableRecord("/a", 5, {"page": "/a", "from": 5, "s": 1}),
        ),
        (
            {"page": 7, "from": "2026-01-01T00:00:00Z"},
            None,
            TableRecord("7", 1_767_225_600_000, {"page": 7, "from": "2026-01-01T00:00:00Z"}),
        ),
        ({"page": "/a", "from": 5, "deleted": True}, None, TableRecord("/a", 5, None)),
        (None, b"/a", TableRecord("/a", NOW, None)),
        (None, None, "key_missing"),
        (None, b"\xff", "key_missing"),
        (b"nope", None, "not_json"),
        ([1], None, "not_object"),
        ({"from": 5}, None, "key_missing"),
        ({"page": None, "from": 5}, None, "key_invalid"),
        ({"page": 1.5, "from": 5}, None, "key_invalid"),
        ({"page": True, "from": 5}, None, "key_invalid"),
        ({"page": "a\x00b", "from": 5}, None, "key_invalid"),
        ({"page": "x" * 1025, "from": 5}, None, "key_too_long"),
        ({"page": "/a"}, None, "time_missing"),
        ({"page": "/a", "from": "yesterday"}, None, "time_invalid"),
        ({"page": "/a", "from": 10**17}, None, "time_invalid"),
    ],
)
def test_a_table_records_validity(value: Any, key: bytes | None, expected: object) -> None:
    parsed = _parse(value, key)
    if isinstance(expected, str):
        assert isinstance(parsed, Malformed) and parsed.reason == expected, parsed
    else:
        assert parsed == expected
    flagged = {"page": "/a", "from": 5, "deleted": "true"}
    assert _parse(flagged) == TableRecord("/a", 5, flagged), "only JSON true deletes"


def test_without_a_time_field_a_version_is_valid_from_its_timestamp() -> None:
    table = TableConfig(name="t", topic="t", key_field="page")
    assert _parse({"page": "/a"}, table=table) == TableRecord("/a", NOW, {"page": "/a"})


versions = st.lists(
    st.tuples(
        st.sampled_from(["a", "b", "c"]),
        st.integers(0, 20),  # valid from
        st.integers(0, 1),  # partition
        st.booleans(),  # deletes the key
    ),
    max_size=25,
)


def _brute_force(records: list[tuple[str, int, int, int, bool]], key: str, t: int) -> object:
    """The version of `key` valid at `t`: greatest (valid from, offset, partition) <= t."""
    valid = [r for r in records if r[0] == key and r[1] <= t]
    if not valid:
        return None
    _, start, offset, partition, deleted = max(valid, key=lambda r: (r[1], r[2], r[3]))
    return None if deleted else {"v": (start, offset, partition)}


@settings(max_examples=300, deadline=None)
@given(drawn=versions, order=st.randoms(use_true_random=False), w=st.integers(0, 22))
def test_the_as_of_join_is_the_rule_in_any_arrival_order(
    drawn: list[tuple[str, int, int, bool]], order: Any, w: int
) -> None:
    records = [
        (k, start, offset, p, deleted) for offset, (k, start, p, deleted) in enumerate(drawn)
    ]
    table = TableVersions()
    arrival = list(records)
    order.shuffle(arrival)
    for key, start, offset, partition, deleted in arrival:
        fields = None if deleted else {"v": (start, offset, partition)}
        table.add(TableRecord(key, start, fields), partition, offset)
    for key in "abcd":
        for t in range(-1, 23):
            assert table.as_of(key, t) == _brute_force(records, key, t), (key, t)
    for _ in range(len(records) + 1):  # a few keys a call, as the worker prunes
        table.prune(w, keys=2)
    assert len(table) == sum(len(v) for v in table._versions.values())
    for key in "abcd":
        for t in range(w, 23):
            assert table.as_of(key, t) == _brute_force(records, key, t), ("pruned", key, t)
    assert table.as_of(None, 5) is None


CONFIG: dict[str, Any] = {
    "sources": [{"name": "pv", "topic": "pv", "time_field": "ts", "id_field": "id"}],
    "tables": [{"name": "pages", "topic": "pages", "key_field": "page", "time_field": "from"}],
    "metrics": [
        {
            "name": "by_section",
            "source": "pv",
            "lookups": [{"table": "pages", "on": "page", "as": "p"}],
            "fields": {"section": "COALESCE(p.section, 'none')"},
            "key": ["section", "p.meta.team"],
            "aggregations": ["count"],
            "windows": ["1m"],
        }
    ],
}


@settings(max_examples=100, deadline=None)
@given(
    table=st.lists(
        st.tuples(
            st.sampled_from(["/a", "/b", 7]),
            st.integers(0, 10),
            st.sampled_from(["news", "sport", None]),
            st.sampled_from(["x", 7, None, "drop"]),
            st.booleans(),
        ),
        max_size=12,
    ),
    events=st.lists(
        st.tuples(st.sampled_from(["/a", "/b", "/c", 7, "7", 7.0]), st.integers(0, 12)),
        max_size=20,
    ),
)
def test_the_speed_layers_inputs_join_as_the_oracle(
    table: list[tuple[Any, int, Any, Any, bool]], events: list[tuple[Any, int]]
) -> None:
    settings_ = Settings(**CONFIG)
    plan = settings_.plan("by_section")
    assert plan is not None
    records, versions = [], TableVersions()
    for offset, (page, start, section, team, deleted) in enumerate(table):
        value: dict[str, Any] = {"page": page, "from": NOW + start * 60_000}
        if section is not None:
            value["section"] = section
        if team != "drop":
            value["meta"] = {"team": team}
        if deleted:
            value["deleted"] = True
        raw = orjson.dumps(value)
        records.append(oracle.Record("pages", 0, offset, NOW, raw))
        parsed = parse_table_record(None, raw, NOW, settings_.tables[0])
        assert isinstance(parsed, TableRecord)
        versions.add(parsed, 0, offset)
    fields = []
    for i, (page, minute) in enumerate(events):
        event = {"id": f"e{i}", "ts": NOW + minute * 60_000, "page": page}
        fields.append(event)
        records.append(oracle.Record("pv", 0, i, NOW + 10**8, orjson.dumps(event)))
    got: Counter[tuple[int, tuple[str, ...]]] = Counter()
    skipped = 0
    times = [f["ts"] for f in fields]
    for f, result in zip(
        fields, metric_inputs(fields, plan, times, {"pages": versions.as_of}), strict=True
    ):
        if isinstance(result, Skipped):
            skipped += 1
        else:
            got[(f["ts"] - f["ts"] % 60_000, result[0])] += 1  # type: ignore[index]
    expected = oracle.compute(CONFIG, records)
    assert got == Counter({(c[2], c[3]): v["count"] for c, v in expected.cells.items()})
    assert skipped == expected.skipped["by_section"]


def _config_error(**metric: Any) -> str:
    config = {**CONFIG, "metrics": [{**CONFIG["metrics"][0], **metric}]}
    with pytest.raises(ValueError) as raised:
        Settings(**config)
    return str(raised.value)


@pytest.mark.parametrize(
    ("metric", "message"),
    [
        ({"lookups": [{"table": "nope", "on": "page", "as": "p"}]}, "names table 'nope'"),
        ({"lookups": [{"table": "pages", "on": "section", "as": "p"}]}, "`on` reads 'section'"),
        ({"lookups": [{"table": "pages", "on": "p.x", "as": "p"}]}, "`on` reads 'p.x'"),
        ({"lookups": [{"table": "pages", "on": "page +", "as": "p"}]}, "on"),
        ({"fields": {"p": "1"}, "key": ["p"]}, "has the name of a computed field"),
        ({"key": ["p"]}, "'p' is a lookup; read its fields as p.<field>"),
        (
            {"fields": {"h": "hour(p.at, 'Europe/Berlin')"}, "key": ["h"]},
            "a date part with a zone reads the time field or an event field",
        ),
        (
            {
                "lookups": [
                    {"table": "pages", "on": "page", "as": "p"},
                    {"table": "pages", "on": "page", "as": "p"},
                ]
            },
            "must be distinct",
        ),
    ],
)
def test_a_lookup_that_cannot_work_is_refused_at_load(metric: dict[str, Any], message: str) -> None:
    assert message in _config_error(**metric)


def test_equal_versions_share_one_dict_and_only_equal_ones() -> None:
    """A table's millions of versions mostly repeat a few values: equal projected fields are
    kept once (memory: bench/tables.py), but values that only compare equal stay apart."""
    table = TableVersions()
    values: list[Any] = ["news", "news", 1, 1.0, True, 0.0, -0.0, {"team": "a"}, {"team": "a"}]
    for offset, value in enumerate(values):
        table.add(TableRecord(f"k{offset}", NOW, {"section": value}), 0, offset)
    found = [table.as_of(f"k{offset}", NOW) for offset in range(len(values))]
    joined = [fields for fields in found if fields is not None]
    assert joined == [{"section": value} for value in values]
    assert joined[0] is joined[1]  # the same string: one dict
    distinct = joined[2:7]  # 1, 1.0, True, 0.0 and -0.0: each its own, with its own type
    assert len({id(fields) for fields in distinct}) == 5
    assert [repr(fields["section"]) for fields in distinct] == ["1", "1.0", "True", "0.0", "-0.0"]
    assert joined[7] is not joined[8]  # an object: kept as it is
