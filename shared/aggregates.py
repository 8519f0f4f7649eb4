"""Mergeable aggregate states of one cell: count, sum, min, max (avg = sum / count) and one
Apache DataSketches HLL (lg_k 12) per `distinct(<field>)`, identical in both layers so sketches
union across them. Merging is associative and commutative."""

from __future__ import annotations

import math
import struct
from collections.abc import Iterable, Sequence

import datasketches as ds

from shared.metric_plan import MetricPlan

HLL_LG_K = 12
_HEADER = struct.Struct("<qdddH")
_LENGTH = struct.Struct("<I")


def new_sketch() -> ds.hll_sketch:
    return ds.hll_sketch(HLL_LG_K, ds.tgt_hll_type.HLL_4)


def union_sketches(sketches: Iterable[ds.hll_sketch]) -> ds.hll_sketch:
    union = ds.hll_union(HLL_LG_K)
    for sketch in sketches:
        union.update(sketch)
    return union.get_result(ds.tgt_hll_type.HLL_4)


def sketch_estimate(sketch: ds.hll_sketch) -> float:
    """The estimate of a sketch's registers alone, whatever merges built it.

    A sketch fed item by item carries an HIP estimate that a union result does not; reading
    every sketch through a union gives the one (composite) estimator in every layer, so a
    window's distinct count does not depend on how its cells were put together. The second
    update is what drops the HIP state (a union of one sketch copies it); it changes no
    register."""
    union = ds.hll_union(HLL_LG_K)
    union.update(sketch)
    union.update(sketch)
    return float(union.get_estimate())


def sketch_from_bytes(data: bytes) -> ds.hll_sketch:
    """Reads either layer's sketches (Spark's `hll_sketch_agg` emits HLL_8, we emit HLL_4)."""
    return ds.hll_sketch.deserialize(data)


class AggState:
    """The aggregate state of one cell (or of any set of events)."""

    __slots__ = ("count", "maximum", "minimum", "sketches", "total")

    def __init__(
        self,
        count: int = 0,
        total: float = 0.0,
        minimum: float = math.inf,
        maximum: float = -math.inf,
        sketches: Sequence[ds.hll_sketch] = (),
    ) -> None:
        self.count = count
        self.total = total
        self.minimum = minimum
        self.maximum = maximum
        self.sketches = list(sketches)

    @classmethod
    def empty(cls, distinct_count: int) -> AggState:
        return cls(sketches=[new_sketch() for _ in range(distinct_count)])

    def add(self, value: float | None, distincts: Sequence[str]) -> None:
        """Fold one event (its metric input) into the state."""
        self.count += 1
        if value is not None:
            self.total += value
            if value < self.minimum:
                self.minimum = value
            if value > self.maximum:
                self.maximum = value
        for sketch, item in zip(self.sketches, distincts, strict=True):
            sketch.update(item)

    def merge(self, other: AggState) -> AggState:
        """A new state equal to the aggregate over both states' events."""
        return AggState(
            self.count + other.count,
            self.total + other.total,
            min(self.minimum, other.minimum),
            max(self.maximum, other.maximum),
            [union_sketches(pair) for pair in zip(self.sketches, other.sketches, strict=True)],
        )

    def to_bytes(self) -> bytes:
        parts = [
            _HEADER.pack(self.count, self.total, self.minimum, self.maximum, len(self.sketches))
        ]
        for sketch in self.sketches:
            blob = sketch.serialize_compact()
            parts.append(_LENGTH.pack(len(blob)))
            parts.append(blob)
        return b"".join(parts)

    @classmethod
    def from_bytes(cls, data: bytes) -> AggState:
        count, total, minimum, maximum, n_sketches = _HEADER.unpack_from(data)
        offset = _HEADER.size
        sketches = []
        for _ in range(n_sketches):
            (length,) = _LENGTH.unpack_from(data, offset)
            offset += _LENGTH.size
            sketches.append(sketch_from_bytes(data[offset : offset + length]))
            offset += length
        return cls(count, total, minimum, maximum, sketches)

    def distinct_estimates(self) -> list[float]:
        return [sketch_estimate(sketch) for sketch in self.sketches]

    def outputs(self, metric: MetricPlan) -> dict[str, float | int | None]:
        """Exactly the metric's configured aggregations, named as the API names them."""
        return outputs_of(
            metric, self.count, self.total, self.minimum, self.maximum, self.distinct_estimates()
        )


def outputs_of(
    metric: MetricPlan,
    count: int,
    total: float,
    minimum: float,
    maximum: float,
    distinct_estimates: Sequence[float],
) -> dict[str, float | int | None]:
    """Point values from plain aggregate columns (the batch view stores these next to sketches)."""
    values: dict[str, float | int | None] = {
        "count": count,
        "sum": total,
        "min": minimum if count else None,
        "max": maximum if count else None,
        "avg": total / count if count else None,
    }
    for field, estimate in zip(metric.distinct_fields, distinct_estimates, strict=True):
        values[f"distinct_{field}"] = round(estimate)
    return {name: values[name] for name in metric.output_names}


def merge_all(states: Iterable[AggState]) -> AggState | None:
    """The merge of many states, unioning each sketch once (cheaper than pairwise merges)."""
    states = list(states)
    if not states:
        return None
    if len(states) == 1:
        return states[0]
    sketch_groups = zip(*(state.sketches for state in states), strict=True)
    return AggState(
        sum(s.count for s in states),
        math.fsum(s.total for s in states),
        min(s.minimum for s in states),
        max(s.maximum for s in states),
        [union_sketches(group) for group in sketch_groups],
    )
