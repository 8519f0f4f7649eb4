"""A metric's `where` and `fields`, compiled once (part of its `MetricPlan`).

Computed fields may use each other (not in a cycle): they are ordered so each is evaluated
after the fields it reads, once per event. A name in an expression, `key`, `value` or an
aggregation is a computed field when one has that name, else the source's time field (the
event time, BIGINT epoch ms), else a path into the event's JSON (`geo.country`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from sqlglot import exp

from shared.expressions.constants import never_true
from shared.expressions.parse import ExpressionError, _Scope, build, parse_tree, references
from shared.expressions.syntax import BOOLEAN, Computed, EventTime, Field, Kinds, Node


@dataclass(frozen=True)
class Definitions:
    """A metric's computed fields (in evaluation order) and filter, as typed trees."""

    fields: tuple[tuple[str, Node], ...]
    where: Node | None
    time_field: str | None

    def reference(self, name: str) -> Node:
        """What a name of `key`, `value` or an aggregation reads."""
        for field, node in self.fields:
            if field == name:
                return Computed(name, node.kinds)
        if name == self.time_field:
            return EventTime()
        return Field(split_path(name))


def split_path(name: str) -> tuple[str, ...]:
    """A dotted name of the config as a JSON path: `geo.country` is ("geo", "country")."""
    return tuple(name.split("."))


def compile_definitions(
    where: str | None, fields: Mapping[str, str], time_field: str | None
) -> Definitions:
    """The typed trees of a metric's `where` and `fields`; an `ExpressionError` (prefixed with
    the key it is under, e.g. `fields.vis:`) when one cannot be used, a ValueError when the
    `where` is TRUE for no event (`constants.never_true`)."""
    trees: dict[str, exp.Expr] = {}
    for name, text in fields.items():
        trees[name] = _parse(f"fields.{name}", text)
    order = _evaluation_order(trees, fields)
    kinds: dict[str, Kinds] = {}
    compiled: list[tuple[str, Node]] = []
    for name in order:
        scope = _Scope(time_field or "", dict(kinds))
        node = _build(f"fields.{name}", fields[name], trees[name], scope)
        kinds[name] = node.kinds
        compiled.append((name, node))
    where_node = None
    if where is not None:
        scope = _Scope(time_field or "", kinds)
        where_node = _build("where", where, _parse("where", where), scope)
        if where_node.kinds and not where_node.kinds & BOOLEAN:
            raise ValueError(f"where: must be a condition (BOOLEAN), not {where!r}")
    definitions = Definitions(tuple(compiled), where_node, time_field)
    why = never_true(definitions)
    if why is not None:
        raise ValueError(
            f"where: never TRUE for any event ({why}), so the metric would count nothing; "
            "fix or remove the filter"
        )
    return definitions


def _parse(key: str, text: str) -> exp.Expr:
    try:
        return parse_tree(text)
    except ExpressionError as exc:
        raise ValueError(f"{key}: {exc}") from None


def _build(key: str, text: str, tree: exp.Expr, scope: _Scope) -> Node:
    try:
        return build(text, tree, scope)
    except ExpressionError as exc:
        raise ValueError(f"{key}: {exc}") from None


def _evaluation_order(trees: Mapping[str, exp.Expr], fields: Mapping[str, str]) -> list[str]:
    """The computed fields, each after those it reads; a cycle is an error naming it."""
    uses = {name: sorted(references(tree) & set(trees)) for name, tree in trees.items()}
    order: list[str] = []
    state: dict[str, str] = {}

    def visit(name: str, chain: list[str]) -> None:
        if state.get(name) == "done":
            return
        if state.get(name) == "active":
            cycle = " -> ".join([*chain[chain.index(name) :], name])
            raise ValueError(
                f"fields.{name}: computed fields refer to each other in a cycle ({cycle}); "
                "a computed field cannot read itself, even through others — give it another name"
            )
        state[name] = "active"
        for used in uses[name]:
            visit(used, [*chain, name])
        state[name] = "done"
        order.append(name)

    for name in fields:
        visit(name, [])
    return order
