"""What a metric's expressions are for every event, found when the config loads (rule 10 in
docs/semantics.md): a `where` that can never be TRUE counts nothing, and a computed input that
is always NULL skips every event, both without a word at run time. `never_true` and
`null_fields` find them so the config can refuse them.

Conservative by construction: a node is constant only when its value is the same whatever the
event holds, which is the case when

- it is a literal, or a computed field that is constant;
- its operands are all constant: it is then evaluated by the speed layer's own evaluator
  (`pycode`) on its operands' values, so the folding cannot disagree with the layers;
- it is an operator that is NULL whenever one operand is (arithmetic, a comparison, LIKE, a
  cast, a function) and one operand is NULL, or a division or remainder by zero;
- it is AND with a FALSE side, OR with a TRUE side, `<event time> IS NULL` (never: an event
  without a time is malformed), a CASE whose branch or results decide it, or a COALESCE of
  NULLs up to a constant.

Anything else may differ between events and is not constant. A `where` is TRUE for no event
when it is a constant other than TRUE, an AND with such a part, or an OR of two.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Protocol

from shared.expressions.pycode import compile_node
from shared.expressions.syntax import (
    And,
    Arith,
    ArithOp,
    Call,
    Case,
    Cast,
    Coalesce,
    Compare,
    Computed,
    EventTime,
    Field,
    IsNull,
    Like,
    Literal,
    Negate,
    Node,
    Not,
    Or,
    Scalar,
    children,
)


class MetricExpressions(Protocol):
    """What is folded of a metric's expressions (`definitions.Definitions` is one): its
    computed fields in evaluation order, its `where` and the time field."""

    @property
    def fields(self) -> Sequence[tuple[str, Node]]: ...

    @property
    def where(self) -> Node | None: ...

    @property
    def time_field(self) -> str | None: ...


@dataclass(frozen=True)
class Constant:
    """A node's value for every event, and why it has it (shown in the config error)."""

    value: Scalar
    why: str


_STRICT = (Arith, Negate, Compare, Like, Cast, Call)
"""The nodes that are NULL whenever an operand is (`evaluate`: every failure is NULL)."""
_BY_ZERO = {ArithOp.DIV: "division by zero", ArithOp.MOD: "remainder by zero"}
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def never_true(definitions: MetricExpressions) -> str | None:
    """Why the `where` of `definitions` is TRUE for no event (None: it may be TRUE for some,
    or there is none)."""
    if definitions.where is None:
        return None
    return _Folder(definitions, _constant_fields(definitions)).never_true(definitions.where)


def null_fields(definitions: MetricExpressions) -> dict[str, str]:
    """The computed fields that are NULL for every event, each with why."""
    return {n: c.why for n, c in _constant_fields(definitions).items() if c.value is None}


def _constant_fields(definitions: MetricExpressions) -> dict[str, Constant]:
    """The computed fields that are constant (in evaluation order: each may read earlier
    ones)."""
    known: dict[str, Constant] = {}
    folder = _Folder(definitions, known)
    for name, node in definitions.fields:
        constant = folder.fold(node)
        if constant is not None:
            known[name] = constant
    return known


class _Folder:
    """Folds the nodes of one metric's expressions, given its constant computed fields."""

    def __init__(self, definitions: MetricExpressions, fields: Mapping[str, Constant]) -> None:
        self.time_field = definitions.time_field or ""
        self.fields = fields

    def never_true(self, node: Node) -> str | None:
        constant = self.fold(node)
        if constant is not None:
            return None if constant.value is True else constant.why
        if isinstance(node, And):
            return self.never_true(node.left) or self.never_true(node.right)
        if isinstance(node, Or):
            left, right = self.never_true(node.left), self.never_true(node.right)
            return None if left is None or right is None else f"{left}; {right}"
        return None

    def fold(self, node: Node) -> Constant | None:
        match node:
            case Literal(value=value):
                return self.always(node, value)
            case Field() | EventTime():
                return None
            case Computed(name=name):
                field = self.fields.get(name)
                return (
                    None if field is None else Constant(field.value, f"fields.{name}: {field.why}")
                )
        operands = [self.fold(child) for child in children(node)]
        if isinstance(node, _STRICT):
            null = next((c for c in operands if c is not None and c.value is None), None)
            if null is not None:
                return self.null_operand(node, null)
        if isinstance(node, Arith) and node.op in _BY_ZERO:
            divisor = operands[1]
            if divisor is not None and type(divisor.value) in (int, float) and not divisor.value:
                return self.always(node, None, _BY_ZERO[node.op])
        if isinstance(node, Case):  # decided branch by branch, even when all are constant
            return self.case(node, operands)
        values = [c for c in operands if c is not None]
        if len(values) == len(operands):
            return self.evaluated(node, values)
        return self.decided(node, operands)

    def null_operand(self, node: Node, null: Constant) -> Constant:
        """A strict node with a NULL operand: why the operand is NULL, unless it is the
        literal NULL (then this node is where the NULL comes in)."""
        if not any(isinstance(c, Literal) and c.value is None for c in children(node)):
            return Constant(None, null.why)
        if isinstance(node, Compare):
            return self.always(node, None, "a comparison with NULL is NULL; test IS NULL")
        return self.always(node, None, "an operand is NULL")

    def evaluated(self, node: Node, operands: list[Constant]) -> Constant:
        """`node` on its operands' constant values, by the speed layer's evaluator."""
        value = compile_node(_with_literals(node, [c.value for c in operands]))({}, 0, {})
        null = next((c for c in operands if c.value is None), None)
        if value is None and null is not None and not isinstance(node, Coalesce):
            return Constant(None, null.why)  # the NULL came from there
        return self.always(node, value)

    def decided(self, node: Node, operands: list[Constant | None]) -> Constant | None:
        """A node decided by some of its operands (the others unknown)."""
        match node:
            case And() | Or():
                decides = isinstance(node, Or)  # TRUE decides OR, FALSE decides AND
                side = next((c for c in operands if c is not None and c.value is decides), None)
                return None if side is None else Constant(decides, side.why)
            case IsNull(operand=EventTime()):
                return self.always(node, False, "the event time is never NULL")
            case Coalesce():  # the first operand that is not surely NULL (one is unknown)
                return next(c for c in operands if c is None or c.value is not None)
        return None

    def case(self, node: Case, operands: list[Constant | None]) -> Constant | None:
        """The first branch that may be taken decides when its condition surely is TRUE (no
        branch that may be: the default); else NULL when every result it may take is."""
        taken: list[Constant | None] = []  # the results that may be taken, in order
        for k in range(len(node.branches)):
            condition, result = operands[2 * k], operands[2 * k + 1]
            if condition is None:
                taken.append(result)
            elif condition.value is True:
                if not taken:
                    return self.taken(node, result, "its first branch is always taken")
                taken.append(result)
                break
        else:
            if not taken:
                return self.taken(node, operands[-1], "no branch is ever taken")
            taken.append(operands[-1])
        if all(c is not None and c.value is None for c in taken):
            return self.always(node, None, "every result it may take is NULL")
        return None

    def taken(self, node: Case, result: Constant | None, how: str) -> Constant | None:
        return None if result is None else self.always(node, result.value, how)

    def always(self, node: Node, value: Scalar, cause: str = "") -> Constant:
        why = f"{self.text(node)!r} is always {_sql(value)}"
        return Constant(value, f"{why}: {cause}" if cause else why)

    def text(self, node: Node) -> str:
        """`node` as an expression (sugar removed: `x IN (1, 2)` reads `x = 1 OR x = 2`)."""
        inner = self.operand
        match node:
            case Literal(value=value):
                return _sql(value)
            case Field(path=path):
                return ".".join(
                    p if _NAME.fullmatch(p) else '"' + p.replace('"', '""') + '"' for p in path
                )
            case EventTime():
                return self.time_field
            case Computed(name=name):
                return name
            case Arith(op=op) | Compare(op=op):
                return f"{inner(node.left)} {op.value} {inner(node.right)}"
            case And() | Or():
                word = "AND" if isinstance(node, And) else "OR"
                return f"{inner(node.left)} {word} {inner(node.right)}"
            case Negate(operand=operand):
                return f"-{inner(operand)}"
            case Not(operand=operand):
                return f"NOT {inner(operand)}"
            case IsNull(operand=operand):
                return f"{inner(operand)} IS NULL"
            case Like(operand=operand, pattern=pattern):
                written = "".join(
                    part if wild else re.sub(r"([%_\\])", r"\\\1", part)
                    for part, wild in zip(pattern.parts, pattern.wildcard, strict=True)
                )
                return f"{inner(operand)} LIKE {_sql(written)}"
            case Case(branches=branches, default=default):
                whens = " ".join(f"WHEN {self.text(c)} THEN {self.text(r)}" for c, r in branches)
                return f"CASE {whens} ELSE {self.text(default)} END"
            case Coalesce(operands=operands):
                return f"COALESCE({', '.join(map(self.text, operands))})"
            case Cast(operand=operand, to=to):
                return f"CAST({self.text(operand)} AS {to.value})"
            case Call(function=function, args=args, zone=zone):
                shown = [*map(self.text, args), *([] if zone is None else [_sql(zone)])]
                return f"{function.value}({', '.join(shown)})"
        raise AssertionError(f"no text for {node!r}")

    def operand(self, node: Node) -> str:
        """An operand's text, in parentheses when it is an operation itself."""
        text = self.text(node)
        operation = isinstance(node, Arith | Compare | And | Or | Not | IsNull | Like | Negate)
        return f"({text})" if operation else text


def _sql(value: Scalar) -> str:
    if value is None:
        return "NULL"
    if isinstance(value, bool):
        return "TRUE" if value else "FALSE"
    if isinstance(value, str):
        return "'" + value.replace("'", "''") + "'"
    return repr(value)


def _with_literals(node: Node, values: list[Scalar]) -> Node:
    """`node` with its operands (`children`, in order) replaced by literals of `values`."""
    new = [Literal(v) for v in values]
    match node:
        case Arith() | Compare() | And() | Or():
            return replace(node, left=new[0], right=new[1])
        case Negate() | Not() | IsNull() | Like() | Cast():
            return replace(node, operand=new[0])
        case Case():
            pairs = tuple(zip(new[:-1:2], new[1:-1:2], strict=True))
            return replace(node, branches=pairs, default=new[-1])
        case Coalesce():
            return replace(node, operands=tuple(new))
        case Call():
            return replace(node, args=tuple(new))
    raise AssertionError(f"{node!r} has no operands")
