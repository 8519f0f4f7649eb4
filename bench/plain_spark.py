"""The plain Spark jobs `bench/batch.py --peers` compares a full run with: what a user would
write in Spark instead of the batch layer, over the same topic, offsets and source reader.

Both read the full run's snapshot of the topic with the project's Spark data source
(`lambda_kafka`: the reader and decoder a full run uses, with the same options), drop the
malformed records and, per metric, the events the metric skips, compute every metric's cells
in every configured window with the same count, sum, min, max and the same HLL and KLL
sketches, and write them to Parquet in a directory of the caller's. Two plans:

- `plain` (the peer, `plain_cells`): every window's cells straight from the events, as a user
  writes it: one row per (event, metric, window), grouped by (metric, window, window start,
  key) with the registry's Spark partial aggregates (`spark_plain_partial`; each sketch kind's
  `spark_partial`); Spark plans the aggregation as it likes (partial aggregation before the
  shuffle, then a merge of the partial sketches).
- `batch_plan` (`batch_plan_cells`): the batch layer's own cells plan
  (`batch_layer.aggregate.base_cells`, `with_rollups`, `cells_of`: the inputs shuffled by cell
  start and aggregated into base cells with no partial aggregation, then rolled up into every
  window by the registry's merges), with nothing before or after it: what the batch layer's
  guarantees cost on top of the same computation.

What neither does, and a full run does: de-duplicate by event id (each copy counts), keep an
id table, compute the stream times, W and the rebuild index, persist the decoded records
(each job reads them once; nothing is cached), collect the cells to the driver, load them
into PostgreSQL and publish them atomically (rule 6), record the run. `plain` handles metrics
of raw top-level fields without rollups (no `where`, no computed fields); several metrics,
several windows, several sketches of a kind, yes. `batch_plan` handles any metric the batch
layer's plan does, except `where` and computed fields (their columns are not added)."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import orjson
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F

from batch_layer.aggregate import base_cells, cells_of, with_rollups
from batch_layer.decode import InputLayout
from batch_layer.kafka_source import plan_slices
from shared.aggregations import SketchKind, spark_plain_partial
from shared.config import Settings, SourceConfig
from shared.kafka import reader_options
from shared.metric_plan import MetricPlan, read_plans


@dataclass(frozen=True)
class PlainRun:
    wall_s: float
    group: str
    """The Spark job group its jobs ran in."""
    started: float
    """When it started (epoch seconds)."""


def _sketch_columns(metrics: Sequence[MetricPlan]) -> list[tuple[SketchKind, int, str]]:
    """(kind, index within the kind, column) of every sketch column: as many of a kind as the
    metric with the most of it has."""
    widths: dict[SketchKind, int] = {}
    for m in metrics:
        for kind in m.kinds:
            widths[kind] = max(widths.get(kind, 0), m.kinds.count(kind))
    return [(kind, i, f"{kind.name}_{i}") for kind, width in widths.items() for i in range(width)]


def plain_cells(rows: DataFrame, metrics: Sequence[MetricPlan]) -> DataFrame:
    """Every metric's cells of every window, from the data source's rows (laid out by
    `InputLayout.of(metrics)`), with no de-dup."""
    if any(m.definitions is not None or m.rollup is not None for m in metrics):
        raise ValueError("the plain Spark job handles raw-field metrics without rollups only")
    layout = InputLayout.of(metrics)
    sketches = _sketch_columns(metrics)

    def item(m: MetricPlan, kind: SketchKind, index: int) -> Column:
        element = "string" if kind.reads == "text" else "double"
        slots = [slot for slot, k in enumerate(m.kinds) if k is kind]
        if index >= len(slots):
            return F.lit(None).cast(element)
        field = m.sketch_inputs[slots[index]].field
        column = layout.text_column(field) if kind.reads == "text" else layout.number_column(field)
        return F.col(column).cast(element)

    def value(m: MetricPlan) -> Column:
        return F.lit(None) if m.value is None else F.col(layout.number_column(m.value))

    per_event = F.array(
        *[
            F.struct(
                F.lit(m.name).alias("metric"),
                F.lit(window).cast("bigint").alias("window_ms"),
                F.array(*[F.col(layout.text_column(d)) for d in m.key])
                .cast("array<string>")
                .alias("key"),
                value(m).cast("double").alias("value"),
                *[item(m, kind, index).alias(name) for kind, index, name in sketches],
                F.col(f"s{i}").alias("skipped"),
            )
            for i, m in enumerate(metrics)
            for window in m.windows_ms
        ]
    )
    start = F.col("time_ms") - F.pmod(F.col("time_ms"), F.col("window_ms"))
    return (
        rows.where(F.col("malformed").isNull())
        .select("time_ms", F.inline(per_event))
        .where(F.col("skipped").isNull())
        .groupBy("metric", "window_ms", start.alias("start_ms"), "key")
        .agg(
            *spark_plain_partial(F.col("value")),
            *[kind.spark_partial(F.col(name)).alias(name) for kind, _, name in sketches],
        )
    )


def batch_plan_cells(rows: DataFrame, metrics: Sequence[MetricPlan]) -> DataFrame:
    """Every metric's cells of every window by the batch layer's plan, with no de-dup; the
    rows laid out by `InputLayout.of(read_plans(metrics))`."""
    if any(m.definitions is not None for m in metrics):
        raise ValueError("the batch-plan job handles metrics without definitions only")
    valid = rows.where(F.col("malformed").isNull())
    return cells_of(with_rollups(base_cells(valid, read_plans(metrics)), metrics), metrics)


PLANS = {"plain": plain_cells, "batch_plan": batch_plan_cells}


def run_plain(
    spark: SparkSession,
    settings: Settings,
    source: SourceConfig,
    ends: dict[int, int],
    target: str,
    group: str,
    plan: str = "plain",
) -> PlainRun:
    """Read `source`'s partitions from offset 0 up to `ends`, compute the cells by `plan` (a
    key of `PLANS`) and write them as Parquet to directory `target` (replaced), as Spark job
    group `group`."""
    started, began = time.time(), time.monotonic()
    spark.sparkContext.setJobGroup(group, "plain Spark peer of a full run")
    try:
        metrics = settings.plans_of(source)
        slices = plan_slices({}, ends, settings.spark.max_offsets_per_slice)
        definitions = [m.config.model_dump(mode="json") for m in read_plans(metrics)]
        rows = (
            spark.read.format("lambda_kafka")
            .options(**reader_options(settings.kafka))
            .option("source", source.model_dump_json())
            .option("metrics", orjson.dumps(definitions).decode())
            .option("slices", orjson.dumps(slices).decode())
            .option("fast_path", "true" if settings.spark.fast_path else "false")
            .load()
        )
        PLANS[plan](rows, metrics).write.mode("overwrite").parquet(target)
    finally:
        spark.sparkContext.setLocalProperty("spark.jobGroup.id", None)  # type: ignore[arg-type]
    return PlainRun(time.monotonic() - began, group, started)


def cells_written(spark: SparkSession, target: str) -> int:
    """The cells in the Parquet directory (a check that the job wrote something)."""
    counted: Any = spark.read.parquet(target).count()
    return int(counted)
