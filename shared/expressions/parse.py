"""SQL expression text -> the typed tree of `syntax`, checked once when the config loads.

sqlglot parses the text (a well-kept SQL parser with positions on every token); this module
maps the subset the language has (rule 10 in docs/semantics.md) onto `syntax` nodes, decides
every node's kinds and refuses, with the position, what can never make sense: an unknown
function, a wrong number of arguments, an operator whose operands can never have kinds it
takes (`'a' + 1`), a LIKE pattern that is not a literal, an unknown time zone, a literal out of
range. What only an event can tell (a field holding text where a number is wanted) is not an
error: it makes the sub-expression NULL when it happens.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import sqlglot
from sqlglot import exp, parser
from sqlglot.dialects.dialect import Dialect
from sqlglot.errors import ParseError, TokenError

from shared.errors import ConfigError
from shared.expressions.problems import parse_problem, token_problem
from shared.expressions.syntax import (
    ANY,
    BIGINT,
    BIGINT_MAX,
    BIGINT_MIN,
    BOOLEAN,
    NOTHING,
    NUMBERS,
    STRING,
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
    Kinds,
    Like,
    LikePattern,
    Literal,
    Negate,
    Node,
    Not,
    Or,
)
from shared.expressions.zones import zone_info

MAX_EXPRESSION_CHARS = 4096
"""The longest expression text; a longer one is a config error (and no real metric's)."""
MAX_DEPTH = 64
"""The deepest nesting of sub-expressions; deeper is a config error."""


class ExpressionError(ConfigError, ValueError):
    """An expression of the config that cannot be used: where it is, what is wrong, at which
    line and column of its text. A ValueError too, so the settings report it under its key."""

    def __init__(self, text: str, message: str, offset: int | None = None) -> None:
        self.text = text
        self.message = message
        self.offset = offset
        where = ""
        if offset is not None:
            line = text.count("\n", 0, offset) + 1
            column = offset - (text.rfind("\n", 0, offset) + 1) + 1
            where = f" at line {line}, column {column}"
        super().__init__(f"{message}{where} of {text!r}")


def _anonymous(name: str) -> Callable[[list[exp.Expr]], exp.Expr]:
    """A parser of `name(...)` that keeps every argument (checked by `_Builder.anonymous`)."""
    return lambda args: exp.Anonymous(this=name, expressions=args)


class _Dialect(Dialect):
    """Standard SQL as sqlglot's base dialect reads it (single-quoted strings, double-quoted
    identifiers), with the date-part functions taking their optional zone argument."""

    class Parser(parser.Parser):
        FUNCTIONS = {
            **parser.Parser.FUNCTIONS,
            **{f.value.upper(): _anonymous(f.value) for f in TIME_FUNCTIONS},
        }


_ARITH: dict[type[exp.Expr], ArithOp] = {
    exp.Add: ArithOp.ADD,
    exp.Sub: ArithOp.SUB,
    exp.Mul: ArithOp.MUL,
    exp.Div: ArithOp.DIV,
    exp.Mod: ArithOp.MOD,
}
_COMPARE: dict[type[exp.Expr], CompareOp] = {
    exp.EQ: CompareOp.EQ,
    exp.NEQ: CompareOp.NE,
    exp.LT: CompareOp.LT,
    exp.LTE: CompareOp.LE,
    exp.GT: CompareOp.GT,
    exp.GTE: CompareOp.GE,
}
_CASTS = {
    exp.DataType.Type.BIGINT: Kind.BIGINT,
    exp.DataType.Type.DOUBLE: Kind.DOUBLE,
    exp.DataType.Type.TEXT: Kind.STRING,
    exp.DataType.Type.BOOLEAN: Kind.BOOLEAN,
}
_FUNCTION_NODES: dict[type[exp.Expr], Function] = {
    exp.Lower: Function.LOWER,
    exp.Upper: Function.UPPER,
    exp.Length: Function.LENGTH,
    exp.Substring: Function.SUBSTR,
    exp.Trim: Function.TRIM,
    exp.Abs: Function.ABS,
    exp.Round: Function.ROUND,
    exp.Floor: Function.FLOOR,
    exp.Ceil: Function.CEIL,
}
_SIGNATURES: dict[Function, tuple[tuple[Kinds, ...], int]] = {
    Function.LOWER: ((STRING,), 1),
    Function.UPPER: ((STRING,), 1),
    Function.TRIM: ((STRING,), 1),
    Function.LENGTH: ((STRING,), 1),
    Function.SUBSTR: ((STRING, BIGINT, BIGINT), 2),
    Function.ABS: ((NUMBERS,), 1),
    Function.ROUND: ((NUMBERS,), 1),
    Function.FLOOR: ((NUMBERS,), 1),
    Function.CEIL: ((NUMBERS,), 1),
    Function.HOUR: ((BIGINT,), 1),
    Function.DAY_OF_WEEK: ((BIGINT,), 1),
    Function.DATE: ((BIGINT,), 1),
}
"""(argument kinds, how many are required) of each function; a date-part function also takes
a zone literal after its argument."""
_STRING_RESULTS = frozenset(
    {Function.LOWER, Function.UPPER, Function.TRIM, Function.SUBSTR, Function.DATE}
)
_INTEGER = re.compile(r"[0-9]+")


@dataclass(frozen=True)
class _Scope:
    """What names mean in an expression: the source's time field and the computed fields
    defined so far (with their kinds)."""

    time_field: str
    computed: Mapping[str, Kinds]


def parse_tree(text: str) -> exp.Expr:
    """sqlglot's tree of one expression, or an `ExpressionError` with the position."""
    if len(text) > MAX_EXPRESSION_CHARS:
        raise ExpressionError(text[:60] + "...", f"longer than {MAX_EXPRESSION_CHARS} characters")
    if not text.strip():
        raise ExpressionError(text, "empty expression")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise ExpressionError(
            text.encode("utf-8", "backslashreplace").decode(),
            "holds a character that is not Unicode text (a lone surrogate such as \\ud800)",
            exc.start,
        ) from None
    try:
        trees = sqlglot.parse(text, dialect=_Dialect)
    except ParseError as exc:
        first = exc.errors[0] if exc.errors else {}
        raise ExpressionError(
            text,
            parse_problem(str(first.get("description", exc))),
            _offset(text, first.get("line"), first.get("col")),
        ) from None
    except TokenError:
        raise ExpressionError(text, token_problem(text)) from None
    except RecursionError:
        raise ExpressionError(text, f"nested deeper than {MAX_DEPTH} levels") from None
    if len(trees) != 1 or trees[0] is None:
        raise ExpressionError(text, "write one expression (no ';')")
    tree = trees[0]
    if tree.depth > MAX_DEPTH or max((n.depth for n in tree.walk()), default=0) > MAX_DEPTH:
        raise ExpressionError(text, f"nested deeper than {MAX_DEPTH} levels")
    return tree


def _offset(text: str, line: object, col: object) -> int | None:
    """sqlglot's 1-based (line, column of a token's end) as an offset into `text`."""
    if not isinstance(line, int) or not isinstance(col, int):
        return None
    start = 0
    for _ in range(line - 1):
        start = text.find("\n", start) + 1
    return min(start + max(col - 1, 0), len(text))


def references(tree: exp.Expr) -> set[str]:
    """The one-part names an expression refers to (candidates for computed fields)."""
    return {
        column.parts[0].name
        for column in tree.find_all(exp.Column)
        if len(column.parts) == 1 and not isinstance(column.parent, exp.Dot)
    }


def build(text: str, tree: exp.Expr, scope: _Scope) -> Node:
    """The typed tree of `tree` (parsed from `text`) in `scope`."""
    try:
        return _Builder(text, scope).node(tree)
    except RecursionError:
        raise ExpressionError(text, f"nested deeper than {MAX_DEPTH} levels") from None


class _Builder:
    def __init__(self, text: str, scope: _Scope) -> None:
        self.text = text
        self.scope = scope

    def fail(self, node: exp.Expr, message: str) -> ExpressionError:
        return ExpressionError(self.text, message, _start(node))

    def node(self, e: exp.Expr) -> Node:
        handler = _HANDLERS.get(type(e))
        if handler is None:
            raise self.fail(e, f"{e.sql()!r} is not part of the expression language")
        return handler(self, e)

    def require(self, e: exp.Expr, node: Node, allowed: Kinds, what: str) -> Node:
        """`node` if it can have one of the `allowed` kinds (or is NULL), else an error."""
        if node.kinds and not node.kinds & allowed:
            raise self.fail(
                e,
                f"{what} takes {_names(allowed)}, but {e.sql()!r} is {_names(node.kinds)}",
            )
        return node

    def column(self, e: exp.Expr) -> Node:
        parts = _path(e)
        if any(not p for p in parts):
            raise self.fail(e, "a field name cannot be empty")
        if len(parts) == 1 and parts[0] in self.scope.computed:
            return Computed(parts[0], self.scope.computed[parts[0]])
        if parts == (self.scope.time_field,):
            return EventTime()
        return Field(parts)

    def literal(self, e: exp.Literal) -> Node:
        if e.is_string:
            return Literal(str(e.this))
        text = str(e.this)
        if _INTEGER.fullmatch(text):
            value = int(text)
            if value > BIGINT_MAX:
                raise self.fail(e, f"the integer {text} does not fit a BIGINT (64 bits)")
            return Literal(value)
        number = float(text)
        if not math.isfinite(number):
            raise self.fail(e, f"the number {text} does not fit a DOUBLE")
        return Literal(number)

    def negate(self, e: exp.Neg) -> Node:
        inner = e.this
        integer = isinstance(inner, exp.Literal) and not inner.is_string
        if integer and _INTEGER.fullmatch(inner.this):
            value = -int(inner.this)
            if value < BIGINT_MIN:
                raise self.fail(e, f"the integer {value} does not fit a BIGINT (64 bits)")
            return Literal(value)
        operand = self.require(e.this, self.node(e.this), NUMBERS, "unary -")
        return Negate(operand, operand.kinds & NUMBERS)

    def arith(self, e: exp.Binary) -> Node:
        op = _ARITH[type(e)]
        left = self.require(e.this, self.node(e.this), NUMBERS, op.value)
        right = self.require(e.expression, self.node(e.expression), NUMBERS, op.value)
        if not left.kinds or not right.kinds:
            return Arith(op, left, right, NOTHING)
        if op is ArithOp.DIV:
            kinds: Kinds = frozenset({Kind.DOUBLE})
        else:
            kinds = frozenset(
                Kind.BIGINT if a is Kind.BIGINT and b is Kind.BIGINT else Kind.DOUBLE
                for a in left.kinds & NUMBERS
                for b in right.kinds & NUMBERS
            )
        return Arith(op, left, right, kinds)

    def compare(self, e: exp.Binary) -> Node:
        return self.comparison(e, _COMPARE[type(e)], e.this, e.expression)

    def comparison(self, e: exp.Expr, op: CompareOp, a: exp.Expr, b: exp.Expr) -> Node:
        left, right = self.node(a), self.node(b)
        if (
            left.kinds
            and right.kinds
            and not any(_comparable(x, y) for x in left.kinds for y in right.kinds)
        ):
            raise self.fail(
                e,
                f"{op.value} compares {a.sql()!r} ({_names(left.kinds)}) with {b.sql()!r} "
                f"({_names(right.kinds)}): never comparable",
            )
        return Compare(op, left, right)

    def logic(self, e: exp.Expr) -> Node:
        left = self.require(e.this, self.node(e.this), BOOLEAN, type(e).__name__.upper())
        right = self.require(
            e.expression, self.node(e.expression), BOOLEAN, type(e).__name__.upper()
        )
        return And(left, right) if isinstance(e, exp.And) else Or(left, right)

    def not_(self, e: exp.Not) -> Node:
        return Not(self.require(e.this, self.node(e.this), BOOLEAN, "NOT"))

    def is_(self, e: exp.Is) -> Node:
        if not isinstance(e.expression, exp.Null):
            raise self.fail(e, "only IS NULL and IS NOT NULL are supported")
        return IsNull(self.node(e.this))

    def in_(self, e: exp.In) -> Node:
        if e.args.get("query") is not None or e.args.get("unnest") is not None or not e.expressions:
            raise self.fail(e, "IN takes a list of values: x IN (a, b)")
        result: Node | None = None
        for item in e.expressions:
            test = self.comparison(e, CompareOp.EQ, e.this, item)
            result = test if result is None else Or(result, test)
        assert result is not None
        return result

    def between(self, e: exp.Between) -> Node:
        low = self.comparison(e, CompareOp.GE, e.this, e.args["low"])
        high = self.comparison(e, CompareOp.LE, e.this, e.args["high"])
        return And(low, high)

    def like(self, e: exp.Like) -> Node:
        operand = self.require(e.this, self.node(e.this), STRING, "LIKE")
        pattern = e.expression
        if not (isinstance(pattern, exp.Literal) and pattern.is_string):
            raise self.fail(pattern, "a LIKE pattern must be a string literal")
        node: Node = Like(operand, self.like_pattern(pattern, str(pattern.this)))
        return Not(node) if e.args.get("negate") else node

    def like_pattern(self, e: exp.Expr, text: str) -> LikePattern:
        parts: list[str] = []
        wildcard: list[bool] = []
        literal: list[str] = []
        escaped = False
        for char in text:
            if escaped:
                if char not in "%_\\":
                    raise self.fail(e, "in a LIKE pattern, '\\' may only precede %, _ or \\")
                literal.append(char)
                escaped = False
            elif char == "\\":
                escaped = True
            elif char in "%_":
                if literal:
                    parts.append("".join(literal))
                    wildcard.append(False)
                    literal = []
                parts.append(char)
                wildcard.append(True)
            else:
                literal.append(char)
        if escaped:
            raise self.fail(e, "a LIKE pattern cannot end with a lone '\\'")
        if literal:
            parts.append("".join(literal))
            wildcard.append(False)
        return LikePattern(tuple(parts), tuple(wildcard))

    def case(self, e: exp.Case) -> Node:
        subject = e.this
        branches = []
        for branch in e.args.get("ifs") or []:
            if subject is not None:
                condition = self.comparison(branch, CompareOp.EQ, subject, branch.this)
            else:
                condition = self.require(branch.this, self.node(branch.this), BOOLEAN, "WHEN")
            branches.append((condition, self.node(branch.args["true"])))
        default_tree = e.args.get("default")
        default = Literal(None) if default_tree is None else self.node(default_tree)
        kinds = frozenset().union(*(r.kinds for _, r in branches), default.kinds)
        return Case(tuple(branches), default, kinds)

    def coalesce(self, e: exp.Coalesce) -> Node:
        operands = tuple(self.node(x) for x in [e.this, *e.expressions])
        return Coalesce(operands, frozenset().union(*(o.kinds for o in operands)))

    def cast(self, e: exp.Cast) -> Node:
        to = _CASTS.get(e.to.this)
        if to is None or e.to.expressions:
            raise self.fail(
                e, f"CAST to {e.to.sql()} is not supported: use BIGINT, DOUBLE, STRING or BOOLEAN"
            )
        operand = self.node(e.this)
        if to is Kind.STRING and operand.kinds == frozenset({Kind.DOUBLE}):
            raise self.fail(
                e, "a DOUBLE has no text (rule 10): CAST it AS BIGINT, or round it, first"
            )
        return Cast(operand, to)

    def function(self, e: exp.Expr) -> Node:
        function = _FUNCTION_NODES[type(e)]
        extra = {k for k, v in e.args.items() if v is not None and k not in _ARG_NAMES[function]}
        if extra:
            raise self.fail(e, f"{function.value} takes {_arity(function)}")
        trees = [e.args[name] for name in _ARG_NAMES[function] if e.args.get(name) is not None]
        return self.call(e, function, trees)

    def anonymous(self, e: exp.Anonymous) -> Node:
        name = str(e.this).lower()
        try:
            function = Function(name)
        except ValueError:
            raise self.fail(e, f"unknown function {e.this!r}") from None
        if function not in TIME_FUNCTIONS:
            raise self.fail(e, f"unknown function {e.this!r}")
        trees = list(e.expressions)
        zone = None
        if len(trees) == 2:
            zone_tree = trees.pop()
            if not (isinstance(zone_tree, exp.Literal) and zone_tree.is_string):
                raise self.fail(zone_tree, f"{name}'s zone must be a string literal")
            zone = str(zone_tree.this)
            if not known_zone(zone):
                raise self.fail(zone_tree, f"unknown time zone {zone!r}: use an IANA name")
        node = self.call(e, function, trees, zone)
        if zone is not None and not isinstance(node.args[0], EventTime | Field):  # type: ignore[union-attr]
            raise self.fail(
                e,
                f"{name} with a zone reads the event time or an event field (e.g. "
                f"{name}(ts, '{zone}')): the zone's offsets are looked up beside the event",
            )
        return node

    def call(
        self, e: exp.Expr, function: Function, trees: list[Any], zone: str | None = None
    ) -> Node:
        kinds, required = _SIGNATURES[function]
        if not required <= len(trees) <= len(kinds):
            raise self.fail(e, f"{function.value} takes {_arity(function)}")
        args = tuple(
            self.require(tree, self.node(tree), allowed, function.value)
            for tree, allowed in zip(trees, kinds, strict=False)
        )
        if any(not a.kinds for a in args):
            result: Kinds = NOTHING
        elif function in (Function.ABS, Function.ROUND):
            result = args[0].kinds & NUMBERS
        elif function in _STRING_RESULTS:
            result = STRING
        else:
            result = BIGINT
        return Call(function, args, result, zone)


def _arity(function: Function) -> str:
    kinds, required = _SIGNATURES[function]
    names = [_names(k) for k in kinds]
    if function in TIME_FUNCTIONS:
        return f"({names[0]} epoch-ms[, 'IANA zone'])"
    shown = ", ".join(names[:required] + [f"[{n}]" for n in names[required:]])
    return f"({shown})"


_ARG_NAMES = {
    Function.LOWER: ("this",),
    Function.UPPER: ("this",),
    Function.LENGTH: ("this",),
    Function.SUBSTR: ("this", "start", "length"),
    Function.TRIM: ("this",),
    Function.ABS: ("this",),
    Function.ROUND: ("this",),
    Function.FLOOR: ("this",),
    Function.CEIL: ("this",),
}


def _comparable(a: Kind, b: Kind) -> bool:
    return a is b or (a in NUMBERS and b in NUMBERS)


def _names(kinds: Kinds) -> str:
    if not kinds:
        return "NULL"
    if kinds == ANY:
        return "any kind"
    return " or ".join(k.value for k in Kind if k in kinds)


def _path(e: exp.Expr) -> tuple[str, ...]:
    if isinstance(e, exp.Dot):
        return (*_path(e.this), e.expression.name)
    assert isinstance(e, exp.Column)
    return tuple(p.name for p in e.parts)


def _start(e: exp.Expr) -> int | None:
    """The offset of the first token of `e` that carries a position (names and literals do)."""
    for node in e.walk():
        if isinstance(node, exp.Identifier | exp.Literal) and "start" in node.meta:
            return int(node.meta["start"])
    return None


def known_zone(name: str) -> bool:
    """Whether `name` is an IANA time zone (`shared.expressions.zones`)."""
    return zone_info(name) is not None


_HANDLERS: dict[type[exp.Expr], Callable[[_Builder, Any], Node]] = {
    exp.Paren: lambda b, e: b.node(e.this),
    exp.Column: _Builder.column,
    exp.Dot: _Builder.column,
    exp.Literal: _Builder.literal,
    exp.Boolean: lambda b, e: Literal(bool(e.this)),
    exp.Null: lambda b, e: Literal(None),
    exp.Neg: _Builder.negate,
    **dict.fromkeys(_ARITH, _Builder.arith),
    **dict.fromkeys(_COMPARE, _Builder.compare),
    exp.And: _Builder.logic,
    exp.Or: _Builder.logic,
    exp.Not: _Builder.not_,
    exp.Is: _Builder.is_,
    exp.In: _Builder.in_,
    exp.Between: _Builder.between,
    exp.Like: _Builder.like,
    exp.Case: _Builder.case,
    exp.Coalesce: _Builder.coalesce,
    exp.Cast: _Builder.cast,
    **dict.fromkeys(_FUNCTION_NODES, _Builder.function),
    exp.Anonymous: _Builder.anonymous,
}
