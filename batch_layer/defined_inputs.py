"""The inputs of metrics with definitions (rule 10 in docs/semantics.md), computed in Spark.

A metric with `fields`, a `where` or a nested input reads its events through its definitions.
The data source gives the JSON paths they read as columns (`batch_layer.raw_reads.RawRead`); here
the computed fields are evaluated as Spark columns (`batch_layer.expressions`, no Python UDF),
then `where`, then each input is checked as `shared.events.metric_inputs` checks it, in the same
order, so the first failing check gives the same skip reason in both layers.

Metric i's columns replace the data source's empty `s<i>` (its skip reason, or `FILTERED` when
`where` is not TRUE) and add `m<i>k<d>` (key texts), `m<i>v` (the value) and `m<i>x<slot>` (each
sketch slot's item), which `batch_layer.aggregate.metric_inputs` reads for it. Each computed
expression's parts are columns of projection stages (`batch_layer.expressions.Stages`), so an
expression reading a computed field reads its columns rather than copying its tree.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from batch_layer.decode import InputLayout
from batch_layer.expressions import (
    SparkValue,
    Stages,
    compile_value,
    is_true,
    number_of,
    text_of,
)
from batch_layer.lookups import with_lookups
from batch_layer.raw_reads import JoinRead
from shared.events import MAX_KEY_BYTES, MAX_TEXT_BYTES, VALUE_LIMIT
from shared.expressions.syntax import Computed, EventTime, Field, Node
from shared.metric_plan import MetricPlan

FILTERED = "filtered"
"""The reason column's mark of an event the metric's `where` does not select: neither counted
nor skipped."""

_PARTS = ("boolean", "bigint", "double", "string")


def with_defined_inputs(
    rows: DataFrame,
    metrics: Sequence[MetricPlan],
    versions: Mapping[JoinRead, DataFrame] | None = None,
) -> DataFrame:
    """`rows` (laid out by `InputLayout.of(metrics)`) with the columns of every metric that
    has definitions, after the joins of their lookups with the tables' `versions` (rule 11,
    `batch_layer.lookups`)."""
    layout = InputLayout.of(metrics)
    if layout.joins:
        if versions is None:
            raise ValueError("the metrics join tables: give their versions")
        rows = with_lookups(rows, layout, versions)
    for i, metric in enumerate(metrics):
        if metric.definitions is not None:
            rows = _Metric(i, metric, layout).columns(rows)
    return rows.drop(*layout.definition_inputs())


def key_column(i: int, dim: int) -> str:
    return f"m{i}k{dim}"


def value_column(i: int) -> str:
    return f"m{i}v"


def item_column(i: int, slot: int) -> str:
    return f"m{i}x{slot}"


class _Metric:
    def __init__(self, i: int, metric: MetricPlan, layout: InputLayout) -> None:
        assert metric.definitions is not None
        self.i = i
        self.metric = metric
        self.definitions = metric.definitions
        self.layout = layout
        self.computed: dict[str, SparkValue] = {}
        self.raws: dict[tuple[str, ...], SparkValue] = {}
        self.aliases = {lookup.alias for lookup in metric.lookups}

    def raw(self, path: tuple[str, ...]) -> SparkValue:
        """A raw JSON field's parts: one object per path, so the stages name them once."""
        value = self.raws.get(path)
        if value is None:
            parts = (F.col(self.column(path, part)) for part in "bids")
            value = self.raws[path] = SparkValue(*parts)
        return value

    def column(self, path: tuple[str, ...], part: str) -> str:
        """The column of one part of a path the metric reads: the event's, or the joined
        version's when the path starts with a lookup's name (rule 11)."""
        if path[0] in self.aliases:
            join = self.layout.join_of(self.metric, path[0])
            return self.layout.joined_column(join, path[1:], part)
        return self.layout.raw_column(path, part)

    def zone_offset(self, instant: Field | EventTime, zone: str) -> Column:
        path = instant.path if isinstance(instant, Field) else None
        return F.col(self.layout.zone_column(path, zone))

    def value(self, node: Node, stages: Stages) -> SparkValue:
        return compile_value(
            node,
            self.raw,
            self.computed.__getitem__,
            F.col("time_ms"),
            self.zone_offset,
            stages,
        )

    def columns(self, rows: DataFrame) -> DataFrame:
        prefix = f"_m{self.i}_"
        stages = Stages(prefix)
        for name, node in self.definitions.fields:
            self.computed[name] = self.value(node, stages)
        where = None
        if self.definitions.where is not None:
            where = self.value(self.definitions.where, stages)
        rows = stages.apply(rows)
        reasons: list[Column] = []
        if where is not None:
            reasons.append(F.when(~is_true(where), F.lit(FILTERED)))
        outputs: list[Column] = []
        texts = []
        for d, name in enumerate(self.metric.key):
            text, reason = self.text(name, "key", checked=True)
            texts.append(text)
            reasons.append(reason)
            outputs.append(text.alias(key_column(self.i, d)))
        if len(texts) > 2:
            total = sum((F.octet_length(t) for t in texts[1:]), F.octet_length(texts[0]))
            reasons.append(F.when(total > MAX_KEY_BYTES, F.lit("key_too_long")))
        if self.metric.value is not None:
            number, reason = self.number(self.metric.value, "value")
            reasons.append(reason)
            outputs.append(number.alias(value_column(self.i)))
        for slot, sketch in enumerate(self.metric.sketch_inputs):
            prefix = sketch.missing.removesuffix("_missing")
            if sketch.number:
                item, reason = self.number(sketch.field, prefix)
            else:
                item, reason = self.text(sketch.field, prefix, checked=False)
            reasons.append(reason)
            outputs.append(item.alias(item_column(self.i, slot)))
        skip = F.coalesce(*reasons) if len(reasons) > 1 else reasons[0] if reasons else F.lit(None)
        rows = rows.withColumn(f"s{self.i}", skip.cast("string"))
        return rows.select(*[c for c in rows.columns if not c.startswith(prefix)], *outputs)

    def _read(self, name: str) -> tuple[Node, SparkValue | None, Column]:
        """A name's node, its computed value (None when it is raw) and whether it is absent."""
        node = self.definitions.reference(name)
        if isinstance(node, Computed):
            value = self.computed[name]
            present = [getattr(value, p) for p in _PARTS if getattr(value, p) is not None]
            absent = F.lit(True) if not present else _all(*(c.isNull() for c in present))
            return node, value, absent
        if isinstance(node, Field):
            return node, None, F.col(self.column(node.path, "m"))
        return node, None, F.lit(False)

    def text(self, name: str, prefix: str, *, checked: bool) -> tuple[Column, Column]:
        """An input's canonical text and its skip reason (NUL and length are `checked` for a
        key dimension, which the batch view stores)."""
        text, reason = self._input(name, prefix, "c", text_of, "string")
        if checked:
            reason = reason.when(F.instr(text, "\x00") > 0, F.lit(f"{prefix}_invalid")).when(
                F.octet_length(text) > MAX_TEXT_BYTES, F.lit(f"{prefix}_too_long")
            )
        return text, reason

    def number(self, name: str, prefix: str) -> tuple[Column, Column]:
        """An input's finite number and its skip reason."""
        number, reason = self._input(name, prefix, "n", number_of, "double")
        out_of_range = F.abs(number) >= F.lit(VALUE_LIMIT)
        return number, reason.when(out_of_range, F.lit(f"{prefix}_out_of_range"))

    def _input(
        self, name: str, prefix: str, part: str, of: Callable[[SparkValue], Column], kind: str
    ) -> tuple[Column, Column]:
        """An input read as `kind` (a computed value through `of`, a raw path's `part`, the
        event time cast) and its reason when it has none: missing or invalid."""
        node, value, absent = self._read(name)
        if value is not None:
            column = of(value)
        elif isinstance(node, EventTime):
            column = F.col("time_ms").cast(kind)
        else:
            assert isinstance(node, Field)
            column = F.col(self.column(node.path, part))
        missing, invalid = F.lit(f"{prefix}_missing"), F.lit(f"{prefix}_invalid")
        return column, F.when(column.isNull(), F.when(absent, missing).otherwise(invalid))


def _all(*conditions: Column) -> Column:
    result = conditions[0]
    for condition in conditions[1:]:
        result = result & condition
    return result
