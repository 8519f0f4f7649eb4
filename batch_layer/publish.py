"""Atomic publication (rule 6). A full run replaces the id table, loads a new generation into
its own table, indexes and attaches it as a partition of `batch_cells` and flips the served
row, all in one transaction (`FullGeneration`: it loads the ids while Spark still works).
Incremental and range runs upsert only the cells they changed into the served generation
(incremental runs merge their new states into the stored ones), write their ids and update
the served row, also in one transaction. A failed run rolls back and changes nothing served."""

from __future__ import annotations

import contextlib
import io
from collections.abc import Iterable, Iterator, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any, NamedTuple

import numpy as np
import psycopg
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv
from psycopg import sql

from batch_layer.errors import PublicationConflict
from shared.aggregations import SketchKind, merge_states
from shared.db.cell_tables import (
    RetentionGroup,
    TimeRange,
    add_time_ranges,
    create_generation,
    index_generation,
    partitions_of,
    time_ranges,
)
from shared.db.cells import CELL_COLUMNS, BatchCell
from shared.db.served import read_served
from shared.faults import fault_point
from shared.metric_plan import SESSION_WINDOW_MS, MetricPlan

_CELL_COLUMNS = ", ".join(("generation", *CELL_COLUMNS))
GENERATIONS_KEPT = 2


@dataclass(frozen=True)
class Publication:
    snapshot: Mapping[str, Mapping[str, int]]
    watermarks: Mapping[str, int | None]
    rebuild_from: Mapping[str, Mapping[str, int]]
    versions: Mapping[str, str]
    rebuild_index: Mapping[str, Mapping[str, list[list[int]]]] = field(default_factory=dict)
    history_index: Mapping[str, Mapping[str, list[list[int]]]] = field(default_factory=dict)
    stream_times: Mapping[str, Mapping[str, int]] = field(default_factory=dict)


HORIZON_IDS_PARTITION_MS = 86_400_000
"""The event-time span of one table of `horizon_ids` (a UTC day)."""


@dataclass(frozen=True)
class HorizonIds:
    """What a run writes of the ids of sources with a de-dup horizon (rule 4 in
    docs/semantics.md, "The de-dup horizon"), in its publishing transaction."""

    rows: pa.Table
    """(source, partition, event_id, offset, time_ms) of the new ids to remember."""
    reach: Mapping[tuple[str, int], tuple[int, int]]
    """(source, partition) -> (its stream time after the run, its source's horizon), for
    every partition of every source with a horizon: ids further back than the horizon from
    their partition's stream time are forgotten."""


def write_horizon_ids(conn: psycopg.Connection[Any], ids: HorizonIds) -> int:
    """Remember `ids.rows` and forget the days past every horizon (`forget_horizon_days`)."""
    load_horizon_ids(conn, ids.rows)
    return forget_horizon_days(conn, ids.reach)


def load_horizon_ids(conn: psycopg.Connection[Any], rows: pa.Table) -> None:
    """COPY (source, partition, event_id, offset, time_ms) rows into `horizon_ids`, creating
    the day tables they need, in key order (a presorted load builds the key faster)."""
    times = rows.column("time_ms").combine_chunks().to_numpy(zero_copy_only=False)
    for day in np.unique(times - np.mod(times, HORIZON_IDS_PARTITION_MS)).tolist():
        conn.execute(
            sql.SQL(
                "CREATE TABLE IF NOT EXISTS {} PARTITION OF horizon_ids "
                "FOR VALUES FROM ({}) TO ({})"
            ).format(
                sql.Identifier(_day_table(day)),
                sql.Literal(day),
                sql.Literal(day + HORIZON_IDS_PARTITION_MS),
            )
        )
    keys = [(name, "ascending") for name in ("source", "partition", "event_id")]
    copy_csv(
        conn,
        sql.SQL(
            'COPY horizon_ids (source, partition, event_id, "offset", time_ms) '
            "FROM STDIN (FORMAT csv)"
        ),
        rows.take(pc.sort_indices(rows, sort_keys=keys)).to_batches(200_000),
    )


def forget_horizon_days(
    conn: psycopg.Connection[Any], reach: Mapping[tuple[str, int], tuple[int, int]]
) -> int:
    """Drop every day table of `horizon_ids` that no partition can still need: each partition
    whose stream time reaches the day has passed its end by the horizon (`HorizonIds.reach`).
    Returns how many were dropped."""
    dropped = 0
    for table, start in _day_tables(conn):
        end = start + HORIZON_IDS_PARTITION_MS
        if all(end <= t - h for t, h in reach.values() if t >= start):
            conn.execute(sql.SQL("DROP TABLE {}").format(sql.Identifier(table)))
            dropped += 1
    return dropped


def _day_table(day_start_ms: int) -> str:
    day = day_start_ms // HORIZON_IDS_PARTITION_MS
    return f"horizon_ids_d{day}" if day >= 0 else f"horizon_ids_dm{-day}"


def _day_tables(conn: psycopg.Connection[Any]) -> list[tuple[str, int]]:
    """(name, first event time) of each day table of `horizon_ids`."""
    found = []
    for name in partitions_of(conn, "horizon_ids"):
        digits = name.removeprefix("horizon_ids_d")
        day = -int(digits[1:]) if digits.startswith("m") else int(digits)
        found.append((name, day * HORIZON_IDS_PARTITION_MS))
    return found


class FullGeneration:
    """A full run's publication (rule 6), begun before its cells are known.

    Entering opens the run's publishing transaction; `add_ids` loads a source's ids into it
    on a worker thread as soon as they are known, so PostgreSQL loads them and rebuilds the
    id table's key while Spark still computes the cells (measured on 10M ids: ~8 s of
    loading and indexing, otherwise spent after Spark, on one core). `publish` then loads,
    indexes and attaches the new generation and flips the served row; leaving the block
    commits. Nothing is visible before that commit; leaving it on an error, or without
    `publish`, rolls everything back. The connection belongs to the worker until `publish`
    waits for it."""

    def __init__(self, conn: psycopg.Connection[Any], sources: Iterable[str]) -> None:
        self.conn = conn
        self.sources = list(sources)
        self._worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="id-load")
        self._steps: list[Future[None]] = []
        self._rebuilds_key = False
        self._key_queued = False
        self._published = False
        self._transaction = conn.transaction()

    def __enter__(self) -> FullGeneration:
        self._transaction.__enter__()
        self._steps.append(self._worker.submit(self._clear_ids))
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if exc is not None:  # a failed run does not wait for a load it will roll back
            with contextlib.suppress(psycopg.Error):  # (nor fails anew on a broken connection)
                self.conn.cancel_safe(timeout=10)
        self._worker.shutdown(wait=True, cancel_futures=exc is not None)
        if exc is None and not self._published:
            exc_type, exc = psycopg.Rollback, psycopg.Rollback()
        self._transaction.__exit__(exc_type, exc, tb)

    def add_horizon_ids(self, rows: pa.Table) -> None:
        """Queue the load of a source with a de-dup horizon's ids (`load_horizon_ids`)."""
        self._steps.append(self._worker.submit(load_horizon_ids, self.conn, rows))

    def add_ids(self, ids: pa.Table | Iterable[tuple[str, str, int, int]], *, last: bool) -> None:
        """Queue the load of (source, event_id, partition, offset) rows; `last` when no more
        follow, so the key is rebuilt right after them."""
        table = _ids_table(ids)
        self._steps.append(self._worker.submit(self._load_ids, table))
        if last:
            self.ids_done()

    def ids_done(self) -> None:
        """No more ids follow: rebuild the id table's key right after the loads queued."""
        self._queue_key()

    def publish(
        self,
        cells: pa.Table | Iterable[BatchCell],
        publication: Publication,
        horizon_reach: Mapping[tuple[str, int], tuple[int, int]] | None = None,
        groups: Sequence[RetentionGroup] = (),
    ) -> tuple[int, int]:
        """Load, index and attach the generation's cells and flip the served row, after every
        queued id load; returns (generation, cells written). `cells` is a table of the
        `BatchCell` columns, or the cells; `horizon_reach` how far back the sources with a
        de-dup horizon need their ids (`HorizonIds.reach`); `groups` the plans' retention
        groups, each with the windows it lays out in time ranges (`retention_groups`; every
        plan in `REST` without)."""
        self._queue_key()
        for step in self._steps:
            step.result()
        conn = self.conn
        generation = conn.execute("SELECT nextval('batch_generation_seq')").fetchone()[0]  # type: ignore[index]
        if not isinstance(cells, pa.Table):
            cells = list(cells)
        table = create_generation(conn, generation, groups)
        add_time_ranges(conn, generation, _cell_starts(cells), groups)
        written = _load_cells(conn, table, generation, cells)
        fault_point("mid_load")
        index_generation(conn, generation)
        conn.execute(
            sql.SQL("ALTER TABLE batch_cells ATTACH PARTITION {} FOR VALUES IN ({})").format(
                table, sql.Literal(generation)
            )
        )
        if horizon_reach is not None:
            forget_horizon_days(conn, horizon_reach)
        fault_point("before_generation_flip")
        _flip(conn, generation, publication)
        self._published = True
        return generation, written

    def _queue_key(self) -> None:
        if not self._key_queued:
            self._key_queued = True
            self._steps.append(self._worker.submit(self._rebuild_key))

    def _clear_ids(self) -> None:
        """Remove the run's sources' ids. When the table holds no other source it is
        truncated and its key dropped, to be rebuilt after the load (much faster than
        deleting and inserting row by row); only the batch layer reads it, one run at a
        time, inside this transaction. The ids of sources with a de-dup horizon are deleted
        (at most a horizon of them)."""
        self.conn.execute("DELETE FROM horizon_ids WHERE source = ANY(%s)", [self.sources])
        if _holds_other_sources(self.conn, self.sources):
            self.conn.execute("DELETE FROM dedup_ids WHERE source = ANY(%s)", [self.sources])
            return
        self.conn.execute("TRUNCATE dedup_ids")
        self.conn.execute("ALTER TABLE dedup_ids DROP CONSTRAINT dedup_ids_pkey")
        self._rebuilds_key = True

    def _load_ids(self, ids: pa.Table) -> None:
        copy_ids(self.conn, _in_key_order(ids) if self._rebuilds_key else ids)

    def _rebuild_key(self) -> None:
        if self._rebuilds_key:
            self.conn.execute(
                "ALTER TABLE dedup_ids ADD CONSTRAINT dedup_ids_pkey PRIMARY KEY (source, event_id)"
            )


def publish_full_generation(
    conn: psycopg.Connection[Any],
    cells: pa.Table | Iterable[BatchCell],
    ids: pa.Table | Iterable[tuple[str, str, int, int]],
    sources: Iterable[str],
    publication: Publication,
    groups: Sequence[RetentionGroup] = (),
) -> tuple[int, int]:
    """`FullGeneration` in one call, for a run whose cells and ids are all at hand; `ids` a
    table (or rows) of (source, event_id, partition, offset)."""
    with FullGeneration(conn, sources) as generation:
        generation.add_ids(ids, last=True)
        published = generation.publish(cells, publication, groups=groups)
    drop_old_generations(conn)
    return published


def _holds_other_sources(conn: psycopg.Connection[Any], sources: list[str]) -> bool:
    """Whether the id table holds ids of a source not in `sources`. Its sources are listed by
    a loose index scan of the key (one `min` per source; a scan for `source <> ALL(...)`
    reads every id: 0.5 s for 10M, and so did a `LIMIT 1` probe the planner ran as a scan)."""
    held = conn.execute(
        """
        WITH RECURSIVE held AS (
            SELECT min(source) AS source FROM dedup_ids
            UNION ALL
            SELECT (SELECT min(source) FROM dedup_ids WHERE source > held.source)
            FROM held WHERE held.source IS NOT NULL
        )
        SELECT source FROM held WHERE source IS NOT NULL
        """
    ).fetchall()
    return any(source not in sources for (source,) in held)


def _ids_table(ids: pa.Table | Iterable[tuple[str, str, int, int]]) -> pa.Table:
    if isinstance(ids, pa.Table):
        return ids
    rows = list(ids)
    return pa.table(
        {
            name: pa.array([row[i] for row in rows], kind)
            for i, (name, kind) in enumerate(
                [
                    ("source", pa.string()),
                    ("event_id", pa.string()),
                    ("partition", pa.int32()),
                    ("offset", pa.int64()),
                ]
            )
        }
    )


def _cell_starts(cells: pa.Table | Sequence[BatchCell]) -> dict[tuple[str, int], list[int]]:
    """(metric, window) -> the distinct starts of `cells` (what their tables' time ranges
    must hold)."""
    columns = ["metric", "window_ms", "start_ms"]
    if isinstance(cells, pa.Table):
        found = cells.select(columns).group_by(columns).aggregate([]).to_pydict()
        rows: Iterable[tuple[str, int, int]] = zip(*(found[c] for c in columns), strict=True)
    else:
        rows = ((cell.metric, cell.window_ms, cell.start_ms) for cell in cells)
    starts: dict[tuple[str, int], set[int]] = {}
    for metric, window_ms, start_ms in rows:
        starts.setdefault((metric, window_ms), set()).add(start_ms)
    return {cell: sorted(held) for cell, held in starts.items()}


def _load_cells(
    conn: psycopg.Connection[Any],
    table: sql.Identifier,
    generation: int,
    cells: pa.Table | Iterable[BatchCell],
) -> int:
    """COPY the cells into the generation's table in `HEAP_ORDER`: an Arrow table as CSV
    written by Arrow (no per-row Python; measured ~2 s less than row by row for 66k cells)."""
    columns = sql.SQL(_CELL_COLUMNS)
    if isinstance(cells, pa.Table):
        copy_csv(
            conn,
            sql.SQL("COPY {} ({}) FROM STDIN (FORMAT csv)").format(table, columns),
            (_cells_as_text(batch, generation) for batch in _in_heap_order(cells)),
        )
        return cells.num_rows
    written = 0
    with conn.cursor().copy(sql.SQL("COPY {} ({}) FROM STDIN").format(table, columns)) as copy:
        for cell in sorted(cells, key=_heap_key):
            copy.write_row((generation, *cell.columns()))
            written += 1
    return written


HEAP_ORDER = ("metric", "version", "window_ms", "key", "start_ms")
"""The order a publication writes cells in: within each time range of the generation (rows go
to their range's table as they come), a key's consecutive cells sit together on the heap (~45
cells a page), so a 60-cell series reads 2 to 4 heap pages instead of 60 — what a read of an old
range waits for once the view outgrows memory (docs/architecture.md, "Heap order"). The primary
key, time-major for `top` and sliced reads, is built after the load whatever the order."""
_COPY_BATCH = 50_000


def _in_heap_order(cells: pa.Table) -> Iterator[pa.RecordBatch]:
    """`cells` in `HEAP_ORDER`, `_COPY_BATCH` rows at a time. The table is made one chunk
    first (with 64-bit offsets where a column's data passes 2 GiB): `Table.take` from many
    chunks concatenates every column for each call, a copy of the whole table per slice; one
    copy up front keeps each slice's take in proportion to the slice. The order is a numpy
    sort of integer codes (`_sort_codes`): Arrow's multi-column sort over strings took 2.7 s
    for 1M cells. ~2 µs per cell in all (1M cells with 200-byte sketches in 100 chunks:
    2.1 s)."""
    if not cells.num_rows:
        return
    try:
        whole = cells.combine_chunks()
    except pa.ArrowInvalid:  # offset overflow
        whole = cells.cast(pa.schema([_wide(f) for f in cells.schema])).combine_chunks()
    order = np.lexsort([_sort_codes(whole.column(name).chunk(0)) for name in HEAP_ORDER[::-1]])
    for at in range(0, cells.num_rows, _COPY_BATCH):
        taken = whole.take(pa.array(order[at : at + _COPY_BATCH]))
        yield from taken.cast(cells.schema).to_batches()


def _sort_codes(values: pa.Array) -> np.ndarray:
    """Integers that sort `values` as the heap needs: integers as they are, text by its
    dictionary code and a key by its elements joined's (any order of metrics and keys does,
    as long as a key's cells are together)."""
    if pa.types.is_integer(values.type):
        return values.to_numpy()
    if pa.types.is_large_list(values.type) or pa.types.is_list(values.type):
        values = pc.binary_join(values, pa.scalar("\x00", values.type.value_type))
    return pc.dictionary_encode(values).indices.fill_null(-1).to_numpy().astype(np.int64)


def _wide(field: pa.Field) -> pa.Field:
    """`field` with 64-bit offsets where it has variable-width data (strings, binaries, lists
    of them)."""
    kind = field.type
    if pa.types.is_string(kind):
        return field.with_type(pa.large_string())
    if pa.types.is_binary(kind):
        return field.with_type(pa.large_binary())
    if pa.types.is_list(kind):
        return field.with_type(pa.large_list(_wide(kind.value_field)))
    return field


def _heap_key(cell: BatchCell) -> tuple[Any, ...]:
    return tuple(
        tuple(map(str, cell.key)) if name == "key" else getattr(cell, name) for name in HEAP_ORDER
    )


def _cells_as_text(batch: pa.RecordBatch, generation: int) -> pa.Table:
    """A batch of cells (metric, version, window_ms, start_ms, key, count, sum, min, max,
    sketches, sketch_summaries) with its array columns as PostgreSQL array literals."""
    n = batch.num_rows
    key = _pg_array(batch.column("key"), _quoted)
    sketches = _pg_array(batch.column("sketches"), _bytea_elements)
    summaries = _pg_array(
        batch.column("sketch_summaries"), lambda flat: flat.cast(pa.string()).fill_null("NULL")
    )
    return pa.table(
        {
            "generation": pa.array(np.full(n, generation, np.int64)),
            **{name: batch.column(name) for name in ("metric", "version", "window_ms")},
            "start_ms": batch.column("start_ms"),
            "key": key,
            **{name: batch.column(name) for name in ("count", "sum", "min", "max")},
            "sketches": sketches,
            "sketch_summaries": summaries,
        }
    )


def _pg_array(lists: pa.Array, elements: Any) -> pa.Array:
    """`{e1,e2,...}` per list, each element written by `elements` (flat array → text)."""
    flat = pc.list_flatten(lists)
    lengths = pc.list_value_length(lists).fill_null(0).to_numpy(zero_copy_only=False)
    offsets = np.zeros(len(lists) + 1, np.int32)
    np.cumsum(lengths, out=offsets[1:])
    text = pa.ListArray.from_arrays(pa.array(offsets), elements(flat))
    return pc.binary_join_element_wise("{", pc.binary_join(text, ","), "}", "")


def _quoted(flat: pa.Array) -> pa.Array:
    """Text elements in double quotes, backslashes and quotes escaped (array literal rules)."""
    escaped = pc.replace_substring(pc.replace_substring(flat, "\\", "\\\\"), '"', '\\"')
    return pc.binary_join_element_wise('"', escaped, '"', "")


def _bytea_elements(flat: pa.Array) -> pa.Array:
    """Binary elements as quoted hex bytea literals (`"\\\\x0a1b"` in an array literal)."""
    flat = flat.cast(pa.binary())
    if not len(flat):
        return pa.array([], pa.string())
    offsets = np.frombuffer(flat.buffers()[1], np.int32)[flat.offset : flat.offset + len(flat) + 1]
    buffer = flat.buffers()[2]
    data = b"" if buffer is None else buffer.to_pybytes()[offsets[0] : offsets[-1]]
    hexed = pa.StringArray.from_buffers(
        len(flat),
        pa.py_buffer(((offsets - offsets[0]) * 2).astype(np.int32)),
        pa.py_buffer(data.hex().encode()),
    )
    return pc.binary_join_element_wise('"\\\\x', hexed, '"', "")


def copy_ids(
    conn: psycopg.Connection[Any], ids: pa.Table | Iterable[tuple[str, str, int, int]]
) -> None:
    """COPY (source, event_id, partition, offset) rows as CSV written by Arrow (no per-row
    Python); every value is quoted, so an empty id stays an empty string, never NULL."""
    copy_csv(
        conn,
        sql.SQL('COPY dedup_ids (source, event_id, partition, "offset") FROM STDIN (FORMAT csv)'),
        _ids_table(ids).to_batches(200_000),
    )


def copy_csv(
    conn: psycopg.Connection[Any],
    statement: sql.SQL | sql.Composed,
    batches: Iterable[pa.RecordBatch | pa.Table],
) -> None:
    """Run a `COPY ... FROM STDIN (FORMAT csv)` fed with Arrow data written as CSV by Arrow
    (no per-row Python). Every value is quoted, so an empty text stays empty, never NULL."""
    options = pacsv.WriteOptions(include_header=False, quoting_style="all_valid")
    with conn.cursor().copy(statement) as copy:
        for batch in batches:
            sink = io.BytesIO()
            pacsv.write_csv(batch, sink, write_options=options)
            copy.write(sink.getvalue())


def _in_key_order(ids: pa.Table | Iterable[tuple[str, str, int, int]]) -> pa.Table:
    """The ids sorted by the id table's key (Arrow sorts text bytewise, as the database's C
    collation does): PostgreSQL then builds the key from presorted rows, measured 0.7 s
    instead of 3 s for 1M ids, for 0.5 s of sorting here."""
    table = _ids_table(ids)
    if len(table.column("source").unique()) > 1:
        keys = [("source", "ascending"), ("event_id", "ascending")]
        return table.take(pc.sort_indices(table, sort_keys=keys))
    event_ids = table.column("event_id")
    if len(event_ids) < 2 or pc.all(pc.less_equal(event_ids[:-1], event_ids[1:])).as_py():
        return table  # a run's ids arrive sorted (`aggregate._copies`)
    return table.take(pc.sort_indices(event_ids))


def _flip(conn: psycopg.Connection[Any], generation: int, publication: Publication) -> None:
    from psycopg.types.json import Jsonb

    conn.execute(
        """
        INSERT INTO served_view (id, generation, snapshot, watermarks, rebuild_from, versions,
                                 rebuild_index, history_index, stream_times, published_at)
        VALUES (1, %s, %s, %s, %s, %s, %s, %s, %s, now())
        ON CONFLICT (id) DO UPDATE SET generation = excluded.generation,
            snapshot = excluded.snapshot, watermarks = excluded.watermarks,
            rebuild_from = excluded.rebuild_from, versions = excluded.versions,
            rebuild_index = excluded.rebuild_index, history_index = excluded.history_index,
            stream_times = excluded.stream_times, published_at = excluded.published_at
        """,
        [
            generation,
            Jsonb(publication.snapshot),
            Jsonb({m: w for m, w in publication.watermarks.items() if w is not None}),
            Jsonb(publication.rebuild_from),
            Jsonb(publication.versions),
            Jsonb(publication.rebuild_index),
            Jsonb(publication.history_index),
            Jsonb(publication.stream_times),
        ],
    )


class Expiry(NamedTuple):
    """What retention removes of one plan under a W: its cells of `windows` (a retained window,
    with window 0 when it is a session plan's base window) starting before `kept_from`."""

    plan: MetricPlan
    windows: tuple[int, ...]
    kept_from: int


def expiries(plans: Iterable[MetricPlan], watermarks: Mapping[str, int | None]) -> list[Expiry]:
    """Each plan's retained windows under its W in `watermarks` (rule 14 in
    docs/semantics.md): a session metric's stored sessions (window 0) go with the base
    window's cells of their first events."""
    found = []
    for plan in plans:
        for size, _ in plan.windows.retention_ms:
            kept_from = plan.windows.kept_from(size, watermarks.get(plan.name))
            if kept_from is None:
                continue
            session = (
                plan.sessions is not None and plan.rollup is None and size == plan.base_window_ms
            )
            found.append(Expiry(plan, (size, SESSION_WINDOW_MS) if session else (size,), kept_from))
    return found


def retained_cells(
    cells: pa.Table, plans: Iterable[MetricPlan], watermarks: Mapping[str, int | None]
) -> pa.Table:
    """`cells` (the `BatchCell` columns) less those retention removes under `watermarks`: a
    full run does not load what its publication would delete at once."""
    expired: pa.ChunkedArray | None = None
    for expiry in expiries(plans, watermarks):
        mask = pc.and_(
            pc.and_(
                pc.equal(cells["metric"], expiry.plan.name),
                pc.is_in(cells["window_ms"], pa.array(expiry.windows, pa.int64())),
            ),
            pc.less(cells["start_ms"], expiry.kept_from),
        )
        expired = mask if expired is None else pc.or_(expired, mask)
    return cells if expired is None else cells.filter(pc.invert(expired))


DETACH_LOCK_TIMEOUT = "500ms"
"""How long detaching the ranges past retention may wait for the readers of their generation
(and hold back the readers queued behind it) before their cells are deleted instead."""


class Expired(NamedTuple):
    """What retention removed with a publication."""

    deleted: int
    """Cells deleted row by row (in ranges holding kept cells too)."""
    dropped: int
    """Time ranges removed whole (their cells not counted: that would read them all):
    detached, and dropped once the publication commits (`drop_detached_ranges`)."""


def expire_cells(
    conn: psycopg.Connection[Any],
    generation: int,
    plans: Iterable[MetricPlan],
    watermarks: Mapping[str, int | None],
) -> Expired:
    """Remove from `generation` the cells retention no longer keeps after a publication
    (`watermarks`: each plan's new W; `expiries`), in the caller's transaction, which should
    commit right after. The time ranges whose every cell is past retention are detached whole
    (`_detach_ranges`; the runner drops them after the commit); the others lose their expired
    rows."""
    found = expiries(plans, watermarks)
    kept_from: dict[int, dict[tuple[str, str], int]] = {}
    for expiry in found:
        for window_ms in expiry.windows:
            kept_from.setdefault(window_ms, {})[expiry.plan.name, expiry.plan.version] = (
                expiry.kept_from
            )
    ranges = [r for r in time_ranges(conn, generation) if r.window_ms in kept_from]
    droppable = [
        r
        for r in ranges
        if r.hi is not None
        and r.hi <= max(kept_from[r.window_ms].values())
        and all(
            held in kept_from[r.window_ms] and r.hi <= kept_from[r.window_ms][held]
            for held in _metrics_in(conn, generation, r.table(generation))
        )
    ]
    deleted = 0
    for expiry in found:
        for r in ranges:
            if r in droppable or r.window_ms not in expiry.windows:
                continue
            if r.lo is not None and r.lo >= expiry.kept_from:
                continue
            deleted += conn.execute(
                sql.SQL(
                    "DELETE FROM {} WHERE metric = %s AND version = %s AND window_ms = %s "
                    "AND start_ms < %s"
                ).format(sql.Identifier(r.table(generation))),
                [expiry.plan.name, expiry.plan.version, r.window_ms, expiry.kept_from],
            ).rowcount
    if _detach_ranges(conn, generation, droppable):
        return Expired(deleted, len(droppable))
    for r in droppable:
        deleted += conn.execute(
            sql.SQL("DELETE FROM {}").format(sql.Identifier(r.table(generation)))
        ).rowcount
    return Expired(deleted, 0)


def _metrics_in(
    conn: psycopg.Connection[Any], generation: int, table: str
) -> Iterator[tuple[str, str]]:
    """The (metric, version)s with cells in a range's table, by a loose scan of its key (one
    descent of the primary key per pair, which the generation's equality lets it use)."""
    after = ("", "")
    while True:
        row = conn.execute(
            sql.SQL(
                "SELECT metric, version FROM {} WHERE generation = %s "
                "AND (metric, version) > (%s, %s) ORDER BY metric, version LIMIT 1"
            ).format(sql.Identifier(table)),
            [generation, *after],
        ).fetchone()
        if row is None:
            return
        after = (row[0], row[1])
        yield after


def _detach_ranges(
    conn: psycopg.Connection[Any], generation: int, ranges: Sequence[TimeRange]
) -> bool:
    """Detach the ranges whose cells are all past retention; whether they were. Detaching
    locks the range's group table against readers until the commit, so it waits for them at
    most `DETACH_LOCK_TIMEOUT`; past that it gives up (the caller deletes their cells
    instead). The runner drops the detached tables after the commit (`drop_detached_ranges`),
    so the commit that readers wait for unlinks no files."""
    if not ranges:
        return True
    previous = conn.execute("SELECT current_setting('lock_timeout')").fetchone()[0]  # type: ignore[index]
    try:
        with conn.transaction():  # a savepoint: a timed-out detach rolls back to here
            conn.execute("SELECT set_config('lock_timeout', %s, true)", [DETACH_LOCK_TIMEOUT])
            for r in ranges:
                conn.execute(
                    sql.SQL("ALTER TABLE {} DETACH PARTITION {}").format(
                        sql.Identifier(r.parent(generation)), sql.Identifier(r.table(generation))
                    )
                )
            conn.execute("SELECT set_config('lock_timeout', %s, true)", [previous])
    except psycopg.errors.LockNotAvailable:
        return False
    return True


def _lock_served(
    conn: psycopg.Connection[Any], generation: int, snapshot: Mapping[str, Mapping[str, int]]
) -> None:
    row = conn.execute(
        "SELECT generation, snapshot FROM served_view WHERE id = 1 FOR UPDATE"
    ).fetchone()
    if row is None or row[0] != generation or row[1] != snapshot:
        raise PublicationConflict(
            "the served view changed while this run was computing (another run published); "
            "queue the run again"
        )


def _stage_cells(conn: psycopg.Connection[Any], cells: Iterable[BatchCell]) -> int:
    conn.execute("CREATE TEMP TABLE staged_cells (LIKE batch_cells) ON COMMIT DROP")
    return _stage_cells_again(conn, cells)


def _stage_cells_again(conn: psycopg.Connection[Any], cells: Iterable[BatchCell]) -> int:
    written = 0
    with conn.cursor().copy(
        sql.SQL("COPY staged_cells ({}) FROM STDIN").format(sql.SQL(_CELL_COLUMNS))
    ) as copy:
        for cell in cells:
            copy.write_row((0, *cell.columns()))
            written += 1
    return written


def _read_stored(
    conn: psycopg.Connection[Any], generation: int
) -> dict[tuple[Any, ...], BatchCell]:
    """The served generation's cells at the staged cells' keys."""
    columns = sql.SQL(", ").join(sql.Identifier("c", name) for name in CELL_COLUMNS)
    rows = conn.execute(
        sql.SQL(
            """
            SELECT {columns}
            FROM staged_cells s JOIN batch_cells c
              ON c.generation = %s AND c.metric = s.metric AND c.version = s.version
             AND c.window_ms = s.window_ms AND c.start_ms = s.start_ms AND c.key = s.key
            """
        ).format(columns=columns),
        [generation],
    ).fetchall()
    return {cell.identity: cell for cell in (BatchCell(*row) for row in rows)}


def merge_cell(stored: BatchCell, new: BatchCell, kinds: Sequence[SketchKind]) -> BatchCell:
    """The cell over both rows' events (rule 6), merged by the aggregation registry."""
    merged = merge_states(kinds, [stored.state(), new.state()])
    return new if merged is None else new.with_state(merged, kinds)


def _upsert_staged(conn: psycopg.Connection[Any], generation: int) -> None:
    conn.execute(
        sql.SQL(
            """
            INSERT INTO batch_cells ({columns})
            SELECT %s, metric, version, window_ms, start_ms, key, count, sum, min, max,
                   sketches, sketch_summaries FROM staged_cells
            ORDER BY {order}
            ON CONFLICT (generation, metric, version, window_ms, start_ms, key) DO UPDATE SET
                count = excluded.count, sum = excluded.sum, min = excluded.min,
                max = excluded.max, sketches = excluded.sketches,
                sketch_summaries = excluded.sketch_summaries
            """
        ).format(
            columns=sql.SQL(_CELL_COLUMNS),
            order=sql.SQL(", ").join(sql.Identifier(name) for name in HEAP_ORDER),
        ),
        [generation],
    )


def publish_incremental(
    conn: psycopg.Connection[Any],
    generation: int,
    previous_snapshot: Mapping[str, Mapping[str, int]],
    new_cells: Iterable[BatchCell],
    ids: pa.Table | Iterable[tuple[str, str, int, int]],
    publication: Publication,
    kinds: Mapping[str, Sequence[SketchKind]],
    recomputed: Iterable[tuple[str, str, int]] = (),
    horizon: HorizonIds | None = None,
) -> int:
    """Merge the new events' cells into the served generation's stored cells, insert the new
    ids and advance the served row, in one transaction; returns the cells written. `kinds`
    are each metric's sketch slots. `recomputed` rows — (metric, version, first start) —
    name cells computed from every event (rule 11): they replace the stored ones from that
    start on, in every window. `horizon`: the ids of sources with a de-dup horizon."""
    with conn.transaction():
        _lock_served(conn, generation, previous_snapshot)
        for metric, version, since in recomputed:
            conn.execute(
                "DELETE FROM batch_cells WHERE generation = %s AND metric = %s AND version = %s "
                "AND start_ms >= %s",
                [generation, metric, version, since],
            )
        new_cells = list(new_cells)
        _stage_cells(conn, new_cells)
        stored = _read_stored(conn, generation)
        merged = []
        for cell in new_cells:
            old = stored.get(cell.identity)
            merged.append(cell if old is None else merge_cell(old, cell, kinds[cell.metric]))
        conn.execute("TRUNCATE staged_cells")
        written = _stage_cells_again(conn, merged)
        add_time_ranges(conn, generation, _cell_starts(merged))
        _upsert_staged(conn, generation)
        fault_point("mid_load")
        copy_ids(conn, ids)
        if horizon is not None:
            write_horizon_ids(conn, horizon)
        fault_point("before_generation_flip")
        _flip(conn, generation, publication)
    return written


def publish_range(
    conn: psycopg.Connection[Any],
    generation: int,
    snapshot: Mapping[str, Mapping[str, int]],
    replaced: Iterable[tuple[str, str, int, int, int]],
    cells: Iterable[BatchCell],
) -> int:
    """Replace the served generation's cells in the recomputed ranges — `replaced` rows are
    (metric, version, window_ms, first start, end of starts) — in one transaction; W, the
    snapshot and `rebuild_from` stay as they are. Returns the cells written."""
    with conn.transaction():
        _lock_served(conn, generation, snapshot)
        for metric, version, window_ms, lo, hi in replaced:
            conn.execute(
                "DELETE FROM batch_cells WHERE generation = %s AND metric = %s AND version = %s "
                "AND window_ms = %s AND start_ms >= %s AND start_ms < %s",
                [generation, metric, version, window_ms, lo, hi],
            )
        cells = list(cells)
        written = _stage_cells(conn, cells)
        add_time_ranges(conn, generation, _cell_starts(cells))
        _upsert_staged(conn, generation)
        fault_point("mid_load")
        fault_point("before_generation_flip")
        conn.execute("UPDATE served_view SET published_at = now() WHERE id = 1")
    return written


def drop_old_generations(conn: psycopg.Connection[Any]) -> None:
    """Keep the served generation and the one before it; readers of older ones are done."""
    served = read_served(conn)
    if served is None:
        return
    rows = [
        (name, int(name.removeprefix("batch_cells_g")))
        for name in partitions_of(conn, "batch_cells")
    ]
    keep = sorted((g for _, g in rows if g <= served.generation), reverse=True)[:GENERATIONS_KEPT]
    for name, generation in rows:
        if generation not in keep:
            with conn.transaction():
                conn.execute(sql.SQL("DROP TABLE {}").format(sql.Identifier(name)))
