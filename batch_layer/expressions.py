"""Metric expressions (rule 10 in docs/semantics.md) as Spark columns, with no Python UDF.

`compile_value` turns a typed tree (`shared.expressions.syntax`) into column expressions that
give, on every event, exactly what the Python evaluator (`shared.expressions.evaluate`, the
reference) gives. A value of the language can be of a different kind on each event (a raw
JSON field can hold anything), so a compiled value is up to four columns, one per kind, at most
one of them non-null on a row (`SparkValue`); the node's static `kinds` prune the parts it can
never have.

Nothing here may raise at runtime, whether `spark.sql.ansi.enabled` is on (Spark 4's default)
or off: every operation that ANSI mode would fail (integer overflow, division by zero, a cast
out of range or of bad text) is a `try_*` function, or its input is first made NULL where the
language's answer is NULL, so the raising case is never evaluated (not even by constant
folding, which evaluates a whole foldable sub-tree at once, guards included).

Each sub-expression's parts are named columns of a projection stage (`Stages`), so a parent
reads a child by name however many times it needs it: inlined, a parent that reads a child
part several times (a guard and a value, a DOUBLE and a BIGINT part) makes the column tree
exponential in the nesting depth (measured on a 6-level arithmetic over raw fields: 94,000
characters of SQL, a 190,000-character plan, 39 s to run one row and a failed code generation;
staged: 2,900 characters, 1.6 s). A short sub-expression is written into its parent instead
(`_INLINE_CHARS`), so a typical expression needs a stage or two, and Spark's optimizer
collapses stages again where that duplicates nothing costly. The expressions are Spark SQL
text, one `selectExpr` per stage: built with the Column API, every operator is a dozen Py4J
round trips, which made compiling a few hundred expressions take seconds. The text depends on
no parser setting: identifiers are back-quoted, and every string and typed constant is a CAST
of a literal without quotes or backslashes inside.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from shared.expressions.syntax import (
    TIME_FUNCTIONS,
    And,
    Arith,
    ArithOp,
    Call,
    Case,
    Cast,
    Coalesce,
    Compare,
    CompareOp,
    Computed,
    EventTime,
    Field,
    Function,
    IsNull,
    Kind,
    Like,
    LikePattern,
    Literal,
    Negate,
    Node,
    Not,
    Or,
    Scalar,
    children,
)

Sql = str
"""A Spark SQL expression."""

_PARTS = {
    Kind.BOOLEAN: "boolean",
    Kind.BIGINT: "bigint",
    Kind.DOUBLE: "double",
    Kind.STRING: "string",
}
"""Each kind's `SparkValue` field, which is also its Spark SQL type."""


@dataclass(frozen=True, eq=False)
class SparkValue:
    """A value as up to four columns, one per kind; at most one is non-null on a row, and all
    are null where the value is NULL. A part that is None is statically NULL (the node can
    never have that kind). Equal only to itself (columns do not compare)."""

    boolean: Column | None = None
    bigint: Column | None = None
    double: Column | None = None
    string: Column | None = None
    level: int = field(default=0, kw_only=True)
    """The first projection stage (`Stages`) whose expressions can read these columns; 0 for
    columns of the input frame."""

    def part(self, kind: Kind) -> Column | None:
        part: Column | None = getattr(self, _PARTS[kind])
        return part


def text_of(value: SparkValue) -> Column:
    """A value's canonical text (`shared.events.canonical`), as a key dimension reads it: a
    STRING itself, a BIGINT its decimal text, anything else NULL."""
    return _part_or_bigint(value.string, value.bigint, "string")


def number_of(value: SparkValue) -> Column:
    """A value's number, as the value field reads it: a DOUBLE, a BIGINT as DOUBLE, anything
    else NULL."""
    return _part_or_bigint(value.double, value.bigint, "double")


def _part_or_bigint(part: Column | None, bigint: Column | None, kind: str) -> Column:
    present = [c for c in (part, None if bigint is None else bigint.cast(kind)) if c is not None]
    return F.coalesce(*present) if present else F.lit(None).cast(kind)


def is_true(value: SparkValue) -> Column:
    """A `where` condition: TRUE only where the value is BOOLEAN true, never NULL."""
    if value.boolean is None:
        return F.lit(False)
    return F.coalesce(value.boolean, F.lit(False))


@dataclass(frozen=True)
class _Value:
    """A compiled value inside the compiler: each part's SQL and the first stage whose
    expressions can read what it reads; `named` when the parts are columns of a stage."""

    parts: Mapping[Kind, Sql]
    level: int = 0
    named: bool = False

    def part(self, kind: Kind) -> Sql | None:
        return self.parts.get(kind)

    def is_not_null(self) -> Sql | None:
        """Whether the value is non-NULL on a row; None when it never is."""
        return _any(f"{part} IS NOT NULL" for part in self.parts.values())


class Stages:
    """The projection stages of compiled expressions. Stage n names the columns given as
    inputs at level n (raw fields, the time, offsets, computed fields), then adds the parts
    of every sub-expression whose inputs are all of level n or below, as columns of level
    n + 1. `apply` the stages to the frame the inputs are read from, then read the compiled
    values from the result. Several expressions (a metric's computed fields and its filter)
    share one `Stages`, so their stages run side by side. Column names start with `prefix`:
    the frame must have no such columns.

    An input is named once per `SparkValue` object, so giving the same object for every use
    of a field names it once, and a value `compile_value` returned is read by the names it
    already has when it is given back as a computed field."""

    def __init__(self, prefix: str = "_x") -> None:
        self._prefix = prefix
        self._inputs: list[list[Column]] = []
        self._exprs: list[list[Sql]] = []
        self._named: dict[SparkValue, _Value] = {}
        self._count = 0

    def apply(self, frame: DataFrame) -> DataFrame:
        """`frame` with every stage's columns added, in order (one `selectExpr` for a
        stage's expressions: a Py4J call per column would cost more than Spark's work)."""
        for inputs, exprs in zip(self._inputs, self._exprs, strict=True):
            if inputs:
                frame = frame.select("*", *inputs)
            if exprs:
                frame = frame.selectExpr("*", *exprs)
        return frame

    def _column(self, kind: Kind, stage: int) -> str:
        """The name of a new column of `stage`."""
        while len(self._exprs) <= stage:
            self._inputs.append([])
            self._exprs.append([])
        self._count += 1
        return f"{self._prefix}{self._count}_{_PARTS[kind]}"

    def _bind(self, parts: Mapping[Kind, Sql], level: int) -> _Value:
        """`parts`, reading columns of `level` or below, as columns of `level + 1`."""
        named = {kind: _quoted(self._column(kind, level)) for kind in parts}
        self._exprs[level].extend(f"{parts[kind]} AS {name}" for kind, name in named.items())
        return _Value(named, level + 1, named=True)

    def _input(self, value: SparkValue) -> _Value:
        named = self._named.get(value)
        if named is None:
            names: dict[Kind, Sql] = {}
            for kind in Kind:
                part = value.part(kind)
                if part is not None:
                    name = self._column(kind, value.level)
                    self._inputs[value.level].append(part.alias(name))
                    names[kind] = _quoted(name)
            named = self._named[value] = _Value(names, value.level, named=True)
        return named

    def _output(self, value: _Value) -> SparkValue:
        """A compiled value as columns of a stage (so that it can be read like any input,
        by the caller or as a computed field), remembered as their names."""
        if value.parts and not value.named:
            value = self._bind(value.parts, value.level)
        columns = {_PARTS[kind]: F.expr(sql) for kind, sql in value.parts.items()}
        result = SparkValue(**columns, level=value.level)
        self._named[result] = value
        return result


def _quoted(name: str) -> Sql:
    return "`" + name.replace("`", "``") + "`"


ZoneOffset = Callable[[Field | EventTime, str], Column]
"""The UTC offset (BIGINT ms) of a zone at the instant a date part's argument holds, as
`evaluate.zone_offset_ms` gives it from Python's tz database, computed beside the event (the
JVM's tz database may differ): NULL where the argument is no instant of the years 1-9999."""


def compile_value(
    node: Node,
    raw: Callable[[tuple[str, ...]], SparkValue],
    computed: Callable[[str], SparkValue],
    time_ms: Column,
    zone_offset: ZoneOffset,
    stages: Stages,
) -> SparkValue:
    """The columns of `node`'s value: columns of `stages`, read once they are applied.

    `raw(path)` gives a raw JSON field's parts (the evaluator's `from_json(read_path(...))`
    split by kind), `computed(name)` an already compiled computed field's value (compiled
    into the same `stages`), `time_ms` the event time (BIGINT epoch ms) and `zone_offset`
    the offsets the date parts with a zone read. A sub-tree repeated in `node` (the subject of
    `IN` and `BETWEEN` is) is compiled once."""
    compiler = _Compiler(raw, computed, time_ms, zone_offset, stages)
    return stages._output(compiler.value(node))


_INLINE_CHARS = 400
"""A value whose SQL is at most this long is written into its parents rather than named in a
stage: a parent repeats a child part at most ten times (`round`), so no SQL grows beyond ten
times this, and a typical expression needs a stage or two instead of one per level."""


class _Compiler:
    def __init__(
        self,
        raw: Callable[[tuple[str, ...]], SparkValue],
        computed: Callable[[str], SparkValue],
        time_ms: Column,
        zone_offset: ZoneOffset,
        stages: Stages,
    ) -> None:
        self._raw = raw
        self._computed = computed
        self._time_ms = time_ms
        self._zone_offset = zone_offset
        self._stages = stages
        self._done: dict[str, _Value] = {}
        """Compiled sub-trees by their repr, which tells `1` from `TRUE` and `0.0` from `-0.0`
        (equality of the frozen nodes does not)."""

    def value(self, node: Node) -> _Value:
        key = repr(node)
        done = self._done.get(key)
        if done is None:
            done = self._done[key] = self._compile(node)
        return done

    def _compile(self, node: Node) -> _Value:
        match node:
            case Literal(value=value):
                return _Value({} if value is None else {_KIND_OF[type(value)]: _constant(value)})
            case Field(path=path):
                return self._stages._input(self._raw(path))
            case EventTime():
                return self._stages._input(SparkValue(bigint=self._time_ms))
            case Computed(name=name):
                return self._stages._input(self._computed(name))
        level = max((self.value(child).level for child in children(node)), default=0)
        parts = {k: c for k, c in self._parts(node).items() if k in node.kinds and c is not None}
        if sum(len(sql) for sql in parts.values()) <= _INLINE_CHARS:
            return _Value(parts, level)
        return self._stages._bind(parts, level)

    def _parts(self, node: Node) -> Mapping[Kind, Sql | None]:
        """The parts of a non-leaf node, from its children's values."""
        match node:
            case Arith(op=op, left=left, right=right):
                return _arith(op, self.value(left), self.value(right))
            case Negate(operand=operand):
                a = self.value(operand)
                return {
                    Kind.BIGINT: _map(a.part(Kind.BIGINT), lambda x: f"try_subtract(0L, {x})"),
                    Kind.DOUBLE: _map(a.part(Kind.DOUBLE), lambda x: f"negative({x})"),
                }
            case Compare(op=op, left=left, right=right):
                return {Kind.BOOLEAN: _compare(op, self.value(left), self.value(right))}
            case And(left=left, right=right):
                return {Kind.BOOLEAN: f"({self._truth(left)} AND {self._truth(right)})"}
            case Or(left=left, right=right):
                return {Kind.BOOLEAN: f"({self._truth(left)} OR {self._truth(right)})"}
            case Not(operand=operand):
                return {Kind.BOOLEAN: f"(NOT {self._truth(operand)})"}
            case IsNull(operand=operand):
                present = self.value(operand).is_not_null()
                return {Kind.BOOLEAN: "TRUE" if present is None else f"(NOT {present})"}
            case Like(operand=operand, pattern=pattern):
                regex = _constant(_like_regex(pattern))
                text = self.value(operand).part(Kind.STRING)
                return {Kind.BOOLEAN: _map(text, lambda s: f"rlike({s}, {regex})")}
            case Case(branches=branches, default=default):
                choices = [(self.value(c).part(Kind.BOOLEAN), self.value(r)) for c, r in branches]
                return _choose(choices, self.value(default))
            case Coalesce(operands=operands):
                values = [self.value(o) for o in operands]
                return _choose([(v.is_not_null(), v) for v in values[:-1]], values[-1])
            case Cast(operand=operand, to=to):
                return {to: _cast(self.value(operand), to)}
            case Call(function=function, args=args, zone=zone):
                return _call(function, [self.value(a) for a in args], self._offset(args[0], zone))
        raise AssertionError(f"no Spark compilation for {node!r}")

    def _offset(self, instant: Node, zone: str | None) -> Sql:
        """The offset of a date part's zone at `instant` (0 for UTC, and for the functions
        that take no zone)."""
        if zone is None:
            return "0L"
        assert isinstance(instant, Field | EventTime), "the parser allows only these"
        offset = self._stages._input(SparkValue(bigint=self._zone_offset(instant, zone)))
        return offset.parts[Kind.BIGINT]

    def _truth(self, node: Node) -> Sql:
        """An operand of AND/OR/NOT: its BOOLEAN part (any other kind is NULL)."""
        part = self.value(node).part(Kind.BOOLEAN)
        return _null(Kind.BOOLEAN) if part is None else part


_KIND_OF = {bool: Kind.BOOLEAN, int: Kind.BIGINT, float: Kind.DOUBLE, str: Kind.STRING}


def _constant(value: Scalar) -> Sql:
    """A constant as SQL that reads the same under every parser setting (a string as UTF-8
    bytes in hex: no quote or backslash to escape; numbers as the CAST of their exact text)."""
    match value:
        case bool():
            return "TRUE" if value else "FALSE"
        case int():
            return f"CAST('{value}' AS BIGINT)"
        case float():
            return f"CAST('{value!r}' AS DOUBLE)"
        case str():
            return f"CAST(X'{value.encode().hex()}' AS STRING)"
    raise AssertionError(f"no constant for {value!r}")


def _null(kind: Kind) -> Sql:
    return f"CAST(NULL AS {_PARTS[kind]})"


def _map(part: Sql | None, function: Callable[[Sql], Sql]) -> Sql | None:
    """`function` of a part, statically NULL when the part is."""
    return None if part is None else function(part)


def _first(parts: Iterable[Sql | None]) -> Sql | None:
    """The first non-null of the parts that are not statically NULL."""
    present = [p for p in parts if p is not None]
    if len(present) <= 1:
        return present[0] if present else None
    return f"coalesce({', '.join(present)})"


def _any(conditions: Iterable[Sql]) -> Sql | None:
    """The OR of conditions (None when there are none)."""
    present = list(conditions)
    return f"({' OR '.join(present)})" if present else None


def _where(condition: Sql, x: Sql) -> Sql:
    """`x` where `condition` is TRUE, else NULL: applied to the input of an operation that
    would fail on the rows it excludes."""
    return f"CASE WHEN {condition} THEN {x} END"


_DOUBLE_MAX = _constant(sys.float_info.max)
_TWO_52 = _constant(2.0**52)
_TWO_63 = _constant(2.0**63)
_MINUS_TWO_63 = _constant(-(2.0**63))
_INT_MAX = "2147483647L"
_EVENT_MS_RANGE = "-62135596800000L AND 253402300799999L"
"""Epoch ms of 0001-01-01T00:00:00.000 and 9999-12-31T23:59:59.999: Python's datetime range,
outside which the evaluator's date parts are NULL (in UTC and in the zone alike)."""
_INTEGER_TEXT = _constant(r"\A[+-]?[0-9]+\z")
_DECIMAL_TEXT = _constant(r"\A[+-]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?\z")
"""The evaluator's `_INTEGER_TEXT`/`_DECIMAL_TEXT` as Java regexes matched whole (`\\z`, not `$`,
which also matches before a final line break). Spark's casts accept more (surrounding
whitespace, a fraction when casting to BIGINT, `1d`, `Infinity`), so only text that matches is
cast."""


def _finite(x: Sql) -> Sql:
    """A DOUBLE result, NULL when not finite (NaN is above every number in Spark's order)."""
    return _where(f"abs({x}) <= {_DOUBLE_MAX}", x)


def _in_bigint_range(x: Sql) -> Sql:
    """A DOUBLE where it truncates to a BIGINT, [-2^63, 2^63), else NULL (Spark's cast would
    saturate at 2^63, the largest double not above BIGINT_MAX, instead)."""
    return _where(f"{x} >= {_MINUS_TWO_63} AND {x} < {_TWO_63}", x)


def _as_double(value: _Value) -> Sql | None:
    """A numeric value as DOUBLE (a BIGINT converted, rounding to nearest as Python does)."""
    bigint = _map(value.part(Kind.BIGINT), lambda x: f"CAST({x} AS DOUBLE)")
    return _first([value.part(Kind.DOUBLE), bigint])


_BIGINT_ARITH = {
    ArithOp.ADD: "+",
    ArithOp.SUB: "-",
    ArithOp.MUL: "*",
}
"""BIGINT `+ - *`: exact in DECIMAL (any two BIGINTs' sum fits 20 digits, their product 38),
then NULL unless the result fits a BIGINT. Not `try_add`/`try_multiply`: Spark's optimizer
reorders integral `+` and `*` chains to fold their constants together
(ReorderAssociativeOperator, which ignores the `try_` evaluation mode), which changes where an
overflow happens: `try_add(try_add(9223372036854775807, ts), b)` with ts = -1 and b = -2^63 is
-2 but Spark answers NULL, having computed `(ts + b) + 9223372036854775807`."""
_DOUBLE_ARITH = {
    ArithOp.ADD: "try_add",
    ArithOp.SUB: "try_subtract",
    ArithOp.MUL: "try_multiply",
    ArithOp.DIV: "try_divide",
    ArithOp.MOD: "try_mod",
}
"""IEEE operations (the `try_` forms never fail on DOUBLEs); division and `%` (Java's `%` on
doubles is C's fmod) are NULL for a zero divisor, -0.0 included."""


def _bigint_arith(op: ArithOp, x: Sql, y: Sql) -> Sql:
    """`x op y` of two BIGINTs, NULL on overflow; `%` is Java's (truncated: the dividend's
    sign, and `-2^63 % -1` is 0, as in the evaluator), NULL by zero."""
    if op is ArithOp.MOD:
        return f"try_mod({x}, {y})"
    exact = f"CAST({x} AS DECIMAL(19, 0)) {_BIGINT_ARITH[op]} CAST({y} AS DECIMAL(19, 0))"
    return f"TRY_CAST({exact} AS BIGINT)"


def _arith(op: ArithOp, a: _Value, b: _Value) -> dict[Kind, Sql | None]:
    """BIGINT when both are BIGINT (except `/`), else DOUBLE, as `evaluate.arith`."""
    parts: dict[Kind, Sql | None] = {}
    x, y = a.part(Kind.BIGINT), b.part(Kind.BIGINT)
    if op is not ArithOp.DIV and x is not None and y is not None:
        parts[Kind.BIGINT] = _bigint_arith(op, x, y)
    x, y = _as_double(a), _as_double(b)
    if x is not None and y is not None:
        result = _finite(f"{_DOUBLE_ARITH[op]}({x}, {y})")
        doubles = [f"{p} IS NOT NULL" for p in (a.part(Kind.DOUBLE), b.part(Kind.DOUBLE)) if p]
        if op is ArithOp.DIV:
            parts[Kind.DOUBLE] = result
        elif doubles:
            parts[Kind.DOUBLE] = _where(" OR ".join(doubles), result)
    return parts


_COMPARE = {
    CompareOp.EQ: "=",
    CompareOp.NE: "<>",
    CompareOp.LT: "<",
    CompareOp.LE: "<=",
    CompareOp.GT: ">",
    CompareOp.GE: ">=",
}


def _compare(op: CompareOp, a: _Value, b: _Value) -> Sql | None:
    """Same kinds compare (strings by UTF-8 bytes, which is code point order; FALSE < TRUE;
    -0.0 = 0.0); two BIGINTs exactly, a BIGINT and a DOUBLE as DOUBLEs; any other pair is
    NULL. The pairs exclude each other on a row, except two BIGINTs, which the exact
    comparison, first, answers."""
    pairs = [(a.part(k), b.part(k)) for k in (Kind.BOOLEAN, Kind.STRING, Kind.BIGINT)]
    pairs.append((_as_double(a), _as_double(b)))
    return _first(f"({x} {_COMPARE[op]} {y})" for x, y in pairs if x and y)


def _choose(branches: list[tuple[Sql | None, _Value]], default: _Value) -> dict[Kind, Sql]:
    """The value of the first branch whose condition is TRUE, else `default`, part by part
    (every part takes the same branch, so at most one is non-null). A statically NULL
    condition is never TRUE."""
    taken = [(condition, value) for condition, value in branches if condition is not None]
    parts: dict[Kind, Sql] = {}
    for kind in Kind:
        if all(v.part(kind) is None for v in [default, *(v for _, v in taken)]):
            continue
        whens = "".join(f" WHEN {c} THEN {v.part(kind) or _null(kind)}" for c, v in taken)
        otherwise = default.part(kind) or _null(kind)
        parts[kind] = f"CASE{whens} ELSE {otherwise} END" if whens else otherwise
    return parts


_CASTS: dict[tuple[Kind, Kind], Callable[[Sql], Sql]] = {
    (Kind.BOOLEAN, Kind.BIGINT): lambda b: f"CAST({b} AS BIGINT)",
    (Kind.DOUBLE, Kind.BIGINT): lambda x: f"TRY_CAST({_in_bigint_range(x)} AS BIGINT)",
    (Kind.STRING, Kind.BIGINT): lambda s: (
        f"TRY_CAST({_where(f'rlike({s}, {_INTEGER_TEXT})', s)} AS BIGINT)"
    ),
    (Kind.BOOLEAN, Kind.DOUBLE): lambda b: f"CAST({b} AS DOUBLE)",
    (Kind.BIGINT, Kind.DOUBLE): lambda x: f"CAST({x} AS DOUBLE)",
    (Kind.STRING, Kind.DOUBLE): lambda s: _finite(
        f"TRY_CAST({_where(f'rlike({s}, {_DECIMAL_TEXT})', s)} AS DOUBLE)"
    ),
    (Kind.BOOLEAN, Kind.STRING): lambda b: f"CAST({b} AS STRING)",
    (Kind.BIGINT, Kind.STRING): lambda x: f"CAST({x} AS STRING)",
    (Kind.BIGINT, Kind.BOOLEAN): lambda x: f"({x} <> 0L)",
    (Kind.DOUBLE, Kind.BOOLEAN): lambda x: f"({x} <> {_constant(0.0)})",
    (Kind.STRING, Kind.BOOLEAN): lambda s: (
        f"CASE {s} WHEN {_constant('true')} THEN TRUE WHEN {_constant('false')} THEN FALSE END"
    ),
}
"""`evaluate.cast` between two different kinds; a missing pair (DOUBLE to STRING) is NULL."""


def _cast(value: _Value, to: Kind) -> Sql | None:
    converted = [
        part if kind is to else _CASTS[kind, to](part) if (kind, to) in _CASTS else None
        for kind, part in value.parts.items()
    ]
    return _first(converted)


def _like_regex(pattern: LikePattern) -> str:
    """The pattern as a Java regex for `rlike` (which finds, so it is anchored with `\\A` and
    `\\z`): `.` matches any code point, line breaks included ((?s)); literal text is written
    as `\\x{...}` escapes but for ASCII letters and digits, so no character of it is syntax."""
    body = "".join(
        (".*" if part == "%" else ".")
        if wild
        else "".join(c if c.isascii() and c.isalnum() else f"\\x{{{ord(c):x}}}" for c in part)
        for part, wild in zip(pattern.parts, pattern.wildcard, strict=True)
    )
    return f"(?s)\\A{body}\\z"


def _round_half_away(x: Sql) -> Sql:
    """The integral DOUBLE nearest `x`, halves away from zero, computed exactly as
    `evaluate.round_half_away` does: below 2^52 in magnitude through the BIGINT floor and the
    exact fraction `x - floor(x)`; from 2^52 on every double is integral already. (Spark's
    `round` goes through the decimal text of the double, another algorithm.)"""
    low = f"floor({_where(f'abs({x}) < {_TWO_52}', x)})"
    fraction = f"({x} - CAST({low} AS DOUBLE))"
    half = _constant(0.5)
    up = f"({fraction} > {half} OR ({fraction} = {half} AND {x} > {_constant(0.0)}))"
    return f"coalesce(CAST({low} + CAST({up} AS BIGINT) AS DOUBLE), {x})"


def _substr(text: Sql, start: Sql, length: Sql | None) -> Sql:
    """1-based; NULL for a start below 1 or a negative length. Spark's positions are INT:
    a start or length beyond the longest string Spark holds (< 2^31 characters) is clamped to
    2^31 - 1, which takes the same characters."""
    position = f"CAST({_where(f'{start} >= 1L', f'least({start}, {_INT_MAX})')} AS INT)"
    if length is None:
        return f"substr({text}, {position})"
    count = f"CAST({_where(f'{length} >= 0L', f'least({length}, {_INT_MAX})')} AS INT)"
    return f"substr({text}, {position}, {count})"


def _date_part(function: Function, ms: Sql, offset: Sql) -> Sql:
    """hour (0-23), ISO day of week (1970-01-01 was a Thursday, 4) or 'YYYY-MM-DD' of the
    local time `ms + offset`, NULL unless both the instant and the local time are in the
    years 1-9999; by arithmetic on epoch ms (the divisions are of integers below 2^53 by day
    or hour lengths, so their floors are exact)."""
    local = f"try_add({_where(f'{ms} BETWEEN {_EVENT_MS_RANGE}', ms)}, {offset})"
    local = _where(f"{local} BETWEEN {_EVENT_MS_RANGE}", local)
    if function is Function.HOUR:
        return f"floor(pmod({local}, 86400000L) / 3600000L)"
    days = f"floor({local} / 86400000L)"
    if function is Function.DAY_OF_WEEK:
        return f"(pmod({days} + 3L, 7L) + 1L)"
    return f"CAST(date_from_unix_date(CAST({days} AS INT)) AS STRING)"


_ASCII_UPPER = _constant("ABCDEFGHIJKLMNOPQRSTUVWXYZ")
_ASCII_LOWER = _constant("abcdefghijklmnopqrstuvwxyz")
_TEXT: dict[Function, Callable[[Sql], Sql]] = {
    Function.LOWER: lambda s: f"translate({s}, {_ASCII_UPPER}, {_ASCII_LOWER})",
    Function.UPPER: lambda s: f"translate({s}, {_ASCII_LOWER}, {_ASCII_UPPER})",
    Function.TRIM: lambda s: f"trim({s})",
    Function.LENGTH: lambda s: f"CAST(char_length({s}) AS BIGINT)",
}
"""ASCII-only case mapping; `trim` removes only U+0020; `length` counts code points."""
_BIGINT_NUMERIC: dict[Function, Callable[[Sql], Sql]] = {
    Function.ABS: lambda x: f"CASE WHEN {x} < 0L THEN try_subtract(0L, {x}) ELSE {x} END",
    Function.ROUND: lambda x: x,
    Function.FLOOR: lambda x: x,
    Function.CEIL: lambda x: x,
}
_DOUBLE_NUMERIC: dict[Function, Callable[[Sql], Sql]] = {
    Function.ABS: lambda x: f"abs({x})",
    Function.ROUND: _round_half_away,
    Function.FLOOR: lambda x: f"floor({_in_bigint_range(x)})",
    Function.CEIL: lambda x: f"ceil({_in_bigint_range(x)})",
}
"""FLOOR and CEIL of a DOUBLE are BIGINT (Spark's too), NULL outside [-2^63, 2^63)."""


def _call(function: Function, args: list[_Value], offset: Sql) -> dict[Kind, Sql | None]:
    text, number = args[0].part(Kind.STRING), args[0].part(Kind.BIGINT)
    if function is Function.SUBSTR:
        start, *length = [a.part(Kind.BIGINT) for a in args[1:]]
        if text is None or start is None or None in length:
            return {}
        return {Kind.STRING: _substr(text, start, length[0] if length else None)}
    if function is Function.LENGTH:
        return {Kind.BIGINT: _map(text, _TEXT[function])}
    if function in _TEXT:
        return {Kind.STRING: _map(text, _TEXT[function])}
    if function in TIME_FUNCTIONS:
        kind = Kind.STRING if function is Function.DATE else Kind.BIGINT
        return {kind: _map(number, lambda ms: _date_part(function, ms, offset))}
    bigint = _map(number, _BIGINT_NUMERIC[function])
    double = _map(args[0].part(Kind.DOUBLE), _DOUBLE_NUMERIC[function])
    if function in (Function.FLOOR, Function.CEIL):
        return {Kind.BIGINT: _first([bigint, double])}
    return {Kind.BIGINT: bigint, Kind.DOUBLE: double}
