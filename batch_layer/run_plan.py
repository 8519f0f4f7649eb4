"""One plan per run mode (rule 7): where each partition is read from, how W moves, which ids
count as seen, and how the run publishes (rule 6). `plan_run` picks the plan; `job` runs any
plan the same way.

- `FullRun`: every offset from 0 up to a fresh snapshot; loads and flips a new generation
  (`FullGeneration`, which loads the ids while Spark still works).
- `IncrementalRun`: from the served snapshot up to a fresh one; new ids are checked against
  the id table, the new events' cell states are merged into the served generation's cells and
  W advances. The new `rebuild_from` comes from the new events and the served rebuild index
  (a served row without one re-reads each partition from its `rebuild_from` once).
- `RangeRun`: `[start, end)` widened to the largest configured window's boundaries, read up to
  the served snapshot; only the cells in that range are replaced; W never moves.

A range run fails while the configuration holds a session metric (`RangeUnrunnable`; the
queue refuses one then, `RangeRefused`). Otherwise an incremental or range run whose served
cells were computed with other metric versions (or with no served view at all) executes as
`full`. When a table some metric joins has versions past the served snapshot, an incremental
run also recomputes that metric's cells from the earliest time those versions are valid from,
from every event (rule 11): it re-reads each partition from the first offset of an event at or
after that time (the rebuild index says where when it reaches back that far, else the history
index from that UTC day on, else from offset 0) and replaces those cells. A session metric
(and its parts) is recomputed the same way from `max_duration` before its source's earliest
new event, each key continued from its last stored session before that (rule 13)."""

from __future__ import annotations

import logging
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, ClassVar

import psycopg
import pyarrow as pa
import pyarrow.compute as pc
from psycopg import sql
from pyspark.sql import SparkSession

from batch_layer.aggregate import IdLookup, SourceRead, SourceResult
from batch_layer.errors import LogRewoundError, RangeUnrunnable
from batch_layer.kafka_source import earliest_event
from batch_layer.lookups import earliest_change
from batch_layer.publish import (
    FullGeneration,
    HorizonIds,
    Publication,
    copy_csv,
    drop_old_generations,
    publish_incremental,
    publish_range,
    retained_cells,
)
from batch_layer.rebuild_index import HISTORY_BUCKET_MS, first_offsets_since
from batch_layer.snapshot import Snapshot, take_snapshot
from shared.config import RunMode, Settings, SourceConfig
from shared.db.cell_tables import retention_groups
from shared.db.cells import BatchCell
from shared.db.connect import connect
from shared.db.runs import RunRecord, session_metrics
from shared.db.served import ServedView, read_served
from shared.db.sessions import boundary_sessions
from shared.metric_plan import MetricPlan, session_part_name, versions_of
from shared.windows import window_start

log = logging.getLogger(__name__)

Results = list[tuple[SourceConfig, SourceResult]]


@dataclass
class RunPlan(ABC):
    """What one run of a mode reads and how it publishes."""

    mode: ClassVar[RunMode]
    snapshot: Snapshot
    """The offsets the run reads up to."""
    served: ServedView | None
    """The served row when the run was planned."""
    time_range: tuple[int, int] | None = None
    """Only events in `[start, end)` are aggregated (range runs)."""

    def source_read(self, source: SourceConfig, metrics: Sequence[MetricPlan]) -> SourceRead:
        """Where the run reads `source` (whose metrics are `metrics`) from."""
        return SourceRead()

    def watermark(self, metric: MetricPlan, stream_times: Iterable[int]) -> int | None:
        """W of `metric` after the run, from the partitions' stream times (rule 5; a session
        metric's and its parts' by rule 13)."""
        kind = metric.windows if metric.sessions is None else metric.sessions
        return kind.watermark(self._served_watermark(metric), stream_times, metric.grace_ms)

    def seen_ids(self, settings: Settings, source: SourceConfig) -> IdLookup | None:
        """How the run finds ids an earlier run counted (None: none did)."""
        return None

    @contextmanager
    def publishing(self, conn: psycopg.Connection[Any], settings: Settings) -> Iterator[None]:
        """Held while the run reads and publishes (a full run's publishing transaction)."""
        yield

    def ids_sink(self, source: SourceConfig, *, last: bool) -> Callable[[pa.Table], None] | None:
        """Receives a source's new ids as soon as they are known (None: at publication)."""
        return None

    @abstractmethod
    def publish(
        self,
        conn: psycopg.Connection[Any],
        settings: Settings,
        results: Results,
        publication: Publication,
    ) -> tuple[int, int]:
        """Publish the run's cells (and ids) with `publication`: (generation, cells written)."""

    def _served_watermark(self, metric: MetricPlan) -> int | None:
        return None if self.served is None else self.served.watermark(metric.name, metric.version)


@dataclass
class FullRun(RunPlan):
    mode: ClassVar[RunMode] = "full"
    _generation: FullGeneration | None = None

    @contextmanager
    def publishing(self, conn: psycopg.Connection[Any], settings: Settings) -> Iterator[None]:
        with FullGeneration(conn, [s.name for s in settings.sources]) as generation:
            self._generation = generation
            yield
        drop_old_generations(conn)

    def ids_sink(self, source: SourceConfig, *, last: bool) -> Callable[[pa.Table], None] | None:
        generation = self._generation
        assert generation is not None, "ids are loaded inside `publishing`"
        if source.dedup_horizon is None:
            return lambda ids: generation.add_ids(_source_ids(source, ids), last=last)

        def remember(ids: pa.Table) -> None:
            generation.add_horizon_ids(_horizon_rows(source, ids))
            if last:
                generation.ids_done()

        return remember

    def publish(
        self,
        conn: psycopg.Connection[Any],
        settings: Settings,
        results: Results,
        publication: Publication,
    ) -> tuple[int, int]:
        assert self._generation is not None, "a full run publishes inside `publishing`"
        cells = retained_cells(
            _cell_table(settings, results), settings.plans.values(), publication.watermarks
        )
        reach = _horizon_reach(results, publication)
        groups = retention_groups(settings.plans.values())
        return self._generation.publish(cells, publication, reach, groups)


@dataclass
class IncrementalRun(RunPlan):
    mode: ClassVar[RunMode] = "incremental"
    recompute_from: dict[str, int] = field(default_factory=dict)
    """metric -> the start of the cells recomputed from every event (a boundary of all its
    windows): where the earliest version of a joined table read since the served snapshot is
    valid from (rule 11); for a session metric, `max_duration` before its source's earliest
    new event (rule 13)."""
    session_seeds: dict[str, dict[tuple[str, ...], int]] = field(default_factory=dict)
    """`SourceRead.session_seeds` of every source."""

    def source_read(self, source: SourceConfig, metrics: Sequence[MetricPlan]) -> SourceRead:
        served = self._served()
        fresh_from = {int(p): o for p, o in served.snapshot.get(source.topic, {}).items()}
        recompute_from = {
            m.name: self.recompute_from[m.name] for m in metrics if m.name in self.recompute_from
        }
        seeds = {
            m.name: self.session_seeds[m.name] for m in metrics if m.name in self.session_seeds
        }
        stream_times = {int(p): t for p, t in served.stream_times.get(source.topic, {}).items()}
        index = served.rebuild_index.get(source.topic)
        if index is None:  # published before the index existed: find the events after W again
            rebuild = {int(p): o for p, o in served.rebuild_from.get(source.topic, {}).items()}
            starts = {p: min(o, rebuild.get(p, o)) for p, o in fresh_from.items()}
            if recompute_from:
                starts = {}
            return SourceRead(
                starts,
                fresh_from,
                recompute_from=recompute_from,
                session_seeds=seeds,
                stream_times=stream_times,
            )
        previous = {int(p): pairs for p, pairs in index.items()}
        history = (served.history_index or {}).get(source.topic)
        days = None if history is None else {int(p): pairs for p, pairs in history.items()}
        starts = dict(fresh_from)
        since = min(recompute_from.values(), default=None)
        if since is not None:
            reread = first_offsets_since(previous, since, self._index_threshold(metrics))
            if reread is None and days is not None:
                reread = first_offsets_since(days, window_start(since, HISTORY_BUCKET_MS), None)
            starts = (
                {}
                if reread is None
                else {p: min(o, reread.get(p, o)) for p, o in fresh_from.items()}
            )
        return SourceRead(starts, fresh_from, previous, days, recompute_from, seeds, stream_times)

    def _index_threshold(self, metrics: Sequence[MetricPlan]) -> int | None:
        """The time from which the served rebuild index holds every event: the threshold the
        run that built it used, the smallest served W of the source's metrics (None: none has
        one, and the index holds every event)."""
        served = (self._served_watermark(m) for m in metrics)
        return min((w for w in served if w is not None), default=None)

    def seen_ids(self, settings: Settings, source: SourceConfig) -> IdLookup | None:
        return None if source.id_field is None else _id_lookup(settings.postgres.url, source)

    def publish(
        self,
        conn: psycopg.Connection[Any],
        settings: Settings,
        results: Results,
        publication: Publication,
    ) -> tuple[int, int]:
        served = self._served()
        written = publish_incremental(
            conn,
            served.generation,
            served.snapshot,
            _cell_rows(settings, results),
            _id_rows(results),
            publication,
            {m.name: m.kinds for m in settings.plans.values()},
            [(m, settings.plans[m].version, since) for m, since in self.recompute_from.items()],
            _horizon_ids(results, publication),
        )
        return served.generation, written

    def _served(self) -> ServedView:
        assert self.served is not None, "an incremental run follows a served view"
        return self.served


@dataclass
class RangeRun(RunPlan):
    mode: ClassVar[RunMode] = "range"
    replaced: tuple[tuple[str, str, int, int, int], ...] = ()
    """(metric, version, window_ms, first start, end of starts) of the recomputed cells."""

    def watermark(self, metric: MetricPlan, stream_times: Iterable[int]) -> int | None:
        return self._served_watermark(metric)

    def publish(
        self,
        conn: psycopg.Connection[Any],
        settings: Settings,
        results: Results,
        publication: Publication,
    ) -> tuple[int, int]:
        assert self.served is not None, "a range run follows a served view"
        written = publish_range(
            conn,
            self.served.generation,
            self.served.snapshot,
            self.replaced,
            _in_ranges(_cell_rows(settings, results), self.replaced),
        )
        return self.served.generation, written


def plan_run(
    settings: Settings,
    spark: SparkSession,
    conn: psycopg.Connection[Any],
    record: RunRecord,
    force: RunMode | None,
) -> RunPlan:
    """The plan of run `record` (`force`: the mode to run instead of the requested one).

    Raises `RangeUnrunnable` for a range while the configuration holds a session metric,
    whatever is served: the queue refuses such a range (`RangeRefused`), so this one was
    queued before, and it fails rather than run as the full run nobody asked for."""
    mode: RunMode = force or record.request.mode
    sessions = session_metrics(settings)
    if mode == "range" and sessions:
        raise RangeUnrunnable(sessions)
    served = read_served(conn)
    conn.commit()
    if mode != "full" and (
        served is None or served.versions != versions_of(settings.plans.values())
    ):
        log.info("run %s: served cells are of other metric versions; running full", record.id)
        mode = "full"
    if mode == "full":
        return FullRun(take_snapshot(settings), served)
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
        recompute_from = _recompute_from(settings, spark, snapshot, served)
        if recompute_from:
            log.info(
                "run %s: joined tables changed since the served snapshot; recomputing the "
                "cells of %s (rule 11)",
                record.id,
                ", ".join(f"{m} from {since}" for m, since in sorted(recompute_from.items())),
            )
        for name, since in _sessions_from(settings, spark, snapshot, served).items():
            recompute_from[name] = min(since, recompute_from.get(name, since))
        for metric in settings.plans.values():  # parts and rollups recompute with their parent
            parent = metric.session_part or metric.rollup
            if parent is not None and parent.parent in recompute_from:
                recompute_from[metric.name] = recompute_from[parent.parent]
        removed = _seeds_removed(settings, served, recompute_from)
        if removed:
            log.info(
                "run %s: %s would continue from stored sessions retention removed (rule 14); "
                "running full",
                record.id,
                ", ".join(removed),
            )
            return FullRun(snapshot, served)
        seeds = _session_seeds(conn, settings, served, recompute_from)
        conn.commit()
        return IncrementalRun(snapshot, served, recompute_from=recompute_from, session_seeds=seeds)
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
    return RangeRun(served.snapshot, served, time_range, replaced)


def _recompute_from(
    settings: Settings, spark: SparkSession, snapshot: Snapshot, served: ServedView
) -> dict[str, int]:
    """metric -> the start from which an incremental run recomputes its cells (rule 11): the
    earliest valid-from time among the versions of its joined tables past the served snapshot
    (for a session metric, `max_duration` before it: a session starting up to then may hold
    events the change moves), floored to a boundary of all the metric's windows (so every cell
    lies wholly on one side)."""
    joined = {lookup.table for m in settings.plans.values() for lookup in m.lookups}
    changes = {
        table.name: earliest_change(
            spark, settings, table, served.snapshot.get(table.topic, {}), snapshot[table.topic]
        )
        for table in joined
        if snapshot[table.topic] != served.snapshot.get(table.topic)
    }
    recompute_from = {}
    for metric in settings.plans.values():
        times = [
            t for lookup in metric.lookups if (t := changes.get(lookup.table.name)) is not None
        ]
        if times:
            since = min(times)
            if metric.sessions is not None:  # sessions reaching `since` change too (rule 13)
                since -= metric.sessions.rule.max_duration_ms
            recompute_from[metric.name] = metric.windows.floor_aligned(since)
    return recompute_from


def _sessions_from(
    settings: Settings, spark: SparkSession, snapshot: Snapshot, served: ServedView
) -> dict[str, int]:
    """Session metric -> the start from which an incremental run recomputes its cells and its
    parts' (rule 13): its source's earliest new event time less `max_duration`, floored to a
    boundary of all its windows. A stored session starting before that lies wholly
    `max_duration` before every new event, so none can join, bridge or re-cut it."""
    recompute_from: dict[str, int] = {}
    for source in settings.sources:
        plans = settings.plans_of(source)
        owners = [m for m in plans if m.holds_sessions]
        if not owners:
            continue
        ends = {int(p): o for p, o in snapshot[source.topic].items()}
        starts = {int(p): o for p, o in served.snapshot.get(source.topic, {}).items()}
        earliest = earliest_event(spark, settings, source, starts, ends)
        if earliest is None:
            continue
        for metric in owners:
            assert metric.sessions is not None
            since = earliest - metric.sessions.rule.max_duration_ms
            recompute_from[metric.name] = metric.windows.floor_aligned(since)
    return recompute_from


def _seeds_removed(
    settings: Settings, served: ServedView, recompute_from: Mapping[str, int]
) -> list[str]:
    """The session metrics whose recompute would continue each key from a stored session
    (`_session_seeds`: starting up to `max_duration` before it) that retention may have
    removed under the served W (rule 14): a late event that far back re-cuts sessions after
    it, which only the sessions before it can anchor, so the run recomputes from the log."""
    removed = []
    for metric in settings.plans.values():
        since = recompute_from.get(metric.name)
        if metric.sessions is None or not metric.holds_sessions or since is None:
            continue
        watermark = served.watermark(metric.name, metric.version)
        kept_from = metric.windows.kept_from(metric.base_window_ms, watermark)
        if kept_from is not None and since - metric.sessions.rule.max_duration_ms < kept_from:
            removed.append(metric.name)
    return removed


def _session_seeds(
    conn: psycopg.Connection[Any],
    settings: Settings,
    served: ServedView,
    recompute_from: Mapping[str, int],
) -> dict[str, dict[tuple[str, ...], int]]:
    """Session metric -> key -> the last event time of its last stored session starting
    before the metric's recomputed cells, when it may reach them (`boundary_sessions`)."""
    seeds: dict[str, dict[tuple[str, ...], int]] = {}
    for metric in settings.plans.values():
        since = recompute_from.get(metric.name)
        if not metric.holds_sessions or since is None:
            continue
        part = settings.plans[session_part_name(metric.name, "sessions")]
        found = boundary_sessions(conn, served.generation, metric, part, since)
        seeds[metric.name] = {key: session.last for key, session in found.items()}
    return seeds


def _id_lookup(postgres_url: str, source: SourceConfig) -> IdLookup:
    """The ids among a run's first copies that an earlier run already counted: in the whole
    source, or in the copy's partition for a source with a de-dup horizon (rule 4)."""
    if source.dedup_horizon is None:
        table, columns, found = "dedup_ids", ["event_id"], ["event_id", "partition", "offset"]
    else:
        table, columns = "horizon_ids", ["partition", "event_id"]
        found = ["event_id", "partition", "offset", "time_ms"]
    probe = sql.SQL(", ").join(map(sql.Identifier, columns))
    joined = sql.SQL(" AND ").join(
        sql.SQL("d.{0} = p.{0}").format(sql.Identifier(c)) for c in columns
    )

    def lookup(candidates: pa.Table) -> pa.Table:
        with connect(postgres_url) as conn:
            conn.execute(
                "CREATE TEMP TABLE probe_ids (partition int, event_id text) ON COMMIT DROP"
            )
            copy_csv(
                conn,
                sql.SQL("COPY probe_ids ({}) FROM STDIN (FORMAT csv)").format(probe),
                candidates.select(columns).to_batches(200_000),
            )
            rows = conn.execute(
                sql.SQL("SELECT {} FROM probe_ids p JOIN {} d ON d.source = %s AND {}").format(
                    sql.SQL(", ").join(sql.Identifier("d", c) for c in found),
                    sql.Identifier(table),
                    joined,
                ),
                [source.name],
            ).fetchall()
            conn.rollback()
        return pa.table(
            {
                name: pa.array([r[i] for r in rows], _ID_COLUMNS[name])
                for i, name in enumerate(found)
            }
        )

    return lookup


_ID_COLUMNS = {
    "event_id": pa.string(),
    "partition": pa.int32(),
    "offset": pa.int64(),
    "time_ms": pa.int64(),
}
"""The types of what an id lookup returns."""


def _horizon_rows(source: SourceConfig, ids: pa.Table) -> pa.Table:
    """(source, partition, event_id, offset, time_ms) of a source's ids to remember."""
    return pa.table(
        {
            "source": pa.repeat(pa.scalar(source.name, pa.string()), ids.num_rows),
            **{name: ids.column(name) for name in ("partition", "event_id", "offset", "time_ms")},
        }
    )


def _horizon_reach(
    results: Results, publication: Publication
) -> dict[tuple[str, int], tuple[int, int]]:
    """`HorizonIds.reach` of the run's sources with a de-dup horizon."""
    return {
        (source.name, int(partition)): (stream_time, source.dedup_horizon)
        for source, _ in results
        if source.dedup_horizon is not None
        for partition, stream_time in publication.stream_times.get(source.topic, {}).items()
    }


def _horizon_ids(results: Results, publication: Publication) -> HorizonIds | None:
    """What an incremental run writes of the ids of its sources with a de-dup horizon (None:
    it has none)."""
    tables = [
        _horizon_rows(source, result.horizon_ids)
        for source, result in results
        if result.horizon_ids is not None
    ]
    if not tables:
        return None
    return HorizonIds(pa.concat_tables(tables), _horizon_reach(results, publication))


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
        ("sketch_summaries", pa.list_(pa.float64())),
    ]
)
"""The columns of a run's cells as publication loads them (the `batch_cells` columns)."""


def _cell_rows(
    settings: Settings, results: list[tuple[SourceConfig, SourceResult]]
) -> Iterator[BatchCell]:
    plans = settings.plans
    for _source, result in results:
        for cell in result.cells.to_pylist():
            metric = plans[cell["metric"]]
            yield BatchCell(version=metric.version, **cell)


def _in_ranges(
    cells: Iterator[BatchCell], ranges: tuple[tuple[str, str, int, int, int], ...]
) -> Iterator[BatchCell]:
    """The cells whose start lies in their (metric, window)'s recomputed range."""
    bounds: Mapping[tuple[str, int], tuple[int, int]] = {
        (metric, w): (lo, hi) for metric, _v, w, lo, hi in ranges
    }
    for cell in cells:
        lo, hi = bounds[(cell.metric, cell.window_ms)]
        if lo <= cell.start_ms < hi:
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


def _id_rows(results: list[tuple[SourceConfig, SourceResult]]) -> pa.Table:
    """(source, event_id, partition, offset) of every source's new ids."""
    tables = [_source_ids(source, result.ids) for source, result in results]
    if not tables:
        return pa.table({"source": [], "event_id": [], "partition": [], "offset": []})
    return pa.concat_tables(tables)
