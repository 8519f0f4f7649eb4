"""Query-time slicing: which keys a query reads (filters) and how it groups them (`group_by`).
Every dimension neither fixed nor grouped is merged over — states merged, sketches unioned,
never estimates summed — so a query naming no dimension answers the metric's total, and one
fixing every dimension to one value answers that key, as before."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property

from psycopg import sql


@dataclass(frozen=True)
class Selection:
    """A query's filters and grouping over a metric's key dimensions `dims`."""

    dims: tuple[str, ...]
    filters: tuple[tuple[str, frozenset[str]], ...] = ()
    """(dimension, the canonical values it may take), in key order."""
    group_by: tuple[str, ...] = ()
    """The dimensions each group keeps, in the order asked."""

    @property
    def exact_key(self) -> tuple[str, ...] | None:
        """The one key a query names when it fixes every dimension to one value and groups by
        nothing (None otherwise)."""
        fixed = dict(self.filters)
        if self.group_by or len(fixed) != len(self.dims):
            return None
        if any(len(values) != 1 for values in fixed.values()):
            return None
        return tuple(next(iter(fixed[d])) for d in self.dims)

    @property
    def used(self) -> frozenset[str]:
        """The dimensions the query filters or groups by (a rollup must keep them)."""
        return frozenset((*(d for d, _ in self.filters), *self.group_by))

    def onto(self, dims: tuple[str, ...]) -> Selection:
        """The same selection over a rollup's key `dims` (which holds every `used` one)."""
        return Selection(dims, tuple(f for f in self.filters if f[0] in dims), self.group_by)

    @property
    def fixed(self) -> dict[str, str]:
        """The dimensions fixed to one value (an answer's `key` without `group_by`)."""
        return {d: next(iter(v)) for d, v in self.filters if len(v) == 1}

    def filter_map(self) -> dict[str, list[str]]:
        """The filters as the answer renders them: dimension -> sorted values."""
        return {d: sorted(v) for d, v in self.filters}

    @cached_property
    def _filter_at(self) -> tuple[tuple[int, frozenset[str]], ...]:
        return tuple((self.dims.index(d), values) for d, values in self.filters)

    @cached_property
    def _group_at(self) -> tuple[int, ...]:
        return tuple(self.dims.index(d) for d in self.group_by)

    def matches(self, key: Sequence[str]) -> bool:
        """Whether a stored key passes the filters (called per key: positions found once)."""
        return all(key[i] in values for i, values in self._filter_at)

    def group_of(self, key: Sequence[str]) -> tuple[str, ...]:
        """The group a stored key falls in (its `group_by` dimensions)."""
        return tuple(map(key.__getitem__, self._group_at))

    def sql_condition(self, column: str) -> tuple[sql.Composable, dict[str, list[str]]]:
        """`AND <column>[i] = ANY(...)` per filtered dimension, and its parameters."""
        parts: list[sql.Composable] = []
        params: dict[str, list[str]] = {}
        for n, (dim, values) in enumerate(self.filters):
            name = f"filter_{n}"
            index = self.dims.index(dim) + 1
            parts.append(
                sql.SQL(" AND {}[{}] = ANY({})").format(
                    sql.Identifier(*column.split(".")), sql.Literal(index), sql.Placeholder(name)
                )
            )
            params[name] = sorted(values)
        return sql.Composed(parts), params
