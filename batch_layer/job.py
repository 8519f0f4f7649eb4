"""One batch run: snapshot → read → aggregate → publish, recorded in the run log."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import orjson
import psycopg
from psycopg.types.json import Jsonb
from pyspark.sql import SparkSession

from batch_layer.aggregate import SourceResult, aggregate_source
from batch_layer.kafka_source import plan_slices
from batch_layer.publish import Publication, publish_full_generation
from batch_layer.snapshot import Snapshot, take_snapshot
from shared.config import Settings, SourceConfig
from shared.db.connect import connect
from shared.db.served import ServedView, read_served
from shared.lateness import batch_watermark

log = logging.getLogger(__name__)


@dataclass
class RunSummary:
    run_id: int
    generation: int
    rows_in: int = 0
    rows_out: int = 0
    malformed: int = 0
    skipped: dict[str, int] = field(default_factory=dict)
    watermarks: dict[str, int | None] = field(default_factory=dict)


def run_full(settings: Settings, spark: SparkSession, run_id: int) -> RunSummary:
    """Recompute every metric from offset 0 up to a fresh snapshot and publish a generation."""
    with connect(settings.postgres.url) as conn:
        _mark_running(conn, run_id)
        try:
            summary = _run_full(settings, spark, conn, run_id)
        except BaseException as exc:
            conn.rollback()
            conn.execute(
                "UPDATE batch_runs SET status = 'failed', finished_at = now(), error = %s "
                "WHERE id = %s",
                [f"{type(exc).__name__}: {exc}", run_id],
            )
            conn.commit()
            raise
    return summary


def _mark_running(conn: psycopg.Connection[Any], run_id: int) -> None:
    conn.execute(
        "UPDATE batch_runs SET status = 'running', started_at = now(), heartbeat_at = now() "
        "WHERE id = %s",
        [run_id],
    )
    conn.commit()


def _run_full(
    settings: Settings, spark: SparkSession, conn: psycopg.Connection[Any], run_id: int
) -> RunSummary:
    served = read_served(conn)
    conn.commit()
    snapshot = take_snapshot(settings)
    summary = RunSummary(run_id=run_id, generation=0)
    rebuild_from: dict[str, dict[str, int]] = {}
    results: list[tuple[SourceConfig, SourceResult]] = []
    for source in settings.sources:
        result = _read_and_aggregate(settings, spark, source, snapshot, served, summary)
        results.append((source, result))
        rebuild_from[source.topic] = {
            str(p): result.rebuild_from.get(p, end)
            for p, end in ((int(k), v) for k, v in snapshot[source.topic].items())
        }
    versions = {m.name: settings.metric_version(m) for m in settings.metrics}
    publication = Publication(snapshot, summary.watermarks, rebuild_from, versions)
    generation, written = publish_full_generation(
        conn,
        _cell_rows(settings, results),
        _id_rows(results),
        [s.name for s, _ in results],
        publication,
    )
    summary.generation, summary.rows_out = generation, written
    conn.execute(
        """
        UPDATE batch_runs SET status = 'succeeded', finished_at = now(), progress = 1,
            rows_in = %s, rows_out = %s, malformed = %s, skipped = %s, snapshot = %s,
            w_before = %s, w_after = %s, generation = %s
        WHERE id = %s
        """,
        [
            summary.rows_in,
            written,
            summary.malformed,
            Jsonb(summary.skipped),
            Jsonb(snapshot),
            Jsonb({} if served is None else served.watermarks),
            Jsonb({m: w for m, w in summary.watermarks.items() if w is not None}),
            generation,
            run_id,
        ],
    )
    conn.commit()
    return summary


def _read_and_aggregate(
    settings: Settings,
    spark: SparkSession,
    source: SourceConfig,
    snapshot: Snapshot,
    served: ServedView | None,
    summary: RunSummary,
) -> SourceResult:
    metrics = list(settings.metrics_of(source))
    ends = {int(p): offset for p, offset in snapshot[source.topic].items()}
    slices = plan_slices({}, ends, settings.spark.max_offsets_per_slice)
    rows = (
        spark.read.format("lambda_kafka")
        .option("bootstrap", settings.kafka.bootstrap_servers)
        .option("source", source.model_dump_json())
        .option("metrics", orjson.dumps([m.model_dump(mode="json") for m in metrics]).decode())
        .option("slices", orjson.dumps(slices).decode())
        .load()
    )

    def watermarks_of(stream_times: dict[int, int]) -> int | None:
        for metric in metrics:
            previous = None
            if served is not None:
                previous = served.watermark(metric.name, settings.metric_version(metric))
            summary.watermarks[metric.name] = batch_watermark(
                previous, stream_times.values(), metric.grace, metric.base_window
            )
        known = [summary.watermarks[m.name] for m in metrics]
        return min((w for w in known if w is not None), default=None)

    result = aggregate_source(rows, source, metrics, watermarks_of)
    summary.rows_in += result.rows_in
    summary.malformed += result.malformed
    for metric, count in result.skipped.items():
        summary.skipped[metric] = summary.skipped.get(metric, 0) + count
    return result


def _cell_rows(
    settings: Settings, results: list[tuple[SourceConfig, SourceResult]]
) -> Iterator[tuple[Any, ...]]:
    for _source, result in results:
        for cell in result.cells.to_pylist():
            metric = settings.metric(cell["metric"])
            assert metric is not None
            width = len(metric.distinct_fields)
            yield (
                metric.name,
                settings.metric_version(metric),
                cell["window_ms"],
                cell["start_ms"],
                cell["key"],
                cell["count"],
                cell["sum"],
                cell["min"],
                cell["max"],
                cell["sketches"][:width],
                cell["distinct_estimates"][:width],
            )


def _id_rows(
    results: list[tuple[SourceConfig, SourceResult]],
) -> Iterator[tuple[str, str, int, int]]:
    for source, result in results:
        for row in result.ids.to_pylist():
            yield source.name, row["event_id"], row["partition"], row["offset"]
