"""The typed syntax tree of a metric's expressions (rule 10 in docs/semantics.md).

A parsed expression is a tree of frozen nodes. Each node knows `kinds`: the value kinds it can
produce (its static type). A raw JSON field can hold any kind, so a node over one can produce
several; a node whose `kinds` is empty is always NULL. The compilers (`evaluate` for Python,
`batch_layer.expressions` for Spark) read only this tree: the SQL text is parsed once.

Sugar is removed by the parser, with SQL's meaning kept: `x BETWEEN a AND b` is
`x >= a AND x <= b`, `x IN (a, b)` is `x = a OR x = b`, `CASE x WHEN v ...` compares `x = v`,
`x NOT ...` is `NOT (x ...)`.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass


class Kind(enum.Enum):
    """A value kind; NULL is the absence of a value, not a kind."""

    BOOLEAN = "BOOLEAN"
    BIGINT = "BIGINT"
    DOUBLE = "DOUBLE"
    STRING = "STRING"


Kinds = frozenset[Kind]
ANY: Kinds = frozenset(Kind)
NUMBERS: Kinds = frozenset({Kind.BIGINT, Kind.DOUBLE})
BOOLEAN: Kinds = frozenset({Kind.BOOLEAN})
BIGINT: Kinds = frozenset({Kind.BIGINT})
DOUBLE: Kinds = frozenset({Kind.DOUBLE})
STRING: Kinds = frozenset({Kind.STRING})
NOTHING: Kinds = frozenset()

Scalar = bool | int | float | str | None
"""A value as both the evaluator and literals hold it: None is NULL, bool BOOLEAN, int BIGINT
(within 64 bits), float DOUBLE (finite), str STRING."""

MIN_EVENT_MS = -62_135_596_800_000
MAX_EVENT_MS = 253_402_300_799_999
"""Epoch ms of 0001-01-01T00:00:00.000Z and 9999-12-31T23:59:59.999Z: Python's datetime range,
so every valid event time (and every instant a date part reads) is also a valid Spark and
PostgreSQL timestamp."""
BIGINT_MIN = -(2**63)
BIGINT_MAX = 2**63 - 1


@dataclass(frozen=True, slots=True)
class Literal:
    value: Scalar

    @property
    def kinds(self) -> Kinds:
        if self.value is None:
            return NOTHING
        return frozenset({_KIND_OF[type(self.value)]})


_KIND_OF = {bool: Kind.BOOLEAN, int: Kind.BIGINT, float: Kind.DOUBLE, str: Kind.STRING}


@dataclass(frozen=True, slots=True)
class Field:
    """A field of the event's JSON, by its path (`geo.country` is ("geo", "country"))."""

    path: tuple[str, ...]
    kinds: Kinds = ANY


@dataclass(frozen=True, slots=True)
class EventTime:
    """The source's time field: the event time in epoch milliseconds, however it was spelled."""

    kinds: Kinds = BIGINT


@dataclass(frozen=True, slots=True)
class Computed:
    """A reference to another computed field of the same metric, evaluated once per event."""

    name: str
    kinds: Kinds


class ArithOp(enum.Enum):
    ADD = "+"
    SUB = "-"
    MUL = "*"
    DIV = "/"
    MOD = "%"


class CompareOp(enum.Enum):
    EQ = "="
    NE = "<>"
    LT = "<"
    LE = "<="
    GT = ">"
    GE = ">="


@dataclass(frozen=True, slots=True)
class Arith:
    op: ArithOp
    left: Node
    right: Node
    kinds: Kinds


@dataclass(frozen=True, slots=True)
class Negate:
    operand: Node
    kinds: Kinds


@dataclass(frozen=True, slots=True)
class Compare:
    op: CompareOp
    left: Node
    right: Node
    kinds: Kinds = BOOLEAN


@dataclass(frozen=True, slots=True)
class And:
    left: Node
    right: Node
    kinds: Kinds = BOOLEAN


@dataclass(frozen=True, slots=True)
class Or:
    left: Node
    right: Node
    kinds: Kinds = BOOLEAN


@dataclass(frozen=True, slots=True)
class Not:
    operand: Node
    kinds: Kinds = BOOLEAN


@dataclass(frozen=True, slots=True)
class IsNull:
    operand: Node
    kinds: Kinds = BOOLEAN


@dataclass(frozen=True, slots=True)
class LikePattern:
    """A LIKE pattern, split into literal runs and wildcards: `%` any run of characters
    (possibly none), `_` exactly one character (a Unicode code point)."""

    parts: tuple[str, ...]
    """Literal text, or the wildcards "%" and "_" as parts of their own (see `wildcard`)."""
    wildcard: tuple[bool, ...]
    """Whether each part is a wildcard (a literal part may itself be "%" after an escape)."""


@dataclass(frozen=True, slots=True)
class Like:
    operand: Node
    pattern: LikePattern
    kinds: Kinds = BOOLEAN


@dataclass(frozen=True, slots=True)
class Case:
    branches: tuple[tuple[Node, Node], ...]
    """(condition, result): the first whose condition is TRUE gives the value."""
    default: Node
    kinds: Kinds


@dataclass(frozen=True, slots=True)
class Coalesce:
    operands: tuple[Node, ...]
    kinds: Kinds


@dataclass(frozen=True, slots=True)
class Cast:
    operand: Node
    to: Kind

    @property
    def kinds(self) -> Kinds:
        return frozenset({self.to})


class Function(enum.Enum):
    """The functions of the language; `kinds` of a call is decided by the parser."""

    LOWER = "lower"
    UPPER = "upper"
    LENGTH = "length"
    SUBSTR = "substr"
    TRIM = "trim"
    ABS = "abs"
    ROUND = "round"
    FLOOR = "floor"
    CEIL = "ceil"
    HOUR = "hour"
    DAY_OF_WEEK = "day_of_week"
    DATE = "date"


TIME_FUNCTIONS = frozenset({Function.HOUR, Function.DAY_OF_WEEK, Function.DATE})


@dataclass(frozen=True, slots=True)
class Call:
    function: Function
    args: tuple[Node, ...]
    kinds: Kinds
    zone: str | None = None
    """The IANA zone of a date-part function (None: UTC)."""


Node = (
    Literal
    | Field
    | EventTime
    | Computed
    | Arith
    | Negate
    | Compare
    | And
    | Or
    | Not
    | IsNull
    | Like
    | Case
    | Coalesce
    | Cast
    | Call
)


def children(node: Node) -> tuple[Node, ...]:
    """The direct sub-expressions of `node`."""
    match node:
        case Arith() | Compare() | And() | Or():
            return (node.left, node.right)
        case Negate() | Not() | IsNull() | Like() | Cast():
            return (node.operand,)
        case Case():
            return (*(n for branch in node.branches for n in branch), node.default)
        case Coalesce():
            return node.operands
        case Call():
            return node.args
    return ()


def walk(node: Node) -> list[Node]:
    """`node` and every node below it, parents first."""
    nodes = [node]
    for child in children(node):
        nodes.extend(walk(child))
    return nodes
