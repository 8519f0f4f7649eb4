"""Hypothesis strategies for rule 10's expressions (docs/semantics.md) and the events they read.

Expressions are generated as SQL text over a few raw fields (`a`, `b`, `s`, nested `geo.x`,
the event time `ts`), built by the kind each operand must have, so nearly all of them load:
an expression refused at load compares nothing between engines. Raw fields can hold any kind,
so they stand for an operand of any kind, and that is where the interesting cases are (a STRING
field in arithmetic is only known to be wrong per event, so it must evaluate to NULL in every
engine). Events hold every JSON shape a field can take: missing, null, booleans, integers at
and beyond the 64-bit edges, fractions, -0.0, numbers too large for a double, numeric-looking
strings, unicode, NUL, line breaks, objects.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from functools import cache
from typing import Any

from hypothesis import strategies as st

TIME_FIELD = "ts"
FIELDS = ("a", "b", "s", "geo.x")
ZONES = ("UTC", "Europe/Berlin", "America/New_York", "Asia/Kolkata", "Australia/Lord_Howe")

_INT_EDGES = [0, 1, -1, 7, 2**31, 2**53 + 1, 2**63 - 1, -(2**63), 2**63, -(2**63) - 1, 10**30]
_FLOAT_EDGES = [
    0.0,
    -0.0,
    0.5,
    -0.5,
    1.5,
    2.5,
    -2.5,
    0.49999999999999994,
    1e308,
    -1e308,
    2.0**63,
    -(2.0**63),
    9.223372036854776e18,
    9.3e18,
    2.0**52 + 1,
    4503599627370495.5,
    1e-320,
    123.456,
]
_TEXT_EDGES = [
    "",
    "x",
    "7",
    "-7",
    "+7",
    " 7",
    "7 ",
    "1.5",
    "1e3",
    "1e400",
    "NaN",
    "Infinity",
    "true",
    "false",
    "TRUE",
    "ab%c",
    "a_c",
    "\x00",
    "é",
    "ÉCOLE",
    "ß",
    "İ",
    "日本",
    "😀",
    "a\nb",
    "9223372036854775808",
    "-9223372036854775808",
    ".5",
    "5.",
    "  ",
    "7\n",
    " a\tb ",
    "1d",
    "0x10",
    "1_000",
    "٣",
    "2.5e-3",
    "1e-400",
    "00012",
    "0.1000000000000000055511151231257827021181583404541015625",
    "-7\n",
    "1.5\n",
    "ab\n",
    "\n",
    "a\r\nb",
    "9.3e18",
    "1e308",
    "e\u0301",
    "\uffff",
]

json_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.sampled_from(_INT_EDGES),
    st.sampled_from(_INT_EDGES),
    st.integers(min_value=-1000, max_value=1000),
    st.sampled_from(_FLOAT_EDGES),
    st.sampled_from(_FLOAT_EDGES),
    st.floats(allow_nan=False, allow_infinity=False),
    st.sampled_from(_TEXT_EDGES),
    st.sampled_from(_TEXT_EDGES),
    st.sampled_from(_TEXT_EDGES),
    st.text(max_size=6),
)
"""Any JSON value a field can hold that is not an object (objects come from `events`), the
edge cases most often: a random value seldom lands on one."""

_MISSING = object()

# Instants around DST changes (Berlin, New York, Lord Howe's half hour) and the edges of time.
_TIMES = [
    0,
    1_711_846_800_000,
    1_711_846_799_999,
    1_730_595_600_000,
    1_696_089_600_000,
    -62_135_596_800_000,
    253_402_300_799_999,
    1_700_000_000_123,
    -1,
    -62_135_578_000_000,
    253_402_290_000_000,
]


@st.composite
def events(draw: st.DrawFn) -> tuple[dict[str, Any], int]:
    """(the event's JSON object as decoded by the standard library, its event time in ms)."""
    event: dict[str, Any] = {}
    for name in ("a", "b", "s"):
        value = draw(st.one_of(st.just(_MISSING), json_scalars, st.just({"x": 1}), st.just([1])))
        if value is not _MISSING:
            event[name] = value
    geo = draw(
        st.one_of(
            st.just(_MISSING),
            st.none(),
            st.just("DE"),
            st.fixed_dictionaries({}, optional={"x": json_scalars}),
        )
    )
    if geo is not _MISSING:
        event["geo"] = geo
    time_ms = draw(
        st.one_of(
            st.sampled_from(_TIMES),
            st.integers(min_value=-62_135_596_800_000, max_value=253_402_300_799_999),
        )
    )
    event[TIME_FIELD] = time_ms
    # Round-trip through JSON text as the layers read it (1e400 decodes to inf).
    text = json.dumps(event, allow_nan=True).replace("Infinity", "1e400")
    return json.loads(text), time_ms


def _quote(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


_BIGINT_LITERALS = st.one_of(
    st.sampled_from(
        [
            "0",
            "1",
            "2",
            "3",
            "7",
            "-1",
            "100",
            "9223372036854775807",
            "-9223372036854775808",
            "4611686018427387904",
            "86400000",
            "1711846800000",
            "-62135596800000",
            "253402300799999",
        ]
    ),
    st.integers(min_value=-(2**63), max_value=2**63 - 1).map(str),
)
_DOUBLE_LITERALS = st.sampled_from(
    [
        "0.5",
        "1.5",
        "-2.5",
        "2.5",
        "1e300",
        "2.0",
        "0.0",
        "-0.0",
        "0.49999999999999994",
        "9.3e18",
        "9.223372036854775807e18",
        "1e-300",
        "4503599627370497.0",
        "0.1",
    ]
)
_TEXT_LITERALS = st.sampled_from(_TEXT_EDGES).map(_quote)
_BOOLEAN_LITERALS = st.sampled_from(["TRUE", "FALSE"])
_LIKE_PATTERNS = [
    "'%'",
    "'a%'",
    "'%b'",
    "'_'",
    "'a_c'",
    "'%\\%%'",
    "'7'",
    "''",
    "'é%'",
    "'%\\_%'",
    "'a\nb'",
    "'a_b'",
    "'%\n'",
    "'_%_'",
    "'😀'",
    "'.*'",
    "'[a]%'",
    "'\\\\%'",
    "'%$'",
    "'\\\\Q%'",
]

# What an operand must be ("want"): a BOOLEAN ("bool"), a BIGINT ("int"), a number ("num"), a
# STRING ("str"), or anything ("any"). Each production below yields text whose kinds the
# parser finds to meet it.
_COMPARABLE = ("bool", "num", "str")
_DEPTH = 4


def expressions_over(
    names: Sequence[str], bigints: Sequence[str] = (TIME_FIELD,), depth: int = _DEPTH
) -> st.SearchStrategy[str]:
    """SQL text of an expression of any kind over the field `names` (of any kind) and
    `bigints` (BIGINT names: the time field), nested at most `depth` operators deep; as often
    1, 2, ... deep, since an operator's edge cases show best near the top (deep inside, most
    answers are washed out to NULL or to a BOOLEAN)."""
    return st.integers(1, depth).flatmap(lambda d: _typed("any", d, tuple(names), tuple(bigints)))


@cache
def _typed(
    want: str, depth: int, names: tuple[str, ...], bigints: tuple[str, ...]
) -> st.SearchStrategy[str]:
    names_ = st.sampled_from(names + bigints if want in ("int", "num", "any") else names)
    literal = {
        "bool": _BOOLEAN_LITERALS,
        "int": _BIGINT_LITERALS,
        "num": st.one_of(_BIGINT_LITERALS, _DOUBLE_LITERALS),
        "str": _TEXT_LITERALS,
        "any": st.one_of(_BIGINT_LITERALS, _DOUBLE_LITERALS, _TEXT_LITERALS, _BOOLEAN_LITERALS),
    }[want]
    leaf = st.one_of(names_, literal, names_, literal, names_, st.just("NULL"))
    if depth == 0:
        return leaf

    def sub(kind: str) -> st.SearchStrategy[str]:
        return _typed(kind, depth - 1, names, bigints)

    def build(
        template: Callable[..., str], *parts: st.SearchStrategy[Any]
    ) -> st.SearchStrategy[str]:
        return st.builds(template, *parts)

    def alike(count: int) -> st.SearchStrategy[tuple[str, ...]]:
        """`count` operands of one comparable kind."""
        return st.sampled_from(_COMPARABLE).flatmap(lambda k: st.tuples(*[sub(k)] * count))

    def lists(kind: str) -> st.SearchStrategy[str]:
        return st.lists(sub(kind), min_size=1, max_size=3).map(", ".join)

    zone = st.sampled_from(ZONES).map(lambda z: f", {_quote(z)}")
    instants = st.sampled_from(names + bigints)
    """What a date part with a zone reads: a field or the time (the zone's offsets are looked
    up beside the event)."""
    chosen = {
        "case": build(
            lambda c, r, e: f"CASE WHEN {c} THEN {r} ELSE {e} END",
            sub("bool"),
            sub(want),
            sub(want),
        ),
        "switch": build(
            lambda xv, r: f"CASE {xv[0]} WHEN {xv[1]} THEN {r} END", alike(2), sub(want)
        ),
        "coalesce": build(lambda xs: f"COALESCE({xs})", lists(want)),
    }
    productions: dict[str, list[st.SearchStrategy[str]]] = {
        "bool": [
            build(
                lambda xy, op: f"({xy[0]} {op} {xy[1]})",
                alike(2),
                st.sampled_from(["=", "<>", "<", "<=", ">", ">="]),
            ),
            build(
                lambda a, op, b: f"({a} {op} {b})",
                sub("bool"),
                st.sampled_from(["AND", "OR"]),
                sub("bool"),
            ),
            build(lambda a: f"(NOT {a})", sub("bool")),
            build(lambda a, n: f"({a} IS {n}NULL)", sub("any"), st.sampled_from(["", "NOT "])),
            build(
                lambda xs: f"({xs[0]} IN ({', '.join(xs[1:])}))", st.integers(2, 4).flatmap(alike)
            ),
            build(lambda xs: f"({xs[0]} BETWEEN {xs[1]} AND {xs[2]})", alike(3)),
            build(
                lambda a, n, p: f"({a} {n}LIKE {p})",
                sub("str"),
                st.sampled_from(["", "NOT "]),
                st.sampled_from(_LIKE_PATTERNS),
            ),
            build(lambda a: f"CAST({a} AS BOOLEAN)", sub("any")),
        ],
        "int": [
            build(
                lambda a, op, b: f"({a} {op} {b})",
                sub("int"),
                st.sampled_from(["+", "-", "*", "%"]),
                sub("int"),
            ),
            build(lambda a: f"(- {a})", sub("int")),
            build(lambda f, a: f"{f}({a})", st.sampled_from(["abs", "round"]), sub("int")),
            build(lambda f, a: f"{f}({a})", st.sampled_from(["floor", "ceil"]), sub("num")),
            build(lambda a: f"length({a})", sub("str")),
            build(lambda f, a: f"{f}({a})", st.sampled_from(["hour", "day_of_week"]), sub("int")),
            build(
                lambda f, a, z: f"{f}({a}{z})",
                st.sampled_from(["hour", "day_of_week"]),
                instants,
                zone,
            ),
            build(lambda a: f"CAST({a} AS BIGINT)", sub("any")),
        ],
        "num": [
            build(
                lambda a, op, b: f"({a} {op} {b})",
                sub("num"),
                st.sampled_from(["+", "-", "*", "/", "%"]),
                sub("num"),
            ),
            build(lambda a: f"(- {a})", sub("num")),
            build(lambda f, a: f"{f}({a})", st.sampled_from(["abs", "round"]), sub("num")),
            build(lambda a: f"CAST({a} AS DOUBLE)", sub("any")),
        ],
        "str": [
            build(
                lambda f, a: f"{f}({a})", st.sampled_from(["lower", "upper", "trim"]), sub("str")
            ),
            build(lambda a, s: f"substr({a}, {s})", sub("str"), sub("int")),
            build(lambda a, s, n: f"substr({a}, {s}, {n})", sub("str"), sub("int"), sub("int")),
            build(lambda a: f"date({a})", sub("int")),
            build(lambda a, z: f"date({a}{z})", instants, zone),
            build(
                lambda a: f"CAST({a} AS STRING)",
                st.sampled_from(["bool", "int", "str"]).flatmap(sub),
            ),
        ],
    }
    productions["num"] += productions["int"]
    productions["any"] = [p for kind in ("bool", "num", "str") for p in productions[kind]]
    return st.one_of(leaf, leaf, *chosen.values(), *productions[want])


expressions = expressions_over(FIELDS)
"""SQL text of an expression over `FIELDS` and `TIME_FIELD`, nearly always one that loads
(an operand's kinds may still be NULL-only: `CAST` of a DOUBLE-only value AS STRING is
refused)."""
