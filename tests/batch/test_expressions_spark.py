"""The Spark compilation of expressions (`batch_layer.expressions`) answers exactly what the
Python evaluator (`shared.expressions.evaluate`, the reference) answers, on every event.

Results are compared as (kind, value): Python's `True == 1` and `0.0 == -0.0` would hide a
wrong kind or sign, so a DOUBLE is compared by its bits (`float.hex`), -0.0 included: both
engines keep IEEE's signed zero the same way (`0.0 * -1` is -0.0, `-0.0 + 0.0` is 0.0, `abs`
and `round` give 0.0), so no case needs leniency. `is_true` of each value (what a `where`
selects) is compared too. Spark work is batched: one DataFrame and one `collect` evaluate a
whole batch of (expression, event) pairs.

Random expressions catch mistakes in how operators compose (kinds, NULLs, CASE and COALESCE
across kinds, computed fields, stages); an operator's edge values are too rare among random
events to be found reliably, so `EDGE_CASES` names them.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import (
    BooleanType,
    DoubleType,
    LongType,
    StringType,
    StructField,
    StructType,
)

from batch_layer.expressions import SparkValue, Stages, compile_value, is_true
from shared.expressions import (
    Definitions,
    Scalar,
    compile_definitions,
    compile_node,
    from_json,
    read_path,
    split_path,
)
from shared.expressions.evaluate import zone_offset_ms
from shared.expressions.syntax import Call, EventTime, Field, Kind, walk
from tests.batch.helpers import spark_conf
from tests.expression_strategies import FIELDS, TIME_FIELD, events, expressions, expressions_over

pytestmark = [pytest.mark.services, pytest.mark.timeout(300)]

Event = tuple[dict[str, Any], int]
_SPARK_TYPES = {
    Kind.BOOLEAN: BooleanType(),
    Kind.BIGINT: LongType(),
    Kind.DOUBLE: DoubleType(),
    Kind.STRING: StringType(),
}
_PYTHON_TYPES = {bool: Kind.BOOLEAN, int: Kind.BIGINT, float: Kind.DOUBLE, str: Kind.STRING}


def _typed(value: Scalar) -> tuple[str, Any]:
    """A value as a comparable (kind, value) pair; a DOUBLE by its bits."""
    if value is None:
        return ("NULL", None)
    if isinstance(value, float):
        return ("DOUBLE", value.hex())
    return (_PYTHON_TYPES[type(value)].value, value)


class _Inputs:
    """The events of a batch as the batch layer's data source gives them to the compiled
    expressions: each raw path's value as the evaluator reads it (`from_json`), one column
    per kind, the time, and the offset of each (instant, zone) a date part reads (from
    `zone_offset_ms`, as the data source computes it beside the event)."""

    def __init__(self, definitions: Sequence[Definitions]) -> None:
        nodes = [n for d in definitions for _, tree in d.fields for n in walk(tree)]
        self.paths = sorted(
            {split_path(f) for f in FIELDS} | {n.path for n in nodes if isinstance(n, Field)}
        )
        zoned: set[tuple[Field | EventTime, str]] = set()
        for n in nodes:
            if isinstance(n, Call) and n.zone is not None:
                instant = n.args[0]
                assert isinstance(instant, Field | EventTime), "the parser allows only these"
                zoned.add((instant, n.zone))
        self.zoned = sorted(zoned, key=repr)
        self.raw = {p: SparkValue(*(F.col(self._column(p, k)) for k in Kind)) for p in self.paths}

    @staticmethod
    def _column(path: tuple[str, ...], kind: Kind) -> str:
        return f"raw_{'_'.join(path)}_{kind.value}"

    def offset(self, instant: Field | EventTime, zone: str) -> Column:
        return F.col(f"offset{self.zoned.index((instant, zone))}")

    def frame(self, spark: SparkSession, batch: Sequence[Event]) -> DataFrame:
        fields = [StructField("row", LongType()), StructField("time_ms", LongType())]
        fields += [
            StructField(self._column(p, k), _SPARK_TYPES[k]) for p in self.paths for k in Kind
        ]
        fields += [StructField(f"offset{i}", LongType()) for i in range(len(self.zoned))]
        rows = []
        for index, (event, time_ms) in enumerate(batch):
            row: list[Any] = [index, time_ms]
            for path in self.paths:
                value = from_json(read_path(event, path))
                row += [
                    value if value is not None and _PYTHON_TYPES[type(value)] is k else None
                    for k in Kind
                ]
            for instant, zone in self.zoned:
                at = (
                    time_ms
                    if isinstance(instant, EventTime)
                    else from_json(read_path(event, instant.path))
                )
                row.append(zone_offset_ms(at, zone))
            rows.append(row)
        return spark.createDataFrame(rows, StructType(fields))


def _from_parts(parts: Sequence[Any]) -> Scalar:
    """The value of one row's parts; more than one non-null part is a compilation bug."""
    present = [p for p in parts if p is not None]
    assert len(present) <= 1, f"several kinds at once: {parts}"
    return present[0] if present else None


@dataclass(frozen=True)
class _Result:
    name: str
    value: Scalar
    selected: bool
    """`is_true` of the value (what a `where` of it selects)."""


def evaluate_in_spark(
    spark: SparkSession, definitions: Sequence[Definitions], batch: Sequence[Event]
) -> list[list[list[_Result]]]:
    """[definitions][event][field]: every field of every definition on every event, in one
    DataFrame and one collect. (Every Column operation is a dozen Py4J round trips, so the
    outputs are read by position, and a part that is statically NULL is not selected.)"""
    inputs = _Inputs(definitions)
    stages = Stages()
    time_ms = F.col("time_ms")
    outputs: list[Column] = [F.col("row")]
    read: list[list[tuple[str, dict[Kind, int], int]]] = []
    for d in definitions:
        computed: dict[str, SparkValue] = {}
        fields = []
        for name, node in d.fields:
            value = compile_value(
                node, inputs.raw.__getitem__, computed.__getitem__, time_ms, inputs.offset, stages
            )
            computed[name] = value
            positions = {}
            for kind in Kind:
                part = value.part(kind)
                if part is not None:
                    positions[kind] = len(outputs)
                    outputs.append(part)
            fields.append((name, positions, len(outputs)))
            outputs.append(is_true(value))
        read.append(fields)
    frame = stages.apply(inputs.frame(spark, batch))
    rows = sorted(frame.select(*outputs).collect(), key=lambda r: int(r[0]))
    return [
        [
            [
                _Result(name, _from_parts([row[i] for i in positions.values()]), row[where])
                for name, positions, where in fields
            ]
            for row in rows
        ]
        for fields in read
    ]


def evaluate_in_python(definitions: Definitions, batch: Sequence[Event]) -> list[list[_Result]]:
    """[event][field], by the reference evaluator."""
    compiled = [(name, compile_node(node)) for name, node in definitions.fields]
    results = []
    for fields, time_ms in batch:
        computed: dict[str, Scalar] = {}
        for name, evaluate in compiled:
            computed[name] = evaluate(fields, time_ms, computed)
        results.append(
            [_Result(name, computed[name], computed[name] is True) for name, _ in compiled]
        )
    return results


def assert_same(
    spark: SparkSession,
    texts: Sequence[Mapping[str, str]],
    batch: Sequence[Event],
) -> int:
    """Every field of every definition (`texts`: name -> expression) the same in both engines
    on every event; the number of definitions that load (refused ones are skipped)."""
    loaded: list[tuple[Mapping[str, str], Definitions]] = []
    for fields in texts:
        try:
            loaded.append((fields, compile_definitions(None, fields, TIME_FIELD)))
        except ValueError:
            continue
    if not loaded:
        return 0
    spark_results = evaluate_in_spark(spark, [d for _, d in loaded], batch)
    mismatches: dict[str, list[str]] = {}
    for (fields, d), per_event in zip(loaded, spark_results, strict=True):
        expected = evaluate_in_python(d, batch)
        for event, wants, got in zip(batch, expected, per_event, strict=True):
            for want, have in zip(wants, got, strict=True):
                if (_typed(want.value), want.selected) != (_typed(have.value), have.selected):
                    mismatches.setdefault(str(dict(fields)), []).append(
                        f"on {json.dumps(event[0])} at {event[1]}: {want.name} is "
                        f"{_typed(want.value)} in Python, {_typed(have.value)} in Spark "
                        f"(selected: {want.selected} in Python, {have.selected} in Spark)"
                    )
    report = [
        f"{text}: {len(found)} events, first {found[0]}" for text, found in mismatches.items()
    ]
    assert not report, f"{len(report)} expressions differ:\n" + "\n".join(report[:20])
    return len(loaded)


# ---------------------------------------------------------------------------------------------
# The property: random expressions (a computed field `c` and a field `v` that may read it) on
# random events.

_DEFINITIONS = st.fixed_dictionaries({"c": expressions, "v": expressions_over((*FIELDS, "c"))})


@settings(
    max_examples=4,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
    phases=[Phase.explicit, Phase.reuse, Phase.generate],
)
@given(data=st.data())
def test_spark_matches_python(spark: SparkSession, data: st.DataObject) -> None:
    """Each example is a batch: 40 definitions (80 expressions) on 150 events, one Spark job
    (a Spark job costs seconds, an evaluation nothing, so the examples are few and large).
    No shrinking: a failure already names each expression that differs and its first event,
    and shrinking a batch would take a Spark job per step."""
    texts = data.draw(st.lists(_DEFINITIONS, min_size=40, max_size=40), label="definitions")
    batch = data.draw(st.lists(events(), min_size=150, max_size=150), label="events")
    ansi = data.draw(st.sampled_from(["true", "false"]), label="spark.sql.ansi.enabled")
    with spark_conf(spark, {"spark.sql.ansi.enabled": ansi}):
        loaded = assert_same(spark, texts, batch)
    assert loaded >= len(texts) * 3 // 4, f"only {loaded} of {len(texts)} definitions load"


# ---------------------------------------------------------------------------------------------
# Edge cases, each with the answer the language defines (checked against the evaluator too).

_MIN = -(2**63)
_MAX = 2**63 - 1
_BERLIN_SPRING = 1_711_846_800_000
"""2024-03-31T01:00:00Z, when Berlin's clocks jump from 02:00 to 03:00."""
_NEW_YORK_FALL = 1_730_613_600_000
"""2024-11-03T06:00:00Z, when New York's clocks fall back from 02:00 EDT to 01:00 EST."""
_LORD_HOWE_SPRING = 1_696_087_800_000
"""2023-09-30T15:30:00Z, when Lord Howe's clocks jump half an hour, from 02:00 to 02:30."""
_YEAR_1 = -62_135_596_800_000
_YEAR_9999_END = 253_402_300_799_999

EDGE_CASES: list[tuple[str, dict[str, Any], Scalar]] = [
    # BIGINT overflow at 2^63 is NULL; `%` truncates (the dividend's sign).
    ("a + 1", {"a": _MAX}, None),
    ("a - 1", {"a": _MIN}, None),
    ("a * 2", {"a": 2**62}, None),
    ("a * -1", {"a": _MIN}, None),
    ("- a", {"a": _MIN}, None),
    ("abs(a)", {"a": _MIN}, None),
    ("abs(a)", {"a": _MIN + 1}, _MAX),
    ("a % -1", {"a": _MIN}, 0),
    ("-9223372036854775808 % -1", {}, 0),
    ("a % 0", {"a": 7}, None),
    ("-7 % 2", {}, -1),
    ("7 % -2", {}, 1),
    ("a % b", {"a": -7.5, "b": 2}, -1.5),
    ("a % b", {"a": -4.0, "b": 2}, -0.0),
    ("a % b", {"a": 5.0, "b": -0.0}, None),
    ("a / b", {"a": 1, "b": 0}, None),
    ("a / b", {"a": 1, "b": -0.0}, None),
    ("a / b", {"a": 1e300, "b": 1e-300}, None),
    ("a * 10", {"a": 1e308}, None),
    ("a + a", {"a": 1.7e308}, None),
    ("a / 2", {"a": 7}, 3.5),
    ("a + b", {"a": 2**53, "b": 1}, 2**53 + 1),
    ("a + b", {"a": 2**53, "b": 1.0}, 9007199254740992.0),
    # Overflow where the expression has it, not where a reordering of constants would.
    ("(9223372036854775807 + a) + b", {"a": -1, "b": _MIN}, -2),
    ("(4611686018427387904 * a) * b", {"a": 2, "b": -1}, None),
    ("(a + 4611686018427387904) + 4611686018427387904", {"a": _MIN}, 0),
    ("(a - 1) + 2", {"a": _MIN}, None),
    # Signed zeros.
    ("a * -1", {"a": 0.0}, -0.0),
    ("a + 0.0", {"a": -0.0}, 0.0),
    ("- a", {"a": 0.0}, -0.0),
    ("abs(a)", {"a": -0.0}, 0.0),
    ("a = 0", {"a": -0.0}, True),
    ("a < 0.0", {"a": -0.0}, False),
    ("CAST(a AS BOOLEAN)", {"a": -0.0}, False),
    ("CAST(a AS BIGINT)", {"a": -0.0}, 0),
    # Rounding: halves away from zero, exactly.
    ("round(a)", {"a": 0.49999999999999994}, 0.0),
    ("round(a)", {"a": -2.5}, -3.0),
    ("round(a)", {"a": 2.5}, 3.0),
    ("round(a)", {"a": -0.5}, -1.0),
    ("round(a)", {"a": -0.4}, 0.0),
    ("round(a)", {"a": 4503599627370495.5}, 4503599627370496.0),
    ("round(a)", {"a": 1e300}, 1e300),
    ("round(a)", {"a": _MAX}, _MAX),
    ("floor(a)", {"a": -0.5}, -1),
    ("floor(a)", {"a": 9.3e18}, None),
    ("ceil(a)", {"a": -(2.0**63)}, _MIN),
    ("ceil(a)", {"a": 2.0**63}, None),
    ("ceil(a)", {"a": 9.2e18}, 9200000000000000000),
    # Casts.
    ("CAST('1e400' AS DOUBLE)", {}, None),
    ("CAST('-1e400' AS DOUBLE)", {}, None),
    ("CAST('1e-400' AS DOUBLE)", {}, 0.0),
    ("CAST('.5' AS DOUBLE)", {}, 0.5),
    ("CAST('5.' AS DOUBLE)", {}, 5.0),
    ("CAST(s AS DOUBLE)", {"s": "Infinity"}, None),
    ("CAST(s AS DOUBLE)", {"s": "NaN"}, None),
    ("CAST(s AS DOUBLE)", {"s": "1d"}, None),
    ("CAST(s AS DOUBLE)", {"s": " 1.5"}, None),
    ("CAST(s AS DOUBLE)", {"s": "0x10"}, None),
    ("CAST(s AS DOUBLE)", {"s": "1.5\n"}, None),
    ("CAST(s AS DOUBLE)", {"s": "0.1000000000000000055511151231257827021181583404541015625"}, 0.1),
    ("CAST(9.3e18 AS BIGINT)", {}, None),
    ("CAST(a AS BIGINT)", {"a": 2.0**63}, None),
    ("CAST(a AS BIGINT)", {"a": -(2.0**63)}, _MIN),
    ("CAST(a AS BIGINT)", {"a": -1.9}, -1),
    ("CAST(s AS BIGINT)", {"s": "+7"}, 7),
    ("CAST(s AS BIGINT)", {"s": "007"}, 7),
    ("CAST(s AS BIGINT)", {"s": "7\n"}, None),
    ("CAST(s AS BIGINT)", {"s": " 7"}, None),
    ("CAST(s AS BIGINT)", {"s": "1.5"}, None),
    ("CAST(s AS BIGINT)", {"s": "٣"}, None),
    ("CAST(s AS BIGINT)", {"s": "9223372036854775808"}, None),
    ("CAST(s AS BIGINT)", {"s": "-9223372036854775808"}, _MIN),
    ("CAST(s AS BOOLEAN)", {"s": "TRUE"}, None),
    ("CAST(s AS BOOLEAN)", {"s": "false"}, False),
    ("CAST(a AS STRING)", {"a": 1.5}, None),
    ("CAST(a AS STRING)", {"a": _MIN}, "-9223372036854775808"),
    ("CAST(a AS STRING)", {"a": True}, "true"),
    ("CAST(a AS DOUBLE)", {"a": 2**53 + 1}, 9007199254740992.0),
    ("CAST(a AS BIGINT)", {"a": True}, 1),
    # substr: 1-based, positions beyond INT range.
    ("substr('abc', 9223372036854775807)", {}, ""),
    ("substr('abc', 2147483648)", {}, ""),
    ("substr('abc', 2, 9223372036854775807)", {}, "bc"),
    ("substr('abc', 2, 2147483648)", {}, "bc"),
    ("substr('abc', 4)", {}, ""),
    ("substr('abc', 0)", {}, None),
    ("substr('abc', -1)", {}, None),
    ("substr('abc', 1, -1)", {}, None),
    ("substr('abc', 1, 0)", {}, ""),
    ("substr('😀ab', 2, 1)", {}, "a"),
    ("substr(s, a, b)", {"s": "abc", "a": 1}, None),
    ("substr(s, a)", {"s": "abc", "a": True}, None),
    # Date parts around DST changes and at the ends of years 1-9999.
    ("hour(a, 'Europe/Berlin')", {"a": _BERLIN_SPRING}, 3),
    ("hour(a, 'Europe/Berlin')", {"a": _BERLIN_SPRING - 1}, 1),
    ("hour(a, 'America/New_York')", {"a": _NEW_YORK_FALL}, 1),
    ("hour(a, 'America/New_York')", {"a": _NEW_YORK_FALL - 1}, 1),
    ("hour(a, 'America/New_York')", {"a": _NEW_YORK_FALL - 3_600_001}, 0),
    ("hour(a, 'Australia/Lord_Howe')", {"a": _LORD_HOWE_SPRING}, 2),
    ("date(a, 'Australia/Lord_Howe')", {"a": _LORD_HOWE_SPRING}, "2023-10-01"),
    ("hour(a, 'Australia/Lord_Howe')", {"a": _LORD_HOWE_SPRING - 1}, 1),
    ("day_of_week(a, 'America/New_York')", {"a": _NEW_YORK_FALL}, 7),
    ("day_of_week(a, 'Asia/Kolkata')", {"a": _BERLIN_SPRING}, 7),
    ("day_of_week(0)", {}, 4),
    ("hour(-1)", {}, 23),
    ("date(-1)", {}, "1969-12-31"),
    (f"date({_YEAR_1})", {}, "0001-01-01"),
    (f"day_of_week({_YEAR_1})", {}, 1),
    (f"date({_YEAR_1} - 1)", {}, None),
    (f"date({_YEAR_9999_END})", {}, "9999-12-31"),
    (f"date({_YEAR_9999_END} + 1)", {}, None),
    ("date(a, 'America/New_York')", {"a": _YEAR_1}, None),
    ("hour(a, 'Asia/Kolkata')", {"a": _YEAR_1}, 5),
    ("date(a, 'Asia/Kolkata')", {"a": _YEAR_9999_END}, None),
    ("date(a, 'America/New_York')", {"a": _YEAR_9999_END}, "9999-12-31"),
    ("hour(a, 'Europe/Berlin')", {"a": _YEAR_9999_END}, None),
    ("hour(9223372036854775807)", {}, None),
    ("date(a, 'Europe/Berlin')", {"a": 1.5}, None),
    ("hour(a, 'Europe/Berlin')", {"a": "x"}, None),
    ("hour(ts, 'Europe/Berlin')", {}, 1),
    ("date(ts, 'America/New_York')", {}, "1969-12-31"),
    # LIKE: `%` and `_` across line breaks, escapes, regex syntax as plain text.
    ("s LIKE 'a_b'", {"s": "a\nb"}, True),
    ("s LIKE 'a%'", {"s": "a\n\n"}, True),
    ("s LIKE '%b'", {"s": "ab\n"}, False),
    ("s LIKE 'ab'", {"s": "ab\n"}, False),
    ("s LIKE 'ab\\%c'", {"s": "ab%c"}, True),
    ("s LIKE 'ab\\%c'", {"s": "abxc"}, False),
    ("s LIKE 'a\\_c'", {"s": "abc"}, False),
    ("s LIKE 'a\\\\b'", {"s": "a\\b"}, True),
    ("s LIKE '_'", {"s": "😀"}, True),
    ("s LIKE '_'", {"s": "e\u0301"}, False),
    ("s LIKE '[a]%'", {"s": "[a]x"}, True),
    ("s LIKE '.*'", {"s": "x"}, False),
    ("s LIKE '%\\\\E%'", {"s": "a\\Eb"}, True),
    ("s LIKE '%$'", {"s": "a$"}, True),
    ("s LIKE 'É%'", {"s": "école"}, False),
    ("s LIKE '%'", {"s": 7}, None),
    # Text: ASCII-only case mapping, code points, code point order.
    ("lower(s)", {"s": "ÉCOLE"}, "École"),
    ("upper(s)", {"s": "straße"}, "STRAßE"),
    ("lower(s)", {"s": "İI"}, "İi"),
    ("upper(s)", {"s": "a😀z"}, "A😀Z"),
    ("length(s)", {"s": "😀"}, 1),
    ("length(s)", {"s": "e\u0301"}, 2),
    ("trim(s)", {"s": " \t a\u00a0 "}, "\t a\u00a0"),
    ("s < '😀'", {"s": "\uffff"}, True),
    ("s > 'z'", {"s": "é"}, True),
    ("s = 'a'", {"s": "a\x00"}, False),
    # Mixed kinds: BIGINT pairs exactly, with a DOUBLE as DOUBLE; other pairs are NULL.
    ("a = b", {"a": 2**53 + 1, "b": 2**53}, False),
    ("a = b", {"a": 2**53 + 1, "b": 2.0**53}, True),
    ("CAST(a AS BIGINT) = 9007199254740992.0", {"a": 2**53 + 1}, True),
    ("CAST(a AS BIGINT) > 9007199254740992.0", {"a": 2**53 + 1}, False),
    ("CAST(a AS BIGINT) >= 9223372036854775807.0", {"a": _MAX}, True),
    ("length(s) = 1.0", {"s": "x"}, True),
    ("a = b", {"a": 1, "b": True}, None),
    ("a = b", {"a": "1", "b": 1}, None),
    ("a < b", {"a": False, "b": True}, True),
    ("a IS NULL", {"a": [1]}, True),
    ("a IS NULL", {"a": 10**400}, True),
    ("a + 0", {"a": 10**30}, 1e30),
    ("NOT a", {"a": 1}, None),
    ("a AND FALSE", {"a": "x"}, False),
    ("a OR TRUE", {}, True),
    ("CASE WHEN a THEN 1 ELSE 2 END", {"a": 1}, 2),
    ("COALESCE(a, b, 3)", {"b": "x"}, "x"),
    ("COALESCE(a, b)", {"a": False, "b": 1}, False),
    ("a IN (1, 2.0, 'x')", {"a": 2}, True),
    # Values that are statically NULL, or constant.
    ("NULL", {}, None),
    ("CAST(NULL AS BIGINT)", {}, None),
    ("substr(s, NULL)", {"s": "abc"}, None),
    ("-9223372036854775808", {}, _MIN),
    ("'it''s é\n'", {}, "it's é\n"),
]


def _edge_case_batch() -> tuple[list[dict[str, str]], list[Event]]:
    """One definition per distinct expression and one event per distinct fields, so the whole
    table is one Spark job."""
    texts = list(dict.fromkeys(text for text, _, _ in EDGE_CASES))
    bodies = list(dict.fromkeys(json.dumps(f, sort_keys=True) for _, f, _ in EDGE_CASES))
    batch = [(json.loads(body), 0) for body in bodies]
    return [{"v": text} for text in texts], batch


def test_edge_cases_have_the_defined_answers() -> None:
    """The table's answers are the evaluator's (so a disagreement is a table error, or a
    semantic question for the evaluator's owners)."""
    wrong = []
    for text, fields, want in EDGE_CASES:
        ((_, node),) = compile_definitions(None, {"v": text}, TIME_FIELD).fields
        got = compile_node(node)(json.loads(json.dumps(fields)), 0, {})
        if _typed(got) != _typed(want):
            wrong.append(f"{text} on {fields}: evaluator {_typed(got)}, table {_typed(want)}")
    assert not wrong, "\n".join(wrong)


@pytest.mark.parametrize(
    ("ansi", "zone"), [("true", "UTC"), ("false", "UTC"), ("true", "America/Los_Angeles")]
)
def test_edge_cases_in_spark(spark: SparkSession, ansi: str, zone: str) -> None:
    """Whatever ANSI mode and the session time zone: nothing raises, answers do not change."""
    texts, batch = _edge_case_batch()
    conf = {"spark.sql.ansi.enabled": ansi, "spark.sql.session.timeZone": zone}
    with spark_conf(spark, conf):
        assert assert_same(spark, texts, batch) == len(texts)


def test_deep_nesting_stays_linear(spark: SparkSession) -> None:
    """An expression 51 nodes deep (as deep as the parser allows), each level reading its
    operand's parts several times (guards and values, a DOUBLE and a BIGINT part), compiles
    and runs at once: inlined, its column tree would be exponential in the depth."""
    text = "a"
    for level in range(20):
        text = f"({text} * 3 % 1000003 + b)" if level % 2 else f"abs({text} - {level})"
    batch: list[Event] = [({"a": 5, "b": 2}, 0), ({"a": 5.5, "b": 2}, 0), ({"a": "x", "b": 2}, 0)]
    assert assert_same(spark, [{"v": text}], batch) == 1
