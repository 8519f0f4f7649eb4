"""Metrics with `where` and `fields` (rule 10 in docs/semantics.md), as the speed layer reads
them (`shared.events.metric_inputs`), and how the config refuses a bad expression."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from shared.config import MetricConfig, Settings, SourceConfig
from shared.events import FILTERED, MetricInput, Skipped, metric_input, parse_record
from shared.expressions.parse import ExpressionError, parse_tree
from shared.metric_plan import MetricPlan, compile_plan

T0 = 1_704_067_200_000  # 2024-01-01T00:00:00Z (a Monday)
SOURCE = SourceConfig(name="orders", topic="orders", time_field="ts", id_field="id")


def plan(**definition: Any) -> MetricPlan:
    return compile_plan(
        MetricConfig(name="m", source="orders", windows=("1m",), **definition), SOURCE
    )


PAID = plan(
    fields={
        "cents": "CAST(amount * 100 AS BIGINT)",
        "bucket": "CASE WHEN latency_ms < 100 THEN 'fast' ELSE 'slow' END",
        "local_hour": "hour(ts, 'Europe/Berlin')",
    },
    where="status = 'paid' AND amount > 0",
    key=("geo.country", "bucket", "local_hour"),
    value="cents",
    aggregations=("count", "sum", "distinct(user)", "quantiles(latency_ms)"),
)


def read(metric: MetricPlan, **fields: Any) -> MetricInput | Skipped | object:
    event = {"id": "e1", "ts": T0, **fields}
    parsed = parse_record(json.dumps(event).encode(), T0, SOURCE)
    assert not isinstance(parsed, tuple) or not hasattr(parsed, "reason"), parsed
    return metric_input(parsed, metric)  # type: ignore[arg-type]


ORDER = {
    "status": "paid",
    "amount": 12.5,
    "latency_ms": 42,
    "geo": {"country": "DE"},
    "user": "u1",
}


def test_a_filtered_metric_reads_computed_key_and_value() -> None:
    assert read(PAID, **ORDER) == MetricInput(("DE", "fast", "1"), 1250.0, ("u1", 42.0))


@pytest.mark.parametrize(
    "change",
    [
        {"status": "open"},  # FALSE
        {"status": None},  # NULL: not TRUE either
        {"amount": "12.5"},  # text is not a number: the comparison is NULL
        {"amount": 0},
    ],
)
def test_an_event_where_does_not_select_is_filtered_not_skipped(change: dict[str, Any]) -> None:
    assert read(PAID, **{**ORDER, **change}) is FILTERED


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        ({"geo": {}}, "key_missing"),  # a raw nested dimension the event lacks
        ({"geo": "DE"}, "key_missing"),  # a path through a non-object finds nothing
        ({"geo": {"country": None}}, "key_invalid"),  # present but null: as a raw field
        ({"geo": {"country": 2**70}}, None),  # a raw integer dimension keeps all its digits
        ({"geo": {"country": "D\x00E"}}, "key_invalid"),
        ({"amount": 1e17}, "value_missing"),  # amount * 100 overflows a BIGINT cast: NULL
        ({"latency_ms": True}, "quantile_invalid"),
        ({"user": 1.5}, "distinct_invalid"),
    ],
)
def test_inputs_are_checked_as_raw_fields_are(change: dict[str, Any], reason: str | None) -> None:
    result = read(PAID, **{**ORDER, **change})
    if reason is None:
        assert isinstance(result, MetricInput), result
        assert result.key[0] == str(2**70)
    else:
        assert result == Skipped(reason)


KEYED = plan(
    fields={
        "size": "CASE WHEN x > 1 THEN 'big' WHEN x >= 0 THEN 'small' END",
        "flag": "x > 1",
        "half": "x / 2",
        "big": "x * 1e18",
    },
    key=("size",),
    value="big",
)


@pytest.mark.parametrize(
    ("x", "expected"),
    [
        (3, MetricInput(("big",), 3e18, ())),
        (-1, Skipped("key_missing")),  # no branch: the computed dimension is NULL
        ("3", Skipped("key_missing")),  # text compared with a number: NULL
        (10, Skipped("value_out_of_range")),  # 1e19 is not below 2^63
    ],
)
def test_a_null_computed_input_is_missing(x: Any, expected: object) -> None:
    assert read(KEYED, x=x) == expected


@pytest.mark.parametrize(
    ("key", "reason"), [(("flag",), "key_invalid"), (("half",), "key_invalid")]
)
def test_a_boolean_or_double_has_no_key_text(key: tuple[str, ...], reason: str) -> None:
    metric = plan(fields={"flag": "x > 1", "half": "x / 2"}, key=key)
    assert read(metric, x=3) == Skipped(reason)


def test_a_computed_key_over_the_store_limit_is_too_long() -> None:
    metric = plan(fields={"long": "substr(s, 1, 2000)"}, key=("long",))
    assert read(metric, s="é" * 600) == Skipped("key_too_long")
    assert read(metric, s="é" * 500) == MetricInput(("é" * 500,), None, ())


def test_the_time_field_is_the_event_time_in_expressions() -> None:
    metric = plan(
        fields={"day": "date(ts, 'America/New_York')", "dow": "day_of_week(ts)"},
        key=("day", "dow"),
    )
    assert read(metric) == MetricInput(("2023-12-31", "1"), None, ())
    rfc = {"id": "e1", "ts": "2024-01-01T00:00:00Z"}
    parsed = parse_record(json.dumps(rfc).encode(), T0, SOURCE)
    assert metric_input(parsed, metric) == MetricInput(("2023-12-31", "1"), None, ())  # type: ignore[arg-type]


def test_where_and_fields_are_part_of_the_version() -> None:
    bare = plan(key=("page",))
    assert plan(key=("page",), where="x > 1").version != bare.version
    assert plan(key=("page",), fields={"y": "x + 1"}).version != bare.version
    assert plan(key=("page",), where="x > 1").version != plan(key=("page",), where="x > 2").version
    assert bare.definitions is None
    assert plan(key=("geo.country",)).definitions is not None


def _settings(tmp_path: Path, metric: dict[str, Any]) -> Settings:
    config = {
        "sources": [{"name": "orders", "topic": "orders", "time_field": "ts"}],
        "metrics": [{"name": "m", "source": "orders", "windows": ["1m"], **metric}],
    }
    return Settings(**config)


@pytest.mark.parametrize(
    ("metric", "message"),
    [
        ({"where": "amount >"}, "where: incomplete expression: expected a value after '>'"),
        ({"where": "amount * 'x' > 1"}, "column 10"),
        ({"where": "amount + 1"}, "must be a condition"),
        ({"fields": {"a": "lower(5)"}}, "fields.a: lower takes STRING"),
        ({"fields": {"a": "b", "b": "a"}}, "cycle (a -> b -> a)"),
        ({"fields": {"a": "hour(ts, 'Mars/Olympus')"}}, "unknown time zone"),
        ({"fields": {"a": "hour(ts, 'localtime')"}}, "unknown time zone"),  # the host's
        ({"fields": {"a": "hour(ts, 'right/UTC')"}}, "unknown time zone"),  # leap seconds
        ({"fields": {"a": "'\ud800'"}}, "not Unicode text"),
        ({"fields": {"a": "frobnicate(x)"}}, "unknown function 'frobnicate'"),
        ({"fields": {"a": "x LIKE y"}}, "pattern must be a string literal"),
        ({"fields": {"a": "CAST(1.5 AS STRING)"}}, "a DOUBLE has no text"),
        ({"fields": {"ts": "1"}}, "the source's time field already has that name"),
        ({"fields": {"a b": "1"}}, "computed field name 'a b'"),
        ({"fields": {"window": "1"}}, "not a query parameter"),
        ({"fields": {"a": "lower(ts)"}}, "lower takes STRING, but 'ts' is BIGINT"),
        ({"fields": {"a": 5}}, "write the expression as text"),
        ({"where": "x = 1; DROP TABLE batch_cells"}, "one expression"),
        ({"where": "(SELECT 1) = 1"}, "not part of the expression language"),
        ({"where": "x" * 5000}, "longer than 4096 characters"),
        ({"where": "(" * 100 + "x" + ")" * 100}, "nested deeper than 64 levels"),
    ],
)
def test_a_bad_expression_is_refused_with_where_it_is(
    tmp_path: Path, metric: dict[str, Any], message: str
) -> None:
    with pytest.raises(ValueError) as error:
        _settings(tmp_path, metric)
    assert message in str(error.value)


def test_the_order_of_computed_fields_changes_nothing() -> None:
    one = plan(fields={"a": "x + 1", "b": "a * 2"}, key=("b",))
    two = plan(fields={"b": "a * 2", "a": "x + 1"}, key=("b",))
    assert one.version == two.version and one.config == two.config


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("dep_delay >", "expected a value after '>' at line 1, column 11"),
        ("a = 1 AND", "expected a value after 'AND'"),
        ("NOT", "expected a value after 'NOT'"),
        ("(a + 1", "a '(' is not closed: expected ')'"),
        ("a + 1)", "or a ')' is one too many"),
        ("1 2", "two values need an operator between them"),
        ("CASE WHEN a THEN 1", "write CASE WHEN <condition> THEN <value> [ELSE <value>] END"),
        ("a BETWEEN 1", "write <value> BETWEEN <low> AND <high>"),
        ("CAST(a AS)", "write CAST(<value> AS BIGINT|DOUBLE|STRING|BOOLEAN)"),
        ("lower(", "an argument is missing"),
        ("geo.", "expected a name after '.'"),
        ("'abc", "a string is not closed: expected a closing '"),
        ('"abc', 'a quoted field name is not closed: expected a closing "'),
    ],
)
def test_a_broken_expression_says_what_to_write_not_the_parsers_internals(
    text: str, says: str
) -> None:
    with pytest.raises(ExpressionError) as caught:
        parse_tree(text)
    message = str(caught.value)
    assert says in message
    for internal in ("<class", "sqlglot", "Required keyword", "Error tokenizing"):
        assert internal not in message
