"""An independent evaluator of rule 10's expressions (docs/semantics.md) through DuckDB, for tests.

Like `tests/oracle.py` it imports nothing from `shared`, `speed_layer`, `batch_layer`,
`serving_layer` or `lambdactl`: the expression text is parsed here with sqlglot and translated
into DuckDB SQL, so a mistake in the project's parser or evaluator cannot hide in both the
system and its reference.

How values are held. A value of the language is NULL or one of four kinds, and a raw JSON field
can hold any of them, so every sub-expression is a group of four SQL columns, one per kind
(`b` BOOLEAN, `i` BIGINT, `d` DOUBLE, `s` VARCHAR), at most one of them non-NULL on a row; NULL
is all four NULL. A kind a sub-expression can never have is left out of its group (a literal has
one column, `'a' + 1` none), which keeps the SQL small. Every operator is written slot by slot:
`x + y` is a BIGINT slot (exact, through HUGEINT, NULL when it leaves 64 bits) and a DOUBLE
slot (taken only when an operand is a DOUBLE, NULL when not finite); a comparison is the first
non-NULL of the same-kind comparisons and the numeric one.

Why the SQL is layered. A sub-expression is read several times by the SQL of its parent (once
per slot, and again in guards), so inlining it would grow the text exponentially with depth.
Each sub-expression's slots are instead computed once, as columns of a projection, and its
parent reads them from the projection above: one nested `SELECT *, ...` per level of the tree.

Nothing here may raise on an event: DuckDB errors on integer overflow, division by zero and
out-of-range casts, so every such operation is written so it cannot fail (HUGEINT arithmetic
with TRY_CAST back, NULLIF on divisors, clamped substring bounds and timestamps).
"""

from __future__ import annotations

import itertools
import math
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import cache
from typing import Any

import duckdb
import pyarrow as pa
import sqlglot
from sqlglot import exp, parser
from sqlglot.dialects.dialect import Dialect

Scalar = bool | int | float | str | None
"""A value: None is NULL, bool BOOLEAN, int BIGINT, float DOUBLE (finite), str STRING."""

_KINDS = ("b", "i", "d", "s")
_SQL_TYPES = {"b": "BOOLEAN", "i": "BIGINT", "d": "DOUBLE", "s": "VARCHAR"}
_ARROW_TYPES = {"b": pa.bool_(), "i": pa.int64(), "d": pa.float64(), "s": pa.string()}
_BIGINT_MIN = -(2**63)
_BIGINT_MAX = 2**63 - 1
_TWO_63 = "CAST('9223372036854775808' AS DOUBLE)"
_EVENT_MS_MIN = -62_135_596_800_000
"""0001-01-01T00:00:00.000Z, the first instant the date-part functions answer for."""
_EVENT_MS_MAX = 253_402_300_799_999
"""9999-12-31T23:59:59.999Z, the last."""
_DIGITS = re.compile("[0-9]+")
_INTEGER_TEXT = "[+-]?[0-9]+"
_DECIMAL_TEXT = r"[+-]?([0-9]+\.?[0-9]*|\.[0-9]+)([eE][+-]?[0-9]+)?"
_TIME_FUNCTIONS = ("hour", "day_of_week", "date")


def _plain_call(name: str) -> Callable[[list[exp.Expr]], exp.Expr]:
    return lambda args: exp.Anonymous(this=name, expressions=args)


class _Dialect(Dialect):
    """sqlglot's standard SQL, with hour/day_of_week/date as plain calls: sqlglot's own `HOUR`
    and `DATE` take no zone argument, which the language's date parts do."""

    class Parser(parser.Parser):
        FUNCTIONS = {
            **parser.Parser.FUNCTIONS,
            **{name.upper(): _plain_call(name) for name in _TIME_FUNCTIONS},
        }


@dataclass(frozen=True)
class _Value:
    """A sub-expression's SQL: kind letter -> a column (or a constant) holding that kind's
    slot, for the kinds it can have; `height` is the projection layer defining those columns
    (0: the events table or a constant)."""

    slots: Mapping[str, str]
    height: int


def _slot(value: _Value, kind: str) -> str:
    """A slot, or a typed NULL when `value` never has that kind."""
    return value.slots.get(kind, f"CAST(NULL AS {_SQL_TYPES[kind]})")


def _is_null(value: _Value) -> str:
    if not value.slots:
        return "TRUE"
    return "(" + " AND ".join(f"{sql} IS NULL" for sql in value.slots.values()) + ")"


def _as_double(value: _Value) -> str | None:
    """A number as a DOUBLE (a BIGINT converted, to the nearest double), None if never one."""
    parts = []
    if "d" in value.slots:
        parts.append(value.slots["d"])
    if "i" in value.slots:
        parts.append(f"CAST({value.slots['i']} AS DOUBLE)")
    return _first(parts)


def _first(parts: Sequence[str]) -> str | None:
    """The first non-NULL of SQL expressions that are never non-NULL together."""
    if not parts:
        return None
    return parts[0] if len(parts) == 1 else f"COALESCE({', '.join(parts)})"


def _kinds_of(values: Sequence[_Value]) -> list[str]:
    """The kinds any of `values` can have, in a fixed order (the SQL is deterministic)."""
    return [k for k in _KINDS if any(k in v.slots for v in values)]


def _finite(sql: str) -> str:
    return f"CASE WHEN isfinite({sql}) THEN {sql} END"


def _in_bigint_range(double: str) -> str:
    """Whether a DOUBLE truncates to a BIGINT: -2^63 <= x < 2^63."""
    return f"({double} >= -{_TWO_63} AND {double} < {_TWO_63})"


class _Translator:
    """Translates one evaluation's expressions into layered DuckDB SQL (see the module doc)."""

    def __init__(self, time_field: str, fields: Mapping[str, exp.Expr]) -> None:
        self.time_field = time_field
        self.field_trees = fields
        self.computed: dict[str, _Value] = {}
        self.in_progress: list[str] = []
        self.paths: dict[tuple[str, ...], str] = {}
        self.layers: list[list[str]] = []
        self.columns = itertools.count()

    def computed_field(self, name: str) -> _Value:
        """A computed field's value, translated once however many expressions read it."""
        if name in self.in_progress:
            cycle = " -> ".join([*self.in_progress[self.in_progress.index(name) :], name])
            raise ValueError(f"computed fields refer to each other in a cycle: {cycle}")
        if name not in self.computed:
            self.in_progress.append(name)
            self.computed[name] = self.value(self.field_trees[name])
            self.in_progress.pop()
        return self.computed[name]

    def define(self, slots: Mapping[str, str | None], *children: _Value) -> _Value:
        """Materializes the non-NULL slots as columns one layer above the highest child."""
        height = 1 + max((c.height for c in children), default=0)
        while len(self.layers) < height:
            self.layers.append([])
        columns = {}
        for kind, sql in slots.items():
            if sql is not None:
                name = f"v{next(self.columns)}{kind}"
                self.layers[height - 1].append(f"{sql} AS {name}")
                columns[kind] = name
        return _Value(columns, height)

    @staticmethod
    def constant(value: Scalar) -> _Value:
        """A literal, written into the SQL (numbers as text DuckDB parses exactly)."""
        if value is None:
            return _Value({}, 0)
        if type(value) is bool:
            return _Value({"b": "TRUE" if value else "FALSE"}, 0)
        if type(value) is str:
            return _Value({"s": _quote(value)}, 0)
        kind = "i" if type(value) is int else "d"
        return _Value({kind: f"CAST('{value!r}' AS {_SQL_TYPES[kind]})"}, 0)

    def value(self, e: exp.Expr) -> _Value:
        handler = _HANDLERS.get(type(e))
        if handler is None:
            raise ValueError(f"{e.sql()!r} is not part of the expression language")
        return handler(self, e)

    def column(self, e: exp.Expr) -> _Value:
        path = _path(e)
        if len(path) == 1 and path[0] in self.field_trees:
            return self.computed_field(path[0])
        if path == (self.time_field,):
            return _Value({"i": "t"}, 0)
        prefix = self.paths.setdefault(path, f"f{len(self.paths)}")
        return _Value({kind: prefix + kind for kind in _KINDS}, 0)

    def literal(self, e: exp.Literal) -> _Value:
        text = str(e.this)
        if e.is_string:
            return self.constant(text)
        if _DIGITS.fullmatch(text):
            if int(text) > _BIGINT_MAX:
                raise ValueError(f"the integer {text} does not fit a BIGINT")
            return self.constant(int(text))
        number = float(text)
        if not math.isfinite(number):
            raise ValueError(f"the number {text} does not fit a DOUBLE")
        return self.constant(number)

    def negate(self, e: exp.Neg) -> _Value:
        inner = e.this
        if (
            isinstance(inner, exp.Literal)
            and not inner.is_string
            and _DIGITS.fullmatch(str(inner.this))
        ):
            # -9223372036854775808 is a literal of its own: 9223372036854775808 is no BIGINT.
            if -int(inner.this) < _BIGINT_MIN:
                raise ValueError(f"the integer -{inner.this} does not fit a BIGINT")
            return self.constant(-int(inner.this))
        x = self.value(inner)
        slots: dict[str, str | None] = {}
        if "i" in x.slots:
            slots["i"] = f"TRY_CAST(-CAST({x.slots['i']} AS HUGEINT) AS BIGINT)"
        if "d" in x.slots:
            slots["d"] = f"(-{x.slots['d']})"
        return self.define(slots, x)

    def arith(self, e: exp.Binary) -> _Value:
        op = _ARITH[type(e)]
        x, y = self.value(e.this), self.value(e.expression)
        slots: dict[str, str | None] = {}
        if op != "/" and "i" in x.slots and "i" in y.slots:
            xi = f"CAST({x.slots['i']} AS HUGEINT)"
            yi = f"CAST({y.slots['i']} AS HUGEINT)"
            exact = f"{xi} % NULLIF({yi}, 0)" if op == "%" else f"{xi} {op} {yi}"
            slots["i"] = f"TRY_CAST({exact} AS BIGINT)"
        xd, yd = _as_double(x), _as_double(y)
        doubles = [v.slots["d"] for v in (x, y) if "d" in v.slots]
        if xd is not None and yd is not None and (op == "/" or doubles):
            if op == "%":
                # DuckDB's `%` on DOUBLEs is C's fmod (exact, the dividend's sign); its
                # `fmod` function is not (x - y * floor(x / y): floored and inexact).
                result = f"({xd} % NULLIF({yd}, 0))"
            elif op == "/":
                result = _finite(f"({xd} / NULLIF({yd}, 0))")
            else:
                result = _finite(f"({xd} {op} {yd})")
            if op != "/":
                # Two BIGINTs give a BIGINT: the DOUBLE slot is for rows with a DOUBLE operand.
                some_double = " OR ".join(f"{d} IS NOT NULL" for d in doubles)
                result = f"CASE WHEN {some_double} THEN {result} END"
            slots["d"] = result
        return self.define(slots, x, y)

    def compare(self, e: exp.Binary) -> _Value:
        return self.comparison(_COMPARE[type(e)], self.value(e.this), self.value(e.expression))

    def comparison(self, op: str, x: _Value, y: _Value) -> _Value:
        same = [f"({x.slots[k]} {op} {y.slots[k]})" for k in "bsi" if k in x.slots and k in y.slots]
        xd, yd = _as_double(x), _as_double(y)
        if xd is not None and yd is not None and ("d" in x.slots or "d" in y.slots):
            # After the BIGINT comparison: two BIGINTs compare exactly, not as doubles.
            same.append(f"({xd} {op} {yd})")
        return self.define({"b": _first(same)}, x, y)

    def logic(self, e: exp.Expr) -> _Value:
        x, y = self.value(e.this), self.value(e.expression)
        op = "AND" if isinstance(e, exp.And) else "OR"
        return self.define({"b": f"({_slot(x, 'b')} {op} {_slot(y, 'b')})"}, x, y)

    def not_(self, e: exp.Not) -> _Value:
        x = self.value(e.this)
        return self.define({"b": f"(NOT {_slot(x, 'b')})"}, x)

    def is_(self, e: exp.Is) -> _Value:
        if not isinstance(e.expression, exp.Null):
            raise ValueError("only IS NULL and IS NOT NULL are supported")
        x = self.value(e.this)
        return self.define({"b": _is_null(x)}, x)

    def in_(self, e: exp.In) -> _Value:
        if e.args.get("query") is not None or not e.expressions:
            raise ValueError("IN takes a list of values")
        x = self.value(e.this)
        tests = [self.comparison("=", x, self.value(item)) for item in e.expressions]
        result = tests[0]
        for test in tests[1:]:
            result = self.define(
                {"b": f"({_slot(result, 'b')} OR {_slot(test, 'b')})"}, result, test
            )
        return result

    def between(self, e: exp.Between) -> _Value:
        x = self.value(e.this)
        low = self.comparison(">=", x, self.value(e.args["low"]))
        high = self.comparison("<=", x, self.value(e.args["high"]))
        return self.define({"b": f"({_slot(low, 'b')} AND {_slot(high, 'b')})"}, low, high)

    def like(self, e: exp.Like) -> _Value:
        pattern = e.expression
        if not (isinstance(pattern, exp.Literal) and pattern.is_string):
            raise ValueError("a LIKE pattern must be a string literal")
        _check_like_pattern(str(pattern.this))
        x = self.value(e.this)
        test = f"({_slot(x, 's')} LIKE {_quote(str(pattern.this))} ESCAPE '\\')"
        return self.define({"b": f"(NOT {test})" if e.args.get("negate") else test}, x)

    def case(self, e: exp.Case) -> _Value:
        subject = None if e.this is None else self.value(e.this)
        branches = []
        for branch in e.args.get("ifs") or []:
            condition = self.value(branch.this)
            if subject is not None:
                condition = self.comparison("=", subject, condition)
            branches.append((condition, self.value(branch.args["true"])))
        default_tree = e.args.get("default")
        default = _Value({}, 0) if default_tree is None else self.value(default_tree)
        results = [result for _, result in branches] + [default]
        slots: dict[str, str | None] = {}
        for kind in _kinds_of(results):
            whens = " ".join(f"WHEN {_slot(c, 'b')} THEN {_slot(r, kind)}" for c, r in branches)
            slots[kind] = f"CASE {whens} ELSE {_slot(default, kind)} END"
        return self.define(slots, *(v for branch in branches for v in branch), default)

    def coalesce(self, e: exp.Coalesce) -> _Value:
        operands = [self.value(x) for x in [e.this, *e.expressions]]
        slots: dict[str, str | None] = {}
        for kind in _kinds_of(operands):
            whens = " ".join(f"WHEN NOT {_is_null(o)} THEN {_slot(o, kind)}" for o in operands)
            slots[kind] = f"CASE {whens} END"
        return self.define(slots, *operands)

    def cast(self, e: exp.Cast) -> _Value:
        to = _CASTS.get(e.to.this)
        if to is None or e.to.expressions:
            raise ValueError(f"CAST to {e.to.sql()} is not supported")
        x = self.value(e.this)
        b, i, d, s = (x.slots.get(k) for k in _KINDS)
        parts: list[str | None]
        if to == "i":
            parts = [
                b and f"CAST({b} AS BIGINT)",
                i,
                d and f"CASE WHEN {_in_bigint_range(d)} THEN TRY_CAST(trunc({d}) AS BIGINT) END",
                s
                and f"CASE WHEN regexp_full_match({s}, '{_INTEGER_TEXT}') "
                f"THEN TRY_CAST({s} AS BIGINT) END",
            ]
        elif to == "d":
            parts = [
                b and f"CAST({b} AS DOUBLE)",
                i and f"CAST({i} AS DOUBLE)",
                d,
                s
                and f"CASE WHEN regexp_full_match({s}, '{_DECIMAL_TEXT}') "
                f"THEN {_finite(f'TRY_CAST({s} AS DOUBLE)')} END",
            ]
        elif to == "s":
            # A DOUBLE has no text: its slot is left out, so it casts to NULL.
            parts = [
                b and f"CASE {b} WHEN TRUE THEN 'true' WHEN FALSE THEN 'false' END",
                i and f"CAST({i} AS VARCHAR)",
                s,
            ]
        else:
            parts = [
                b,
                i and f"({i} <> 0)",
                d and f"({d} <> 0)",
                s and f"CASE {s} WHEN 'true' THEN TRUE WHEN 'false' THEN FALSE END",
            ]
        return self.define({to: _first([p for p in parts if p is not None])}, x)

    def function(self, e: exp.Expr) -> _Value:
        name, arg_names, required = _FUNCTIONS[type(e)]
        given = [a for a in arg_names if e.args.get(a) is not None]
        extra = [k for k, v in e.args.items() if v is not None and k not in arg_names]
        if extra or given != list(arg_names[: len(given)]) or len(given) < required:
            raise ValueError(f"{e.sql()!r}: wrong arguments for {name}")
        return self.call(name, [self.value(e.args[a]) for a in given])

    def anonymous(self, e: exp.Anonymous) -> _Value:
        name = str(e.this).lower()
        trees = list(e.expressions)
        if name not in _TIME_FUNCTIONS or not 1 <= len(trees) <= 2:
            raise ValueError(f"unknown function or wrong arguments: {e.sql()!r}")
        zone = None
        if len(trees) == 2:
            zone_tree = trees[1]
            if not (isinstance(zone_tree, exp.Literal) and zone_tree.is_string):
                raise ValueError(f"{name}'s zone must be a string literal")
            zone = str(zone_tree.this)
        return self.date_part(name, self.value(trees[0]), zone)

    def call(self, name: str, args: list[_Value]) -> _Value:
        x = args[0]
        s, i, d = x.slots.get("s"), x.slots.get("i"), x.slots.get("d")
        slots: dict[str, str | None] = {}
        if name in ("lower", "upper"):
            ascii_from, ascii_to = "ABCDEFGHIJKLMNOPQRSTUVWXYZ", "abcdefghijklmnopqrstuvwxyz"
            if name == "upper":
                ascii_from, ascii_to = ascii_to, ascii_from
            slots["s"] = s and f"translate({s}, '{ascii_from}', '{ascii_to}')"
        elif name == "trim":
            slots["s"] = s and f"trim({s}, ' ')"
        elif name == "length":
            slots["i"] = s and f"CAST(length({s}) AS BIGINT)"
        elif name == "substr":
            slots["s"] = self.substr(s, [a.slots.get("i") for a in args[1:]])
        elif name == "abs":
            slots["i"] = i and f"TRY_CAST(abs(CAST({i} AS HUGEINT)) AS BIGINT)"
            slots["d"] = d and f"abs({d})"
        elif name == "round":
            # DuckDB rounds a DOUBLE half away from zero, exactly (std::round).
            slots["i"] = i
            slots["d"] = d and f"round({d})"
        else:
            whole = "floor" if name == "floor" else "ceil"
            parts = [] if i is None else [i]
            if d is not None:
                parts.append(
                    f"CASE WHEN {_in_bigint_range(d)} THEN TRY_CAST({whole}({d}) AS BIGINT) END"
                )
            slots["i"] = _first(parts)
        return self.define(slots, *args)

    @staticmethod
    def substr(text: str | None, bounds: list[str | None]) -> str | None:
        """1-based `substr`; a start below 1 or a negative length is NULL. The bounds are
        clamped to the text's length because DuckDB refuses offsets beyond 2^32."""
        if text is None or any(b is None for b in bounds):
            return None
        size = f"length({text})"
        start = bounds[0]
        guard = f"{start} >= 1"
        arguments = f"{text}, greatest(least({start}, {size} + 1), 1)"
        if len(bounds) == 2:
            guard += f" AND {bounds[1]} >= 0"
            arguments += f", greatest(least({bounds[1]}, {size}), 0)"
        return f"CASE WHEN {guard} THEN substring({arguments}) END"

    def date_part(self, name: str, x: _Value, zone: str | None) -> _Value:
        """hour, ISO day of week or 'YYYY-MM-DD' of an epoch-ms BIGINT in `zone` (UTC when
        None): NULL unless both the instant and its local time are within years 1..9999."""
        ms = x.slots.get("i")
        if ms is None:
            return self.define({}, x)
        clamped = f"epoch_ms(least(greatest({ms}, {_EVENT_MS_MIN}), {_EVENT_MS_MAX}))"
        local = clamped
        if zone is not None:
            local = f"timezone({_quote(zone)}, timezone('UTC', {clamped}))"
        guard = (
            f"{ms} BETWEEN {_EVENT_MS_MIN} AND {_EVENT_MS_MAX} AND year({local}) BETWEEN 1 AND 9999"
        )
        part = {
            "hour": f"CAST(hour({local}) AS BIGINT)",
            "day_of_week": f"CAST(isodow({local}) AS BIGINT)",
            "date": f"strftime({local}, '%Y-%m-%d')",
        }[name]
        kind = "s" if name == "date" else "i"
        return self.define({kind: f"CASE WHEN {guard} THEN {part} END"}, x)


def _quote(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def _check_like_pattern(pattern: str) -> None:
    """Refuses a pattern whose `\\` escapes anything but %, _ or \\ (or ends it)."""
    escaped = False
    for char in pattern:
        if escaped and char not in "%_\\":
            raise ValueError("in a LIKE pattern, '\\' may only precede %, _ or \\")
        escaped = not escaped and char == "\\"
    if escaped:
        raise ValueError("a LIKE pattern cannot end with a lone '\\'")


def _path(e: exp.Expr) -> tuple[str, ...]:
    if isinstance(e, exp.Dot):
        return (*_path(e.this), e.expression.name)
    assert isinstance(e, exp.Column)
    return tuple(part.name for part in e.parts)


_ARITH: dict[type[exp.Expr], str] = {
    exp.Add: "+",
    exp.Sub: "-",
    exp.Mul: "*",
    exp.Div: "/",
    exp.Mod: "%",
}
_COMPARE: dict[type[exp.Expr], str] = {
    exp.EQ: "=",
    exp.NEQ: "<>",
    exp.LT: "<",
    exp.LTE: "<=",
    exp.GT: ">",
    exp.GTE: ">=",
}
_CASTS = {
    exp.DataType.Type.BIGINT: "i",
    exp.DataType.Type.DOUBLE: "d",
    exp.DataType.Type.TEXT: "s",
    exp.DataType.Type.BOOLEAN: "b",
}
_FUNCTIONS: dict[type[exp.Expr], tuple[str, tuple[str, ...], int]] = {
    exp.Lower: ("lower", ("this",), 1),
    exp.Upper: ("upper", ("this",), 1),
    exp.Length: ("length", ("this",), 1),
    exp.Trim: ("trim", ("this",), 1),
    exp.Substring: ("substr", ("this", "start", "length"), 2),
    exp.Abs: ("abs", ("this",), 1),
    exp.Round: ("round", ("this",), 1),
    exp.Floor: ("floor", ("this",), 1),
    exp.Ceil: ("ceil", ("this",), 1),
}
"""sqlglot's node of each function: (its name, its arguments in order, how many required)."""
_HANDLERS: dict[type[exp.Expr], Callable[[_Translator, Any], _Value]] = {
    exp.Paren: lambda t, e: t.value(e.this),
    exp.Column: _Translator.column,
    exp.Dot: _Translator.column,
    exp.Literal: _Translator.literal,
    exp.Boolean: lambda t, e: t.constant(bool(e.this)),
    exp.Null: lambda t, e: t.constant(None),
    exp.Neg: _Translator.negate,
    **dict.fromkeys(_ARITH, _Translator.arith),
    **dict.fromkeys(_COMPARE, _Translator.compare),
    exp.And: _Translator.logic,
    exp.Or: _Translator.logic,
    exp.Not: _Translator.not_,
    exp.Is: _Translator.is_,
    exp.In: _Translator.in_,
    exp.Between: _Translator.between,
    exp.Like: _Translator.like,
    exp.Case: _Translator.case,
    exp.Coalesce: _Translator.coalesce,
    exp.Cast: _Translator.cast,
    **dict.fromkeys(_FUNCTIONS, _Translator.function),
    exp.Anonymous: _Translator.anonymous,
}


def _parse(text: str) -> exp.Expr:
    trees = sqlglot.parse(text, dialect=_Dialect)
    if len(trees) != 1 or trees[0] is None:
        raise ValueError(f"not one expression: {text!r}")
    return trees[0]


def _typed_parts(raw: Any) -> tuple[bool | None, int | None, float | None, str | None]:
    """A decoded JSON value as its (BOOLEAN, BIGINT, DOUBLE, STRING) slots: a string or a
    boolean is itself; an integer within 64 bits is a BIGINT, any other finite number a DOUBLE
    (an integer beyond 64 bits rounded to the nearest double); anything else (null, objects,
    arrays, a missing field, a number beyond a double's range) is NULL."""
    if type(raw) is str:
        return None, None, None, raw
    if type(raw) is bool:
        return raw, None, None, None
    if type(raw) is int:
        if _BIGINT_MIN <= raw <= _BIGINT_MAX:
            return None, raw, None, None
        try:
            return None, None, float(raw), None
        except OverflowError:
            return None, None, None, None
    if type(raw) is float and math.isfinite(raw):
        return None, None, raw, None
    return None, None, None, None


def _read(event: Mapping[str, Any], path: tuple[str, ...]) -> Any:
    """The JSON value at a dotted path; None (NULL) where a step is missing or no object."""
    node: Any = event
    for part in path:
        if type(node) is not dict or part not in node:
            return None
        node = node[part]
    return node


def _events_table(
    events: Sequence[tuple[dict[str, Any], int]], paths: Mapping[tuple[str, ...], str]
) -> pa.Table:
    columns: dict[str, pa.Array] = {
        "r": pa.array(range(len(events)), pa.int64()),
        "t": pa.array([time_ms for _, time_ms in events], pa.int64()),
    }
    for path, prefix in paths.items():
        parts = [_typed_parts(_read(event, path)) for event, _ in events]
        for index, kind in enumerate(_KINDS):
            columns[prefix + kind] = pa.array([p[index] for p in parts], _ARROW_TYPES[kind])
    return pa.table(columns)


def _scalar(slots: Sequence[Any]) -> Scalar:
    """The one non-NULL slot of a value (None when all are NULL): DuckDB hands BOOLEAN,
    BIGINT, DOUBLE and VARCHAR back as bool, int, float and str."""
    present = [v for v in slots if v is not None]
    if len(present) > 1:
        raise AssertionError(f"a value with several kinds: {present}")
    return present[0] if present else None


@cache
def _database() -> duckdb.DuckDBPyConnection:
    """One in-memory DuckDB for the process (opening one costs more than a small evaluation);
    each evaluation runs on a cursor of its own, so none sees another's events."""
    return duckdb.connect(":memory:")


def evaluate(
    fields: Mapping[str, str],
    where: str | None,
    time_field: str,
    events: Sequence[tuple[dict[str, Any], int]],
) -> list[tuple[bool, dict[str, Scalar]]]:
    """Per event (its decoded JSON object, its event time in epoch ms): whether `where` is TRUE
    (True when there is none) and the value of each computed field. A computed field may read
    others by name (no cycles) and hides a raw field or the time field of its name; any other
    name is `time_field` (the event time, BIGINT) or a dotted path into the JSON. All events
    are evaluated by one query on an in-memory DuckDB; an expression outside the language is
    a ValueError."""
    translator = _Translator(time_field, {name: _parse(text) for name, text in fields.items()})
    values = [translator.computed_field(name) for name in fields]
    condition = None if where is None else translator.value(_parse(where))
    query = "SELECT * FROM events"
    for definitions in translator.layers:
        if definitions:
            query = f"SELECT *, {', '.join(definitions)} FROM ({query})"
    outputs = ["TRUE" if condition is None else f"COALESCE({_slot(condition, 'b')}, FALSE)"]
    for value in values:
        outputs.extend(value.slots.values())
    query = f"SELECT {', '.join(outputs)} FROM ({query}) ORDER BY r"
    with _database().cursor() as con:
        con.execute("SET TimeZone = 'UTC'")
        con.register("events", _events_table(events, translator.paths))
        rows = con.execute(query).fetchall()
    results = []
    for row in rows:
        computed: dict[str, Scalar] = {}
        column = 1
        for name, value in zip(fields, values, strict=True):
            width = len(value.slots)
            computed[name] = _scalar(row[column : column + width])
            column += width
        results.append((bool(row[0]), computed))
    return results
