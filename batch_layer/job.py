"""One batch run: snapshot → read → aggregate → publish, recorded in the run log (rule 7).
What differs between the modes (where a run reads from, how W moves, how it publishes) is its
`RunPlan` (`run_plan`); this module runs any plan the same way."""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass, field
from typing import Any

import psutil
import psycopg
import pyarrow as pa
from psycopg.types.json import Jsonb
from pyspark.sql import SparkSession

from batch_layer.aggregate import SourceResult, aggregate_source
from batch_layer.decode import InputLayout
from batch_layer.errors import RunNotExecutable
from batch_layer.kafka_source import plan_slices, source_rows
from batch_layer.lookups import read_versions
from batch_layer.progress import SPARK_SHARE, RunProgress
from batch_layer.publish import Expired, Publication, expire_cells
from batch_layer.run_plan import Results, RunPlan, plan_run
from batch_layer.snapshot import Snapshot
from shared.config import RunMode, Settings, SourceConfig
from shared.db.cell_tables import drop_detached_ranges
from shared.db.connect import connect
from shared.db.runs import RunRecord, get_run, mark_failed, try_runner_lock
from shared.db.served import ServedView
from shared.metric_plan import read_plans, versions_of

log = logging.getLogger(__name__)


@dataclass
class RunSummary:
    run_id: int
    generation: int
    mode: str = "full"
    """The mode the run executed."""
    rows_in: int = 0
    rows_out: int = 0
    malformed: int = 0
    skipped: dict[str, int] = field(default_factory=dict)
    reused_ids: int = 0
    """Ids read at more than one event time (`SourceResult.reused_ids`), summed over sources."""
    watermarks: dict[str, int | None] = field(default_factory=dict)
    snapshot: Snapshot = field(default_factory=dict)
    timings: dict[str, float] = field(default_factory=dict)
    expired: Expired = field(default_factory=lambda: Expired(0, 0))
    """What retention removed with the publication (rule 14): cells deleted, time ranges
    dropped."""


def execute_run(
    settings: Settings,
    spark: SparkSession,
    run_id: int,
    *,
    force_mode: RunMode | None = None,
    hold_lock: bool = True,
) -> RunSummary:
    """Execute run `run_id` (queued, or already claimed `running` by a runner) and record its
    outcome; on failure the run is marked failed with the error text and the error re-raised.

    Unless the caller holds it already (`hold_lock=False`: the runner), the run takes the runner
    lock for its duration, so no runner executes another run meanwhile (and none mistakes this
    one for a dead runner's); RunNotExecutable when a runner holds it."""
    with ExitStack() as stack:
        if hold_lock:
            lock = stack.enter_context(connect(settings.postgres.url, autocommit=True))
            if not try_runner_lock(lock):
                raise RunNotExecutable(
                    f"run {run_id} stays queued: a runner is executing runs (it will run it)"
                )
        return _execute_locked(settings, spark, run_id, force_mode)


def _execute_locked(
    settings: Settings, spark: SparkSession, run_id: int, force_mode: RunMode | None
) -> RunSummary:
    with connect(settings.postgres.url) as conn:
        nice_local_backend(conn, settings.batch.nice)
        record = _start(conn, run_id)
        try:
            with RunProgress(
                settings.postgres.url, spark, run_id, settings.batch.heartbeat_s
            ) as progress:
                summary = _execute(settings, spark, conn, record, force_mode, progress)
        except BaseException as exc:
            conn.rollback()
            mark_failed(conn, run_id, f"{type(exc).__name__}: {exc}")
            conn.commit()
            raise
        conn.commit()
        try:
            drop_detached_ranges(conn)
        except psycopg.Error as exc:
            log.warning("the time ranges retention detached stay until the next run: %s", exc)
    return summary


def nice_local_backend(conn: psycopg.Connection[Any], nice: int) -> None:
    """Give the PostgreSQL backend serving the run's connection the niceness `nice` when it
    runs on this host: a publication's `COPY` and index work is the run's work too (an
    incremental run's 5.8M ids kept a backend at ~0.65 core for 20 s, and the speed worker
    sharing the cores fell behind). Nothing happens for a server on another host, a process
    that is not a PostgreSQL backend, or without the permission to renice it."""
    host = conn.info.host
    if nice <= 0 or not (host in ("localhost", "127.0.0.1", "::1") or host.startswith("/")):
        return
    try:
        backend = psutil.Process(conn.info.backend_pid)
        if backend.name() == "postgres" and backend.nice() < nice:
            backend.nice(nice)
    except psutil.Error:
        return


def run_full(settings: Settings, spark: SparkSession, run_id: int) -> RunSummary:
    """Recompute every metric from offset 0 up to a fresh snapshot and publish a generation."""
    return execute_run(settings, spark, run_id, force_mode="full")


def _start(conn: psycopg.Connection[Any], run_id: int) -> RunRecord:
    conn.execute(
        "UPDATE batch_runs SET status = 'running', started_at = now(), heartbeat_at = now() "
        "WHERE id = %s AND status = 'queued'",
        [run_id],
    )
    conn.commit()
    record = get_run(conn, run_id)
    conn.commit()
    if record is None or record.status != "running":
        state = "unknown" if record is None else record.status
        raise RunNotExecutable(f"run {run_id} is {state}; only queued runs execute")
    return record


def _execute(
    settings: Settings,
    spark: SparkSession,
    conn: psycopg.Connection[Any],
    record: RunRecord,
    force: RunMode | None,
    progress: RunProgress,
) -> RunSummary:
    began = time.monotonic()
    plan = plan_run(settings, spark, conn, record, force)
    summary = RunSummary(run_id=record.id, generation=0, mode=plan.mode, snapshot=plan.snapshot)
    summary.timings["snapshot_s"] = time.monotonic() - began
    results: Results = []
    rebuild_from: dict[str, dict[str, int]] = {}
    rebuild_index: dict[str, dict[str, list[list[int]]]] = {}
    history_index: dict[str, dict[str, list[list[int]]]] = {}
    stream_times: dict[str, dict[str, int]] = {}
    with plan.publishing(conn, settings):
        for i, source in enumerate(settings.sources):
            ids_known = plan.ids_sink(source, last=i == len(settings.sources) - 1)
            result = _read_and_aggregate(settings, spark, source, plan, summary, ids_known)
            results.append((source, result))
            rebuild_from[source.topic] = {
                str(p): result.rebuild_from.get(p, end)
                for p, end in ((int(k), v) for k, v in plan.snapshot[source.topic].items())
            }
            rebuild_index[source.topic] = {str(p): v for p, v in result.rebuild_index.items()}
            stream_times[source.topic] = {str(p): t for p, t in result.stream_times.items()}
            if result.history_index is not None:
                history_index[source.topic] = {str(p): v for p, v in result.history_index.items()}
        progress.floor(SPARK_SHARE)
        summary.timings["read_aggregate_s"] = (
            time.monotonic() - began - summary.timings["snapshot_s"]
        )
        published = time.monotonic()
        publication = Publication(
            plan.snapshot,
            summary.watermarks,
            rebuild_from,
            versions_of(settings.plans.values()),
            rebuild_index,
            history_index,
            stream_times,
        )
        summary.generation, summary.rows_out = plan.publish(conn, settings, results, publication)
        summary.expired = expire_cells(
            conn, summary.generation, settings.plans.values(), publication.watermarks
        )
    summary.timings["publish_s"] = time.monotonic() - published
    summary.timings["total_s"] = time.monotonic() - began
    _record_success(conn, record, summary, plan.served)
    return summary


def _record_success(
    conn: psycopg.Connection[Any], record: RunRecord, summary: RunSummary, served: ServedView | None
) -> None:
    conn.execute(
        """
        UPDATE batch_runs SET status = 'succeeded', finished_at = now(), progress = 1,
            heartbeat_at = now(), rows_in = %s, rows_out = %s, malformed = %s, skipped = %s,
            reused_ids = %s, snapshot = %s, w_before = %s, w_after = %s, generation = %s,
            executed_mode = %s, timings = %s
        WHERE id = %s
        """,
        [
            summary.rows_in,
            summary.rows_out,
            summary.malformed,
            Jsonb(summary.skipped),
            summary.reused_ids,
            Jsonb(summary.snapshot),
            Jsonb({} if served is None else served.watermarks),
            Jsonb({m: w for m, w in summary.watermarks.items() if w is not None}),
            summary.generation,
            summary.mode,
            Jsonb({k: round(v, 3) for k, v in summary.timings.items()}),
            record.id,
        ],
    )
    conn.commit()


def _read_and_aggregate(
    settings: Settings,
    spark: SparkSession,
    source: SourceConfig,
    plan: RunPlan,
    summary: RunSummary,
    ids_known: Callable[[pa.Table], None] | None,
) -> SourceResult:
    metrics = settings.plans_of(source)
    ends = {int(p): offset for p, offset in plan.snapshot[source.topic].items()}
    read = plan.source_read(source, metrics)
    slices = plan_slices(read.starts, ends, settings.spark.max_offsets_per_slice)
    rows = source_rows(spark, settings, source, metrics, slices)

    joins = InputLayout.of(read_plans(metrics)).joins
    versions = {
        join: read_versions(spark, settings, join, plan.snapshot[join.table.topic])
        for join in joins
    }

    def watermarks_of(stream_times: dict[int, int]) -> int | None:
        for metric in metrics:
            summary.watermarks[metric.name] = plan.watermark(metric, stream_times.values())
        known = [summary.watermarks[m.name] for m in metrics]
        return min((w for w in known if w is not None), default=None)

    result = aggregate_source(
        rows,
        source,
        metrics,
        watermarks_of,
        bucket_ms=math.gcd(*(m.base_window_ms for m in metrics)),
        read=read,
        seen_ids=plan.seen_ids(settings, source),
        ids_known=ids_known,
        time_range=plan.time_range,
        versions=versions,
    )
    summary.rows_in += result.rows_in
    summary.malformed += result.malformed
    summary.reused_ids += result.reused_ids
    for metric, count in result.skipped.items():
        summary.skipped[metric] = summary.skipped.get(metric, 0) + count
    return result
