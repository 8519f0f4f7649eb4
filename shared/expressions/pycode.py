"""Expressions compiled to Python source, the speed layer's evaluator (rule 10 in
docs/semantics.md).

A metric's expressions are turned into the statements of one Python function, compiled once:
an event is then evaluated with no per-node call and no dispatch on node types — a tree of
closures cost ~6x the plain metric's per-event time, generated code ~2x. The semantics stay the
scalar functions of `shared.expressions.evaluate`: the generated code calls them, and inlines
only fast paths that give the same value for the operand kinds they test (a comparison of two
values of one kind, a number against a numeric literal, a LIKE pattern that is a prefix,
suffix or substring test).

`Emitter.value(node)` writes the statements computing a node and returns the Python expression
(a local's name or a literal) holding its value; callers (`compile_node` here, the metric
inputs in `shared.events`) add their own statements around it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from shared.expressions import evaluate as semantics
from shared.expressions.syntax import (
    BIGINT_MAX,
    BIGINT_MIN,
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
    IsNull,
    Like,
    Literal,
    Negate,
    Node,
    Not,
    Or,
    Scalar,
    children,
    walk,
)

_OPERATORS = {
    CompareOp.EQ: "==",
    CompareOp.NE: "!=",
    CompareOp.LT: "<",
    CompareOp.LE: "<=",
    CompareOp.GT: ">",
    CompareOp.GE: ">=",
}


class Emitter:
    """The source of one generated function: its statements (`line`, `block`) and the objects
    it reads by name (`constant`). `fields` and `time` name the locals holding the event's JSON
    object and its event time; `computed` maps computed field names to the locals (or
    expressions) holding their values."""

    def __init__(self, fields: str = "f", time: str = "t") -> None:
        self.fields = fields
        self.time = time
        self.computed: dict[str, str] = {}
        self.lookups: dict[str, str] = {}
        """A lookup's name -> the local holding the joined version's fields (or None): its
        paths (`<name>.<field>`) are read there rather than from the event (rule 11)."""
        self.lines: list[str] = []
        self.namespace: dict[str, Any] = {
            "MISSING": semantics.MISSING,
            "_json": semantics.from_json,
            "_read_path": semantics.read_path,
            "_arith": semantics.arith,
            "_negate": semantics.negate,
            "_compare": semantics.compare,
            "_cast": semantics.cast,
            "_call": semantics.call,
        }
        self._depth = 1
        self._count = 0
        self._constants: dict[int, str] = {}
        self._reads: dict[tuple[str, ...], str] = {}

    def line(self, text: str) -> None:
        self.lines.append("    " * self._depth + text)

    @contextmanager
    def block(self, header: str) -> Iterator[None]:
        """`header:` and the statements written inside the `with`, indented under it."""
        self.line(f"{header}:")
        self._depth += 1
        before = len(self.lines)
        try:
            yield
        finally:
            if len(self.lines) == before:
                self.line("pass")
            self._depth -= 1

    def local(self) -> str:
        self._count += 1
        return f"_v{self._count}"

    def constant(self, value: object) -> str:
        """A name the generated code reads `value` by."""
        name = self._constants.get(id(value))
        if name is None:
            name = self._constants[id(value)] = f"_c{len(self._constants)}"
            self.namespace[name] = value
        return name

    def function(self, name: str, parameters: str) -> Callable[..., Any]:
        """The statements written so far as the body of `def name(parameters)`."""
        source = "\n".join([f"def {name}({parameters}):", *self.lines])
        code = compile(source, f"<expression {name}>", "exec")
        namespace = dict(self.namespace)
        exec(code, namespace)
        function: Callable[..., Any] = namespace[name]
        return function

    def raw(self, path: tuple[str, ...]) -> str:
        """The local holding a JSON path's value as the language reads it (`from_json`), read
        once per event however many expressions use it. The read is written where the path is
        first used, so it must not be inside a branch: `value` reads every path of a tree
        before its first branch (`_prefetch`)."""
        local = self._reads.get(path)
        if local is None:
            local = self._reads[path] = self.local()
            self.line(f"{local} = {self.json(path, absent='None')}")
            self.line(f"_k = type({local})")
            with self.block("if _k is float"):
                self.line(f"if {local} - {local} != 0: {local} = None")
            with self.block("elif _k is int"):
                bounds = f"{BIGINT_MIN} <= {local} <= {BIGINT_MAX}"
                self.line(f"if not {bounds}: {local} = _json({local})")
            with self.block("elif _k is not str and _k is not bool"):
                self.line(f"{local} = None")
        return local

    def json(self, path: tuple[str, ...], absent: str = "MISSING") -> str:
        """The Python expression of the JSON value at `path` (`absent` when there is none): in
        the event, or in a lookup's joined version."""
        joined = self.lookups.get(path[0])
        if joined is not None:
            return f"_read_path({joined}, {self.constant(path[1:])})"
        if len(path) == 1:
            return f"{self.fields}.get({path[0]!r}, {absent})"
        return f"_read_path({self.fields}, {self.constant(path)})"

    def value(self, node: Node) -> str:
        """Write the statements computing `node`; the Python expression of its value."""
        self._prefetch(node)
        return self._value(node)

    def _prefetch(self, node: Node) -> None:
        if isinstance(node, Field):
            self.raw(node.path)
        for child in children(node):
            self._prefetch(child)

    def _value(self, node: Node) -> str:
        match node:
            case Literal(value=value):
                return repr(value) if value is None or type(value) is bool else self.constant(value)
            case Field(path=path):
                return self.raw(path)
            case EventTime():
                return self.time
            case Computed(name=name):
                return self.computed[name]
            case Compare():
                return self._compare(node)
            case And() | Or():
                return self._logic(node)
            case Not(operand=operand):
                a = self._value(operand)
                out = self.local()
                self.line(f"{out} = (not {a}) if type({a}) is bool else None")
                return out
            case IsNull(operand=operand):
                a = self._value(operand)
                out = self.local()
                self.line(f"{out} = {a} is None")
                return out
            case Like(operand=operand, pattern=pattern):
                a = self._value(operand)
                out = self.local()
                self.line(f"{out} = ({self._like_test(a, pattern)}) if type({a}) is str else None")
                return out
            case Case():
                return self._case(node)
            case Coalesce(operands=operands):
                return self._coalesce(operands)
            case Arith():
                return self._arith(node)
        return self._call(node)

    def _compare(self, node: Compare) -> str:
        a, b = self._value(node.left), self._value(node.right)
        op = _OPERATORS[node.op]
        out = self.local()
        literal = node.right if isinstance(node.right, Literal) else None
        if literal is not None and type(literal.value) in (int, float):
            # A number against a numeric literal: as `compare`, the BIGINT side as DOUBLE
            # when the kinds differ.
            as_int = self.constant(literal.value)
            as_float = self.constant(float(literal.value))  # type: ignore[arg-type]
            same, other = (as_int, as_float) if type(literal.value) is int else (as_float, as_int)
            self.line(f"_k = type({a})")
            mine = "int" if type(literal.value) is int else "float"
            theirs = "float" if mine == "int" else "int"
            self.line(
                f"{out} = ({a} {op} {same}) if _k is {mine} else "
                f"(float({a}) {op} {other if mine == 'int' else same}) if _k is {theirs} "
                "else None"
            )
            return out
        if literal is not None and type(literal.value) is str:
            self.line(f"{out} = ({a} {op} {b}) if type({a}) is str else None")
            return out
        self.line(f"{out} = _compare({self.constant(node.op)}, {a}, {b})")
        return out

    def _logic(self, node: And | Or) -> str:
        """Kleene AND/OR, the right side evaluated only when the left does not decide."""
        decides = "False" if isinstance(node, And) else "True"
        out = self.local()
        a = self._value(node.left)
        self.line(f"_x = {a} if type({a}) is bool else None")
        left = self.local()
        self.line(f"{left} = _x")
        with self.block(f"if {left} is {decides}"):
            self.line(f"{out} = {decides}")
        with self.block("else"):
            b = self._value(node.right)
            self.line(f"_y = {b} if type({b}) is bool else None")
            with self.block(f"if _y is {decides}"):
                self.line(f"{out} = {decides}")
            with self.block(f"elif {left} is None or _y is None"):
                self.line(f"{out} = None")
            with self.block("else"):
                self.line(f"{out} = {'True' if decides == 'False' else 'False'}")
        return out

    def _like_test(self, a: str, pattern: Any) -> str:
        """The test of a STRING `a` against a LIKE pattern: a string method for the common
        shapes, else the pattern's regular expression."""
        parts, wild = pattern.parts, pattern.wildcard
        if not any(wild):
            return f"{a} == {self.constant(''.join(parts))}"
        if parts == ("%",):
            return "True"
        if len(parts) == 2 and wild == (False, True) and parts[1] == "%":
            return f"{a}.startswith({self.constant(parts[0])})"
        if len(parts) == 2 and wild == (True, False) and parts[0] == "%":
            return f"{a}.endswith({self.constant(parts[1])})"
        if len(parts) == 3 and wild == (True, False, True) and parts[0] == parts[2] == "%":
            return f"{self.constant(parts[1])} in {a}"
        return f"{self.constant(semantics.like_regex(pattern))}.fullmatch({a}) is not None"

    def _case(self, node: Case) -> str:
        out = self.local()
        header = "if"
        depth = 0
        for condition, result in node.branches:
            c = self._value(condition)
            with self.block(f"{header} {c} is True"):
                self.line(f"{out} = {self._value(result)}")
            self.line("else:")
            self._depth += 1
            depth += 1
        self.line(f"{out} = {self._value(node.default)}")
        self._depth -= depth
        return out

    def _coalesce(self, operands: tuple[Node, ...]) -> str:
        out = self.local()
        self.line(f"{out} = {self._value(operands[0])}")
        for operand in operands[1:]:
            with self.block(f"if {out} is None"):
                self.line(f"{out} = {self._value(operand)}")
        return out

    def _arith(self, node: Arith) -> str:
        a, b = self._value(node.left), self._value(node.right)
        out = self.local()
        literal = node.right.value if isinstance(node.right, Literal) else None
        if node.op is ArithOp.DIV and type(literal) in (int, float) and literal != 0:
            # x / nonzero literal: `arith`'s DOUBLE division without the zero test.
            divisor = self.constant(float(literal))  # type: ignore[arg-type]
            self.line(f"_k = type({a})")
            self.line(f"{out} = float({a}) / {divisor} if _k is int or _k is float else None")
            self.line(f"if {out} is not None and {out} - {out} != 0: {out} = None")
            return out
        self.line(f"{out} = _arith({self.constant(node.op)}, {a}, {b})")
        return out

    def _call(self, node: Node) -> str:
        out = self.local()
        match node:
            case Negate(operand=operand):
                self.line(f"{out} = _negate({self._value(operand)})")
            case Cast(operand=operand, to=to):
                self.line(f"{out} = _cast({self._value(operand)}, {self.constant(to)})")
            case Call(function=function, args=args, zone=zone):
                values = ", ".join(self._value(a) for a in args)
                self.line(f"{out} = _call({self.constant(function)}, [{values}], {zone!r})")
            case _:
                raise AssertionError(f"no code for {node!r}")
        return out


def compile_node(node: Node) -> Callable[[Mapping[str, Any], int, Mapping[str, Scalar]], Scalar]:
    """A function evaluating `node` on one event: (JSON object, event time, computed fields by
    name) -> value."""
    emitter = Emitter()
    names = {n.name for n in walk(node) if isinstance(n, Computed)}
    for name in sorted(names):
        local = emitter.local()
        emitter.line(f"{local} = v[{name!r}]")
        emitter.computed[name] = local
    result = emitter.value(node)
    emitter.line(f"return {result}")
    return emitter.function("evaluate", "f, t, v")
