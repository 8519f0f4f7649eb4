"""One batch run: snapshot → read → aggregate → publish, recorded in the run log (rule 7).

- `full`: every offset from 0 up to a fresh snapshot; loads and flips a new generation.
- `incremental`: from the served snapshot up to a fresh one; new ids are checked against the
  id table, the new events' cell states are merged into the served generation's cells and W
  advances. The new `rebuild_from` comes from the new events and the served rebuild index (a
  served row without one re-reads each partition from its `rebuild_from` once).
- `range`: `[start, end)` widened to the largest configured window's boundaries, read up to the
  served snapshot; only the cells in that range are replaced; W never moves.

An incremental or range run whose served cells were computed with other metric versions (or
with no served view at all) executes as `full`.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import ExitStack, nullcontext
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import orjson
import psycopg
import pyarrow as pa
import pyarrow.compute as pc
from psycopg import sql
from psycopg.types.json import Jsonb
from pyspark.sql import SparkSession

from batch_layer.aggregate import IdLookup, SourceResult, aggregate_source
from batch_layer.errors import LogRewoundError, RunNotExecutable
from batch_layer.kafka_source import plan_slices
from batch_layer.progress import SPARK_SHARE, RunProgress
from batch_layer.publish import (
    FullGeneration,
    Publication,
    copy_csv,
    drop_old_generations,
    publish_incremental,
    publish_range,
)
from batch_layer.snapshot import Snapshot, take_snapshot
from shared.config import RunMode, Settings, SourceConfig
from shared.db.connect import connect
from shared.db.runs import RunRecord, get_run, mark_failed, try_runner_lock
from shared.db.served import ServedView, read_served
from shared.lateness import batch_watermark
from shared.metric_plan import versions_of
from shared.windows import window_start

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
    watermarks: dict[str, int | None] = field(default_factory=dict)
    snapshot: Snapshot = field(default_factory=dict)
    timings: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class _Plan:
    mode: RunMode
    snapshot: Snapshot
    served: ServedView | None
    time_range: tuple[int, int] | None = None
    replaced: tuple[tuple[str, str, int, int, int], ...] = ()


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
    return summary


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


def _plan(
    settings: Settings, conn: psycopg.Connection[Any], record: RunRecord, force: RunMode | None
) -> _Plan:
    served = read_served(conn)
    conn.commit()
    mode: RunMode = force or record.request.mode
    if mode != "full" and (
        served is None or served.versions != versions_of(settings.plans.values())
    ):
        log.info("run %s: served cells are of other metric versions; running full", record.id)
        mode = "full"
    if mode == "full":
        return _Plan("full", take_snapshot(settings), served)
    assert served is not None
    if mode == "incremental":
        snapshot = take_snapshot(settings)
        for topic, ends in snapshot.items():
            for partition, end in ends.items():
                if end < served.snapshot.get(topic, {}).get(partition, 0):
                    raise LogRewoundError(
                        f"{topic}[{partition}] ends at offset {end}, before the served snapshot; "
                        "the topic was recreated: queue a full run"
                    )
        return _Plan("incremental", snapshot, served)
    assert record.range_start_ms is not None and record.range_end_ms is not None
    plans = settings.plans.values()
    largest = max(w for m in plans for w in m.windows_ms)
    lo = window_start(record.range_start_ms, largest)
    hi = -window_start(-record.range_end_ms, largest)
    replaced = tuple(
        (m.name, m.version, w, window_start(lo, w), -window_start(-hi, w))
        for m in plans
        for w in m.windows_ms
    )
    time_range = (min(r[3] for r in replaced), max(r[4] for r in replaced))
    return _Plan("range", served.snapshot, served, time_range, replaced)


def _execute(
    settings: Settings,
    spark: SparkSession,
    conn: psycopg.Connection[Any],
    record: RunRecord,
    force: RunMode | None,
    progress: RunProgress,
) -> RunSummary:
    began = time.monotonic()
    plan = _plan(settings, conn, record, force)
    summary = RunSummary(run_id=record.id, generation=0, mode=plan.mode, snapshot=plan.snapshot)
    summary.timings["snapshot_s"] = time.monotonic() - began
    results: list[tuple[SourceConfig, SourceResult]] = []
    rebuild_from: dict[str, dict[str, int]] = {}
    rebuild_index: dict[str, dict[str, list[list[int]]]] = {}
    full = FullGeneration(conn, [s.name for s in settings.sources]) if plan.mode == "full" else None
    with full or nullcontext():
        for i, source in enumerate(settings.sources):
            ids_known = None
            if full is not None:
                last = i == len(settings.sources) - 1
                ids_known = partial(_load_ids, full, source, last=last)
            result = _read_and_aggregate(settings, spark, source, plan, summary, ids_known)
            results.append((source, result))
            rebuild_from[source.topic] = {
                str(p): result.rebuild_from.get(p, end)
                for p, end in ((int(k), v) for k, v in plan.snapshot[source.topic].items())
            }
            rebuild_index[source.topic] = {str(p): v for p, v in result.rebuild_index.items()}
        progress.floor(SPARK_SHARE)
        summary.timings["read_aggregate_s"] = (
            time.monotonic() - began - summary.timings["snapshot_s"]
        )
        published = time.monotonic()
        served = plan.served
        versions = versions_of(settings.plans.values())
        publication = Publication(
            plan.snapshot, summary.watermarks, rebuild_from, versions, rebuild_index
        )
        if full is not None:
            summary.generation, summary.rows_out = full.publish(
                _cell_table(settings, results), publication
            )
    if full is not None:
        drop_old_generations(conn)
    elif plan.mode == "incremental":
        assert served is not None
        summary.generation = served.generation
        summary.rows_out = publish_incremental(
            conn,
            served.generation,
            served.snapshot,
            _cell_rows(settings, results),
            _id_rows(results),
            publication,
        )
    else:
        assert served is not None
        summary.generation = served.generation
        summary.rows_out = publish_range(
            conn,
            served.generation,
            served.snapshot,
            plan.replaced,
            _in_ranges(_cell_rows(settings, results), plan.replaced),
        )
    summary.timings["publish_s"] = time.monotonic() - published
    summary.timings["total_s"] = time.monotonic() - began
    _record_success(conn, record, summary, served)
    return summary


def _record_success(
    conn: psycopg.Connection[Any], record: RunRecord, summary: RunSummary, served: ServedView | None
) -> None:
    conn.execute(
        """
        UPDATE batch_runs SET status = 'succeeded', finished_at = now(), progress = 1,
            heartbeat_at = now(), rows_in = %s, rows_out = %s, malformed = %s, skipped = %s,
            snapshot = %s, w_before = %s, w_after = %s, generation = %s, executed_mode = %s,
            timings = %s
        WHERE id = %s
        """,
        [
            summary.rows_in,
            summary.rows_out,
            summary.malformed,
            Jsonb(summary.skipped),
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
    plan: _Plan,
    summary: RunSummary,
    ids_known: Callable[[pa.Table], None] | None,
) -> SourceResult:
    metrics = settings.plans_of(source)
    served = plan.served
    ends = {int(p): offset for p, offset in plan.snapshot[source.topic].items()}
    fresh_from: dict[int, int] | None = None
    previous_index: dict[int, list[list[int]]] | None = None
    starts: dict[int, int] = {}
    if plan.mode == "incremental":
        assert served is not None
        fresh_from = {int(p): o for p, o in served.snapshot.get(source.topic, {}).items()}
        starts = dict(fresh_from)
        index = served.rebuild_index.get(source.topic)
        if index is None:  # published before the index existed: find the events after W again
            rebuild = {int(p): o for p, o in served.rebuild_from.get(source.topic, {}).items()}
            starts = {p: min(o, rebuild.get(p, o)) for p, o in fresh_from.items()}
        else:
            previous_index = {int(p): pairs for p, pairs in index.items()}
    slices = plan_slices(starts, ends, settings.spark.max_offsets_per_slice)
    rows = (
        spark.read.format("lambda_kafka")
        .option("bootstrap", settings.kafka.bootstrap_servers)
        .option("source", source.model_dump_json())
        .option(
            "metrics", orjson.dumps([m.config.model_dump(mode="json") for m in metrics]).decode()
        )
        .option("slices", orjson.dumps(slices).decode())
        .option("fast_path", "true" if settings.spark.fast_path else "false")
        .load()
    )

    def watermarks_of(stream_times: dict[int, int]) -> int | None:
        for metric in metrics:
            previous = None
            if served is not None:
                previous = served.watermark(metric.name, metric.version)
            if plan.mode == "range":
                summary.watermarks[metric.name] = previous
            else:
                summary.watermarks[metric.name] = batch_watermark(
                    previous, stream_times.values(), metric.grace_ms, metric.base_window_ms
                )
        known = [summary.watermarks[m.name] for m in metrics]
        return min((w for w in known if w is not None), default=None)

    seen_ids = None
    if plan.mode == "incremental" and source.id_field is not None:
        seen_ids = _id_lookup(settings.postgres.url, source.name)
    result = aggregate_source(
        rows,
        source,
        metrics,
        watermarks_of,
        bucket_ms=math.gcd(*(m.base_window_ms for m in metrics)),
        fresh_from=fresh_from,
        previous_index=previous_index,
        seen_ids=seen_ids,
        ids_known=ids_known,
        time_range=plan.time_range,
    )
    summary.rows_in += result.rows_in
    summary.malformed += result.malformed
    for metric, count in result.skipped.items():
        summary.skipped[metric] = summary.skipped.get(metric, 0) + count
    return result


def _id_lookup(postgres_url: str, source: str) -> IdLookup:
    """The ids among a run's first copies that an earlier run already counted."""

    def lookup(candidates: pa.Table) -> pa.Table:
        with connect(postgres_url) as conn:
            conn.execute("CREATE TEMP TABLE probe_ids (event_id text) ON COMMIT DROP")
            copy_csv(
                conn,
                sql.SQL("COPY probe_ids (event_id) FROM STDIN (FORMAT csv)"),
                candidates.select(["event_id"]).to_batches(200_000),
            )
            rows = conn.execute(
                "SELECT p.event_id FROM probe_ids p JOIN dedup_ids d "
                "ON d.source = %s AND d.event_id = p.event_id",
                [source],
            ).fetchall()
            conn.rollback()
        return pa.table({"event_id": pa.array([r[0] for r in rows], pa.string())})

    return lookup


def _cell_table(settings: Settings, results: list[tuple[SourceConfig, SourceResult]]) -> pa.Table:
    """Every source's cells as one Arrow table in `publish`'s column order (a version column
    added), for a bulk load without per-cell Python."""
    plans = settings.plans.values()
    names = [m.name for m in plans]
    versions = pa.array([m.version for m in plans], pa.string())
    tables = []
    for _source, result in results:
        cells = result.cells
        if not cells.num_columns:
            continue
        version = pc.take(versions, pc.index_in(cells.column("metric"), value_set=pa.array(names)))
        tables.append(
            pa.table(
                {
                    "metric": cells.column("metric"),
                    "version": version,
                    **{name: cells.column(name) for name in CELL_SCHEMA.names[2:]},
                }
            )
        )
    if not tables:
        return CELL_SCHEMA.empty_table()
    return pa.concat_tables(tables, promote_options="permissive")


CELL_SCHEMA = pa.schema(
    [
        ("metric", pa.string()),
        ("version", pa.string()),
        ("window_ms", pa.int64()),
        ("start_ms", pa.int64()),
        ("key", pa.list_(pa.string())),
        ("count", pa.int64()),
        ("sum", pa.float64()),
        ("min", pa.float64()),
        ("max", pa.float64()),
        ("sketches", pa.list_(pa.binary())),
        ("distinct_estimates", pa.list_(pa.float64())),
    ]
)
"""The columns of a run's cells as publication loads them (the `batch_cells` columns)."""


def _cell_rows(
    settings: Settings, results: list[tuple[SourceConfig, SourceResult]]
) -> Iterator[tuple[Any, ...]]:
    plans = settings.plans
    for _source, result in results:
        for cell in result.cells.to_pylist():
            metric = plans[cell["metric"]]
            width = len(metric.distinct_fields)
            yield (
                metric.name,
                metric.version,
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


def _in_ranges(
    cells: Iterator[tuple[Any, ...]], ranges: tuple[tuple[str, str, int, int, int], ...]
) -> Iterator[tuple[Any, ...]]:
    """The cells whose start lies in their (metric, window)'s recomputed range."""
    bounds: Mapping[tuple[str, int], tuple[int, int]] = {
        (metric, w): (lo, hi) for metric, _v, w, lo, hi in ranges
    }
    for cell in cells:
        lo, hi = bounds[(cell[0], cell[2])]
        if lo <= cell[3] < hi:
            yield cell


def _source_ids(source: SourceConfig, ids: pa.Table) -> pa.Table:
    """(source, event_id, partition, offset) of one source's new ids."""
    return pa.table(
        {
            "source": pa.repeat(pa.scalar(source.name, pa.string()), ids.num_rows),
            "event_id": ids.column("event_id"),
            "partition": ids.column("partition"),
            "offset": ids.column("offset"),
        }
    )


def _load_ids(full: FullGeneration, source: SourceConfig, ids: pa.Table, *, last: bool) -> None:
    full.add_ids(_source_ids(source, ids), last=last)


def _id_rows(results: list[tuple[SourceConfig, SourceResult]]) -> pa.Table:
    """(source, event_id, partition, offset) of every source's new ids."""
    tables = [_source_ids(source, result.ids) for source, result in results]
    if not tables:
        return pa.table({"source": [], "event_id": [], "partition": [], "offset": []})
    return pa.concat_tables(tables)
