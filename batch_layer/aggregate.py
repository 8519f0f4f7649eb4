"""The batch computation in Spark: de-dup, stream times, cells. Cell and aggregate definitions
come from `shared` (metric inputs are produced by the shared parser in the data source)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import pyarrow as pa
from pyspark.sql import DataFrame, Window
from pyspark.sql import functions as F

from shared.aggregates import HLL_LG_K
from shared.config import MetricConfig, SourceConfig


@dataclass
class SourceResult:
    """What one source's read produced, collected to the driver."""

    cells: pa.Table
    ids: pa.Table
    stream_times: dict[int, int]
    rebuild_from: dict[int, int]
    """partition -> smallest offset whose event time is >= the source's smallest new W."""
    rows_in: int
    malformed: int
    skipped: dict[str, int]


def first_copies(records: DataFrame) -> DataFrame:
    """(partition, offset, event_id) of the first source-valid copy of each id."""
    order = Window.partitionBy("event_id").orderBy("partition", "offset")
    return (
        records.where(F.col("event_id").isNotNull())
        .withColumn("copy_no", F.row_number().over(order))
        .where(F.col("copy_no") == 1)
        .select("partition", "offset", "event_id")
    )


def cells_of(inputs: DataFrame, metrics: list[MetricConfig]) -> DataFrame:
    """Every configured window's cells (base and pre-rolled) of the given metric rows."""
    windows = F.create_map(
        *[
            part
            for m in metrics
            for part in (F.lit(m.name), F.array(*[F.lit(w) for w in m.windows]))
        ]
    )
    width = max((len(m.distinct_fields) for m in metrics), default=0)
    sketches = [
        F.hll_sketch_agg(F.get(F.col("distincts"), i), HLL_LG_K).alias(f"sketch_{i}")
        for i in range(width)
    ]
    grouped = (
        inputs.withColumn("window_ms", F.explode(F.element_at(windows, F.col("metric"))))
        .withColumn("start_ms", F.col("time_ms") - F.pmod(F.col("time_ms"), F.col("window_ms")))
        .groupBy("metric", "window_ms", "start_ms", "key")
        .agg(
            F.count(F.lit(1)).alias("count"),
            F.coalesce(F.sum("value"), F.lit(0.0)).alias("sum"),
            F.min("value").alias("min"),
            F.max("value").alias("max"),
            *sketches,
        )
    )
    return grouped.select(
        "metric",
        "window_ms",
        "start_ms",
        "key",
        "count",
        "sum",
        "min",
        "max",
        F.array(*[F.col(f"sketch_{i}") for i in range(width)]).alias("sketches"),
        F.array(*[F.hll_sketch_estimate(F.col(f"sketch_{i}")) for i in range(width)])
        .cast("array<double>")
        .alias("distinct_estimates"),
    )


def aggregate_source(
    rows: DataFrame,
    source: SourceConfig,
    metrics: list[MetricConfig],
    rebuild_threshold: Callable[[dict[int, int]], int | None],
) -> SourceResult:
    """De-dup, count and aggregate one source's metric-input rows (read once, persisted).

    `rebuild_threshold` maps the partitions' stream times to the smallest new W of the source's
    metrics; records from there on are where a speed rebuild starts (rule 5)."""
    rows = rows.persist()
    try:
        records = rows.where(F.col("metric").isNull())
        valid = records.where(F.col("malformed").isNull())
        inputs = rows.where(F.col("metric").isNotNull() & F.col("skip").isNull())
        ids = valid.limit(0).select("partition", "offset", "event_id")
        if source.id_field is not None:
            ids = first_copies(valid)
            inputs = inputs.join(ids.select("partition", "offset"), ["partition", "offset"], "semi")
        stream_times = {
            row["partition"]: row["stream_time"]
            for row in valid.groupBy("partition")
            .agg(F.max("time_ms").alias("stream_time"))
            .collect()
        }
        threshold = rebuild_threshold(stream_times)
        rebuild_from = {
            row["partition"]: row["first"]
            for row in valid.where(
                F.lit(True) if threshold is None else F.col("time_ms") >= F.lit(threshold)
            )
            .groupBy("partition")
            .agg(F.min("offset").alias("first"))
            .collect()
        }
        counts = records.agg(
            F.count(F.lit(1)).alias("rows_in"),
            F.count(F.col("malformed")).alias("malformed"),
        ).first()
        skipped = {
            row["metric"]: row["n"]
            for row in rows.where(F.col("skip").isNotNull())
            .groupBy("metric")
            .agg(F.count(F.lit(1)).alias("n"))
            .collect()
        }
        cells = cells_of(inputs, metrics).toArrow() if metrics else pa.table({})
        return SourceResult(
            cells=cells,
            ids=ids.toArrow(),
            stream_times=stream_times,
            rebuild_from=rebuild_from,
            rows_in=counts["rows_in"] if counts else 0,
            malformed=counts["malformed"] if counts else 0,
            skipped=skipped,
        )
    finally:
        rows.unpersist()
