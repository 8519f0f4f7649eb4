"""The batch computation in Spark: de-dup, stream times, cells. Cell and aggregate definitions
come from `shared` (metric inputs are produced by the shared parser in the data source)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import reduce

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import DataFrame
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


def first_copies(valid: DataFrame) -> DataFrame:
    """The whole row of the first source-valid copy read of each id (rule 4)."""
    others = [c for c in valid.columns if c not in ("event_id",)]
    first = F.min_by(F.struct(*others), F.struct("partition", "offset"))
    return (
        valid.where(F.col("event_id").isNotNull())
        .groupBy("event_id")
        .agg(first.alias("first"))
        .select("first.*", "event_id")
    )


def metric_inputs(events: DataFrame, metrics: list[MetricConfig]) -> DataFrame:
    """(metric, base window, time, key, value, distincts) of every event each metric uses."""
    parts = [
        events.where(F.col(f"s{i}").isNull()).select(
            F.lit(m.name).alias("metric"),
            F.lit(m.base_window).cast("bigint").alias("window_ms"),
            "time_ms",
            F.col(f"k{i}").alias("key"),
            F.col(f"v{i}").alias("value"),
            F.col(f"d{i}").alias("distincts"),
        )
        for i, m in enumerate(metrics)
    ]
    return reduce(DataFrame.unionAll, parts)


def _width(metrics: list[MetricConfig]) -> int:
    return max((len(m.distinct_fields) for m in metrics), default=0)


def base_cells(events: DataFrame, metrics: list[MetricConfig]) -> DataFrame:
    """Every metric's base-window cells of the given events (HLL sketches with
    `hll_sketch_agg`), as columns `sketch_<i>`."""
    width = _width(metrics)
    return (
        metric_inputs(events, metrics)
        .withColumn("start_ms", F.col("time_ms") - F.pmod(F.col("time_ms"), F.col("window_ms")))
        .groupBy("metric", "window_ms", "start_ms", "key")
        .agg(
            F.count(F.lit(1)).alias("count"),
            F.coalesce(F.sum("value"), F.lit(0.0)).alias("sum"),
            F.min("value").alias("min"),
            F.max("value").alias("max"),
            *[
                F.hll_sketch_agg(F.get(F.col("distincts"), i), HLL_LG_K).alias(f"sketch_{i}")
                for i in range(width)
            ],
        )
    )


def cells_of(base: DataFrame, metrics: list[MetricConfig]) -> DataFrame:
    """Every configured window's cells: the base cells, and the larger windows rolled up from
    them (`hll_union_agg`), so events are grouped once. Persist `base` before calling."""
    width = _width(metrics)
    levels = [base]
    for m in metrics:
        for w in m.windows[1:]:
            levels.append(
                base.where(F.col("metric") == F.lit(m.name))
                .withColumn("window_ms", F.lit(w).cast("bigint"))
                .withColumn("start_ms", F.col("start_ms") - F.pmod(F.col("start_ms"), F.lit(w)))
                .groupBy("metric", "window_ms", "start_ms", "key")
                .agg(
                    F.sum("count").alias("count"),
                    F.sum("sum").alias("sum"),
                    F.min("min").alias("min"),
                    F.max("max").alias("max"),
                    *[F.hll_union_agg(f"sketch_{i}").alias(f"sketch_{i}") for i in range(width)],
                )
            )
    grouped = reduce(DataFrame.unionAll, levels)
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


IdLookup = Callable[[pa.Table], pa.Table]
"""Given first copies (partition, offset, event_id) read by this run, return those whose id an
earlier run already counted (they are duplicates now)."""


def _fresh(frame: DataFrame, fresh_from: Mapping[int, int] | None) -> DataFrame:
    """Rows at or after each partition's first offset not read by an earlier run."""
    if not fresh_from:
        return frame
    starts = F.create_map(*[part for p, o in fresh_from.items() for part in (F.lit(p), F.lit(o))])
    return frame.where(
        F.col("offset") >= F.coalesce(F.element_at(starts, F.col("partition")), F.lit(0))
    )


def aggregate_source(
    rows: DataFrame,
    source: SourceConfig,
    metrics: list[MetricConfig],
    rebuild_threshold: Callable[[dict[int, int]], int | None],
    *,
    fresh_from: Mapping[int, int] | None = None,
    seen_ids: IdLookup | None = None,
    time_range: tuple[int, int] | None = None,
) -> SourceResult:
    """De-dup, count and aggregate one source's metric-input rows (read once, persisted).

    `rebuild_threshold` maps the partitions' stream times to the smallest new W of the source's
    metrics; records from there on are where a speed rebuild starts (rule 5).

    Incremental runs pass `fresh_from` (partition -> first offset an earlier run has not read;
    rows before it are read only to find `rebuild_from`) and `seen_ids` (the id table lookup).
    Range runs pass `time_range`: only events in `[start, end)` are aggregated."""
    rows = rows.persist()
    cached = [rows]
    try:
        all_valid = rows.where(F.col("malformed").isNull())
        fresh = _fresh(rows, fresh_from)
        valid = fresh.where(F.col("malformed").isNull())
        events = valid
        ids_table = pa.table(
            {
                "partition": pa.array([], pa.int32()),
                "offset": pa.array([], pa.int64()),
                "event_id": pa.array([], pa.string()),
            }
        )
        if source.id_field is not None:
            events = first_copies(valid).persist()
            cached.append(events)
            ids_table = events.select("partition", "offset", "event_id").toArrow()
            if seen_ids is not None and ids_table.num_rows:
                seen = seen_ids(ids_table)
                if seen.num_rows:
                    known = pc.is_in(
                        ids_table.column("event_id"), value_set=seen.column("event_id")
                    )
                    ids_table = ids_table.filter(pc.invert(known))
                    kept = rows.sparkSession.createDataFrame(ids_table.select(["event_id"]))
                    events = events.join(kept, ["event_id"], "semi")
        if time_range is not None:
            events = events.where(
                (F.col("time_ms") >= F.lit(time_range[0]))
                & (F.col("time_ms") < F.lit(time_range[1]))
            )
        stream_times = {
            row["partition"]: row["stream_time"]
            for row in all_valid.groupBy("partition")
            .agg(F.max("time_ms").alias("stream_time"))
            .collect()
        }
        threshold = rebuild_threshold(stream_times)
        rebuild_from = {
            row["partition"]: row["first"]
            for row in all_valid.where(
                F.lit(True) if threshold is None else F.col("time_ms") >= F.lit(threshold)
            )
            .groupBy("partition")
            .agg(F.min("offset").alias("first"))
            .collect()
        }
        counts = fresh.agg(
            F.count(F.lit(1)).alias("rows_in"),
            F.count(F.col("malformed")).alias("malformed"),
            *[F.count(F.col(f"s{i}")).alias(f"s{i}") for i in range(len(metrics))],
        ).first()
        assert counts is not None
        skipped = {m.name: counts[f"s{i}"] for i, m in enumerate(metrics) if counts[f"s{i}"]}
        cells = pa.table({})
        if metrics:
            base = base_cells(events, metrics).persist()
            cached.append(base)
            cells = cells_of(base, metrics).toArrow()
        return SourceResult(
            cells=cells,
            ids=ids_table,
            stream_times=stream_times,
            rebuild_from=rebuild_from,
            rows_in=counts["rows_in"],
            malformed=counts["malformed"],
            skipped=skipped,
        )
    finally:
        for frame in cached:
            frame.unpersist()
