"""The aggregation registry: every aggregation a metric may list, defined once.

A cell's state is the same in every layer and store (`CellState`): four plain columns that
every cell keeps (`count`, `sum`, `min`, `max`; merged by +, exact sum, min, max) and one
Apache DataSketches sketch per *sketch aggregation* of the metric, in configured order (its
"slots"). An aggregation is one `Aggregation` here; what it keeps and how it merges is its
`SketchKind` (or the plain columns), which also names its Spark expressions (partial
aggregate and merge), so the batch layer builds and merges the very bytes the speed layer
and the serving layer read:

| aggregation          | state             | renders                      |
|----------------------|-------------------|------------------------------|
| `count`              | count             | `count`                      |
| `sum`, `min`, `max`  | sum, min, max     | `sum`, `min`, `max`          |
| `avg`                | sum and count     | `avg` = sum / count          |
| `distinct(<field>)`  | HLL, lg_k 12      | `distinct_<field>`           |
| `quantiles(<field>)` | KLL doubles, k 200| `p50`, `p90`, `p99` (per `q`)|

`encode_state`/`decode_state` are the one codec (Redis holds these bytes; PostgreSQL holds the
same columns and the same sketch bytes); `merge_states` is the one merge; `render` and
`rank_value` the one way a state becomes an answer. Merging is associative and commutative.
"""

from __future__ import annotations

import math
import re
import struct
from abc import ABC, abstractmethod
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from functools import cached_property
from typing import TYPE_CHECKING, Any, ClassVar, Literal

import datasketches as ds
import numpy as np

if TYPE_CHECKING:
    from pyspark.sql import Column

HLL_LG_K = 12
"""HyperLogLog precision of `distinct(<field>)`: ~1.6% relative standard error."""
KLL_K = 200
"""KLL accuracy parameter of `quantiles(<field>)`: ~1.33% normalized rank error (single-sided,
99% confidence)."""
DEFAULT_QUANTILES: tuple[Decimal, ...] = (Decimal("0.5"), Decimal("0.9"), Decimal("0.99"))

Number = float | int | None
"""A rendered output value (None: no event carried a value)."""


# --------------------------------------------------------------------------- sketch kinds


class SketchKind(ABC):
    """How one sketch aggregation keeps its state: built from its field's items, merged by
    union, serialized as DataSketches bytes (the format both layers and stores share)."""

    name: ClassVar[str]
    reads: ClassVar[Literal["text", "number"]]
    """What the sketch is fed: a field's canonical text or its finite number."""
    needs_bytes_alone: ClassVar[bool]
    """Whether rendering even one stored cell needs its sketch (no stored summary suffices)."""

    def needs_bytes(self, parts: int) -> bool:
        """Whether rendering the merge of `parts` stored states needs their sketch bytes."""
        return self.needs_bytes_alone or parts > 1

    @abstractmethod
    def add(self, blob: bytes | None, items: Sequence[Any]) -> bytes:
        """The sketch `blob` (None: empty) updated with `items`."""

    @abstractmethod
    def union(self, blobs: Sequence[bytes]) -> bytes:
        """The sketch over every blob's items."""

    @abstractmethod
    def summary(self, blob: bytes) -> float | None:
        """What a batch row stores next to the sketch for single-cell reads (None: nothing)."""

    @abstractmethod
    def spark_partial(self, column: Column) -> Column:
        """Spark aggregate building the sketch from a column of items."""

    @abstractmethod
    def spark_merge(self, column: Column) -> Column:
        """Spark aggregate merging a column of sketches."""

    @abstractmethod
    def spark_summary(self, column: Column) -> Column:
        """`summary` as a Spark expression over a sketch column."""


class HllKind(SketchKind):
    """HyperLogLog (lg_k 12) over canonical texts; we write HLL_4, Spark writes HLL_8, both
    read and union each other's (the same strings hash the same on both sides)."""

    name = "hll"
    reads = "text"
    needs_bytes_alone = False

    def add(self, blob: bytes | None, items: Sequence[Any]) -> bytes:
        sketch = (
            ds.hll_sketch(HLL_LG_K, ds.tgt_hll_type.HLL_4)
            if blob is None
            else ds.hll_sketch.deserialize(blob)
        )
        for item in set(items):
            sketch.update(item)
        return bytes(sketch.serialize_compact())

    def union(self, blobs: Sequence[bytes]) -> bytes:
        return bytes(self._union(blobs).get_result(ds.tgt_hll_type.HLL_4).serialize_compact())

    def summary(self, blob: bytes) -> float:
        return self.estimate([blob])

    def estimate(self, blobs: Sequence[bytes]) -> float:
        """The distinct count of the union of `blobs`, always through a union: a sketch fed
        item by item carries an HIP estimate that a union result does not, and one
        estimator in every layer keeps a window's count independent of how its cells were
        put together (a union of one sketch copies the HIP state; of it twice, it does not)."""
        union = self._union([*blobs, blobs[0]] if len(blobs) == 1 else blobs)
        return float(union.get_estimate())

    @staticmethod
    def _union(blobs: Iterable[bytes]) -> ds.hll_union:
        union = ds.hll_union(HLL_LG_K)
        for blob in blobs:
            union.update(ds.hll_sketch.deserialize(blob))
        return union

    def spark_partial(self, column: Column) -> Column:
        from pyspark.sql import functions as F

        return F.hll_sketch_agg(column, HLL_LG_K)

    def spark_merge(self, column: Column) -> Column:
        from pyspark.sql import functions as F

        return F.hll_union_agg(column)

    def spark_summary(self, column: Column) -> Column:
        from pyspark.sql import functions as F

        return F.hll_sketch_estimate(column).cast("double")


class KllKind(SketchKind):
    """KLL doubles sketch (k 200) over finite numbers; Spark's `kll_sketch_agg_double` and
    Python's `kll_doubles_sketch` read and merge each other's bytes."""

    name = "kll"
    reads = "number"
    needs_bytes_alone = True

    def add(self, blob: bytes | None, items: Sequence[Any]) -> bytes:
        sketch = ds.kll_doubles_sketch(KLL_K) if blob is None else self.sketch([blob])
        sketch.update(np.fromiter(items, np.float64, len(items)))
        return bytes(sketch.serialize())

    def union(self, blobs: Sequence[bytes]) -> bytes:
        return bytes(self.sketch(blobs).serialize())

    @staticmethod
    def sketch(blobs: Sequence[bytes]) -> ds.kll_doubles_sketch:
        """The live sketch over every blob's items."""
        sketch = ds.kll_doubles_sketch.deserialize(blobs[0])
        for blob in blobs[1:]:
            sketch.merge(ds.kll_doubles_sketch.deserialize(blob))
        return sketch

    def summary(self, blob: bytes) -> float | None:
        return None

    def spark_partial(self, column: Column) -> Column:
        from pyspark.sql import functions as F

        return F.kll_sketch_agg_double(column, KLL_K)

    def spark_merge(self, column: Column) -> Column:
        from pyspark.sql import functions as F

        return F.kll_merge_agg_double(column, KLL_K)

    def spark_summary(self, column: Column) -> Column:
        from pyspark.sql import functions as F

        return F.lit(None).cast("double")


HLL = HllKind()
KLL = KllKind()


# --------------------------------------------------------------------------- cell state


@dataclass(slots=True)
class CellState:
    """The aggregate state of one cell (or of any set of events), in every layer.

    `minimum`/`maximum` are +inf/-inf when no event carried a value (count-only metrics);
    `sketches` hold one serialized sketch per sketch slot of the metric, or None when the
    reader chose not to read them (`decode_state(..., with_sketches=False)`); `summaries`
    are the stored per-slot summaries of a batch row (None when not stored; a slot's None:
    its sketch has none)."""

    count: int
    total: float
    minimum: float
    maximum: float
    sketches: list[bytes] | None
    summaries: list[float | None] | None = None


_HEADER = struct.Struct("<qdddH")
_LENGTH = struct.Struct("<I")


def encode_state(state: CellState) -> bytes:
    """The one binary form of a state: the plain columns, then each sketch length-prefixed."""
    sketches = state.sketches or []
    parts = [_HEADER.pack(state.count, state.total, state.minimum, state.maximum, len(sketches))]
    for blob in sketches:
        parts.append(_LENGTH.pack(len(blob)))
        parts.append(blob)
    return b"".join(parts)


def decode_state(data: bytes, with_sketches: bool = True) -> CellState:
    """`encode_state` read back; the sketch bytes only when `with_sketches`."""
    count, total, minimum, maximum, n_sketches = _HEADER.unpack_from(data)
    sketches: list[bytes] | None = None
    if with_sketches:
        sketches = []
        offset = _HEADER.size
        for _ in range(n_sketches):
            (length,) = _LENGTH.unpack_from(data, offset)
            offset += _LENGTH.size
            sketches.append(data[offset : offset + length])
            offset += length
    return CellState(count, total, minimum, maximum, sketches)


def merge_states(kinds: Sequence[SketchKind], states: Sequence[CellState]) -> CellState | None:
    """The state over every given state's events (None when there are none); `kinds` are the
    metric's sketch slots. One state is returned as it is (with its stored summaries)."""
    states = [s for s in states if s.count]
    if not states:
        return None
    if len(states) == 1:
        return states[0]
    sketches: list[bytes] | None = None
    if kinds:
        sketches = []
        for slot, kind in enumerate(kinds):
            blobs = []
            for state in states:
                if state.sketches is None:
                    raise ValueError("merging sketches needs every state's sketch bytes")
                blobs.append(state.sketches[slot])
            sketches.append(kind.union(blobs))
    return CellState(
        sum(s.count for s in states),
        math.fsum(s.total for s in states),
        min(s.minimum for s in states),
        max(s.maximum for s in states),
        sketches,
    )


def fold_inputs(
    kinds: Sequence[SketchKind],
    previous: CellState | None,
    values: Sequence[float] | None,
    slot_items: Sequence[Sequence[Any]],
    count: int,
) -> CellState:
    """`previous` (None: empty) with `count` more events folded in: their values (None when
    the metric has no value field) and, per sketch slot, their items."""
    total, minimum, maximum = 0.0, math.inf, -math.inf
    if values:
        total, minimum, maximum = math.fsum(values), min(values), max(values)
    if previous is None:
        blobs: Sequence[bytes | None] = [None] * len(kinds)
    else:
        total += previous.total
        minimum, maximum = min(previous.minimum, minimum), max(previous.maximum, maximum)
        count += previous.count
        blobs = previous.sketches or []
    sketches = [
        kind.add(blob, items) for kind, blob, items in zip(kinds, blobs, slot_items, strict=True)
    ]
    return CellState(count, total, minimum, maximum, sketches)


# --------------------------------------------------------------------------- aggregations


@dataclass(frozen=True)
class RenderOptions:
    """What a query chose about rendering: the quantiles a `quantiles(f)` point carries."""

    quantiles: tuple[Decimal, ...] = DEFAULT_QUANTILES


DEFAULT_RENDER = RenderOptions()


class Aggregation(ABC):
    """One configured aggregation: what it reads, keeps and renders."""

    spec: str
    """Its canonical spelling, e.g. `distinct(user_id)`."""
    field: str | None = None
    """The event field its sketch reads (sketch aggregations only)."""
    kind: SketchKind | None = None
    """Its sketch, or None for the plain aggregations."""
    needs_value: bool = False
    """Whether it reads the metric's `value` field."""
    skip_reason: str = ""
    """Prefix of the skip reasons when its field is missing or invalid (`<prefix>_missing`)."""

    @abstractmethod
    def output_names(self, options: RenderOptions) -> tuple[str, ...]:
        """The names it renders under."""

    @abstractmethod
    def render(self, state: CellState, slot: int, options: RenderOptions) -> dict[str, Number]:
        """Its outputs from a (merged) state with events; `slot` is its sketch slot."""

    def ranks_by(self, by: str) -> RenderOptions | None:
        """The options under which it renders `by` (None: it does not)."""
        return DEFAULT_RENDER if by in self.output_names(DEFAULT_RENDER) else None


@dataclass(frozen=True)
class Plain(Aggregation):
    """`count`, `sum`, `min`, `max`, `avg`: read off the plain columns."""

    spec: str
    needs_value: bool = True

    def output_names(self, options: RenderOptions) -> tuple[str, ...]:
        return (self.spec,)

    def render(self, state: CellState, slot: int, options: RenderOptions) -> dict[str, Number]:
        return {self.spec: _PLAIN_OUTPUTS[self.spec](state)}


_PLAIN_OUTPUTS = {
    "count": lambda s: s.count,
    "sum": lambda s: s.total,
    "min": lambda s: None if s.minimum == math.inf else s.minimum,
    "max": lambda s: None if s.maximum == -math.inf else s.maximum,
    "avg": lambda s: s.total / s.count,
}


@dataclass(frozen=True)
class Distinct(Aggregation):
    """`distinct(<field>)`: the HLL estimate of the field's distinct canonical values."""

    field: str
    kind: SketchKind = HLL
    skip_reason: str = "distinct"

    @property
    def spec(self) -> str:  # type: ignore[override]
        return f"distinct({self.field})"

    def output_names(self, options: RenderOptions) -> tuple[str, ...]:
        return (f"distinct_{self.field}",)

    def render(self, state: CellState, slot: int, options: RenderOptions) -> dict[str, Number]:
        summary = None if state.summaries is None else state.summaries[slot]
        estimate = summary if summary is not None else HLL.estimate([_slot_bytes(state, slot)])
        return {f"distinct_{self.field}": round(estimate)}


@dataclass(frozen=True)
class Quantiles(Aggregation):
    """`quantiles(<field>)`: the KLL sketch's quantiles of a numeric field, one output per
    requested fraction q, named `p<100 q>` (`p50`, `p99`, `p99.9`). Inclusive ranks, as SQL's
    `percentile_disc` and Spark's KLL functions: the smallest value whose share of values at
    or below it reaches q (exact while the sketch holds every value, n <= k)."""

    field: str
    kind: SketchKind = KLL
    skip_reason: str = "quantile"

    @property
    def spec(self) -> str:  # type: ignore[override]
        return f"quantiles({self.field})"

    def output_names(self, options: RenderOptions) -> tuple[str, ...]:
        return tuple(quantile_name(q) for q in options.quantiles)

    def render(self, state: CellState, slot: int, options: RenderOptions) -> dict[str, Number]:
        sketch = KLL.sketch([_slot_bytes(state, slot)])
        return {
            quantile_name(q): sketch.get_quantile(float(q), inclusive=True)
            for q in options.quantiles
        }

    def ranks_by(self, by: str) -> RenderOptions | None:
        q = quantile_of_name(by)
        return None if q is None else RenderOptions((q,))


def _slot_bytes(state: CellState, slot: int) -> bytes:
    if state.sketches is None:
        raise ValueError("rendering this aggregation needs the state's sketch bytes")
    return state.sketches[slot]


def quantile_name(q: Decimal) -> str:
    """`p` and 100 q without trailing zeros: 0.5 -> p50, 0.999 -> p99.9."""
    text = format((q * 100).normalize(), "f")
    return f"p{text}"


def quantile_of_name(name: str) -> Decimal | None:
    """The fraction a `p<100 q>` name stands for, spelled as `quantile_name` spells it (None
    when it is not such a name: `p50.0` and `pnan` are not)."""
    if not name.startswith("p"):
        return None
    try:
        q = Decimal(name[1:]) / 100
    except InvalidOperation:
        return None
    if not q.is_finite() or not 0 < q < 1 or quantile_name(q) != name:
        return None
    return q


MAX_QUANTILES = 10
"""The most fractions one `q` may ask for: each is an output field of every point."""
_FINEST_QUANTILE = Decimal("0.000001")
"""Fractions have at most 6 digits after the point (`p99.9999`): the output name spells the
fraction out, so `q=1e-1000000` would name a field with a million digits."""


def parse_quantiles(text: str) -> tuple[Decimal, ...]:
    """`0.5,0.9,0.99` -> fractions, each in (0, 1) with at most 6 digits after the point, at
    most `MAX_QUANTILES`, ascending and distinct; raises ValueError with what to send
    instead."""
    parts = text.split(",")
    if len(parts) > MAX_QUANTILES:
        raise ValueError(
            f"{len(parts)} quantiles asked for, more than {MAX_QUANTILES}; send at most "
            f"{MAX_QUANTILES}, e.g. q=0.5,0.9,0.99"
        )
    fractions = []
    for part in parts:
        try:
            q = Decimal(part.strip())
        except InvalidOperation:
            q = Decimal("NaN")
        if not q.is_finite() or not 0 < q < 1:
            raise ValueError(
                f"quantile {part.strip()!r} is not a number strictly between 0 and 1; "
                "send e.g. q=0.5,0.9,0.99"
            )
        if q != q.quantize(_FINEST_QUANTILE):
            raise ValueError(
                f"quantile {part.strip()!r} has more than 6 digits after the point; send at most "
                "6, e.g. q=0.999999"
            )
        fractions.append(q)
    return tuple(sorted(set(fractions)))


_CALL = re.compile(r"(distinct|quantiles)\(\s*([^\s()]+)\s*\)")
_SKETCHED = {"distinct": Distinct, "quantiles": Quantiles}
_PLAINS = {name: Plain(name, needs_value=name != "count") for name in _PLAIN_OUTPUTS}
NAMES = "count, sum, min, max, avg, distinct(<field>), quantiles(<field>)"


def parse_aggregation(spec: str) -> Aggregation:
    """The aggregation a metric lists as `spec`; raises ValueError naming the allowed ones."""
    plain = _PLAINS.get(spec.strip())
    if plain is not None:
        return plain
    call = _CALL.fullmatch(spec.strip())
    if call is None:
        raise ValueError(f"unknown aggregation {spec!r}; allowed: {NAMES}")
    return _SKETCHED[call.group(1)](call.group(2))


def check_aggregations(aggregations: Sequence[Aggregation]) -> None:
    """A metric's aggregations as a set: no repeats, and at most one `quantiles` (its outputs
    `p50`... carry no field name); raises ValueError saying what to change."""
    specs = [a.spec for a in aggregations]
    if len(set(specs)) != len(specs):
        raise ValueError("aggregations must not repeat (at most one distinct(<field>) a field)")
    if sum(isinstance(a, Quantiles) for a in aggregations) > 1:
        raise ValueError(
            "a metric lists at most one quantiles(<field>) (its outputs p50, p99... name no "
            "field); define another metric for another field"
        )


# --------------------------------------------------------------------------- a metric's set


@dataclass(frozen=True)
class AggregationSet:
    """A metric's aggregations in configured order, with its sketch slots."""

    aggregations: tuple[Aggregation, ...]

    @cached_property
    def sketched(self) -> tuple[Aggregation, ...]:
        """The sketch aggregations, in slot order."""
        return tuple(a for a in self.aggregations if a.kind is not None)

    @cached_property
    def kinds(self) -> tuple[SketchKind, ...]:
        """The sketch slots' kinds (read per cell in the hot paths: computed once)."""
        return tuple(a.kind for a in self.sketched if a.kind is not None)

    def slot_of(self, aggregation: Aggregation) -> int:
        return self.sketched.index(aggregation) if aggregation.kind is not None else -1

    def output_names(self, options: RenderOptions = DEFAULT_RENDER) -> tuple[str, ...]:
        return tuple(name for a in self.aggregations for name in a.output_names(options))

    def needs_sketches(self, parts: int) -> bool:
        """Whether rendering the merge of `parts` stored states needs their sketch bytes."""
        return any(k.needs_bytes(parts) for k in self.kinds)

    def render(self, state: CellState | None, options: RenderOptions) -> dict[str, Number] | None:
        """The outputs of a merged state, in configured order (None: no events)."""
        if state is None or not state.count:
            return None
        out: dict[str, Number] = {}
        slot = 0
        for aggregation in self.aggregations:
            out.update(aggregation.render(state, slot, options))
            if aggregation.kind is not None:
                slot += 1
        return out

    def ranking(self, by: str) -> Ranking | None:
        """How `top` ranks by `by` (None: no aggregation of the metric renders it)."""
        for aggregation in self.aggregations:
            options = aggregation.ranks_by(by)
            if options is not None:
                return Ranking(by, aggregation, self.slot_of(aggregation), options)
        return None


@dataclass(frozen=True)
class Ranking:
    """What `top` ranks by: one output of one aggregation, computed from states that carry
    only that aggregation's sketch slot (`slot`; -1 for the plain aggregations)."""

    by: str
    aggregation: Aggregation
    slot: int
    options: RenderOptions

    def needs_sketch(self, parts: int) -> bool:
        """Whether the ranked value of `parts` merged stored states needs their sketch bytes."""
        kind = self.aggregation.kind
        return kind is not None and kind.needs_bytes(parts)

    def value(self, states: Sequence[CellState]) -> Number:
        """The ranked value of the merge of `states` (None: no events)."""
        kind = self.aggregation.kind
        merged = merge_states(() if kind is None else (kind,), states)
        if merged is None:
            return None
        return self.aggregation.render(merged, 0, self.options)[self.by]


# --------------------------------------------------------------------------- Spark


PLAIN_COLUMNS = ("count", "sum", "min", "max")
"""The plain state columns, in storage order."""


def spark_plain_partial(value: Column) -> list[Column]:
    """The plain columns aggregated from events (`value` null when the metric has none)."""
    from pyspark.sql import functions as F

    return [
        F.count(F.lit(1)).alias("count"),
        F.coalesce(F.sum(value), F.lit(0.0)).alias("sum"),
        F.min(value).alias("min"),
        F.max(value).alias("max"),
    ]


def spark_plain_merge() -> list[Column]:
    """The plain columns of many states merged (the Spark side of `merge_states`)."""
    from pyspark.sql import functions as F

    return [
        F.sum("count").alias("count"),
        F.sum("sum").alias("sum"),
        F.min("min").alias("min"),
        F.max("max").alias("max"),
    ]
