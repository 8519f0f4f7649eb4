"""The batch view at scale (issue #30 item 6): a generation of `--cells` cells (default 10^8)
beside a small one (`--small`, default 10^6), each in a database of its own on the local
stack's PostgreSQL, measured the same way:

    .venv/bin/python bench/batch_view.py [--cells N] [--small N] [--reads N]

The cells are generated inside PostgreSQL (`INSERT ... SELECT generate_series`: producing 10^8
cells' worth of events and running Spark over them takes hours on 2 cores; the stored cells are
the same rows either way) for one plain metric (`views`: key [page], count/sum/min/max, windows
1m/1h/1d) over `DAYS` days, as many keys as the size needs, in the order hourly incremental
runs write them (`HEAP_ORDER`: each hour's cells key by key, a key's 60 minutes together; a
full run writes a key's whole range together, fewer pages still). The generation is then
laid out in time ranges, keyed and indexed (`index_generation`), attached and published as a
full run does (`_flip`).

Figures per view:

- `bytes_per_cell`: the generation's table + indexes on disk over its cells (`heap` and
  `index` apart); `load_s`, `index_s`: the generation and its key;
- `s60_<pattern>_p99_ms`, `s1440_<pattern>_p99_ms`: the batch read of a 60-cell (an hour at
  1m) and a 1,440-cell (a day at 1m) series, the very statement the API sends (`SERIES_SQL`,
  prepared, served row and cells in one statement), each for a random key and start (no
  answer cached), after as many unmeasured reads; p50 beside; `_pages`: the 8 KiB pages one
  read touches (a page as often as it is touched), `_heap_pages`: the distinct heap pages its
  cells are on (what comes from disk once the view outgrows memory, beside the index's
  leaves); `_dirty_mb`: the machine's dirty page cache when the reads began, `_written_mb`:
  what the machine wrote to disk while they ran (`/proc/meminfo`, `/proc/vmstat`: writeback
  beside random reads is what lengthened their tail in a probe; see docs/performance.md).
  Then as many reads again under `EXPLAIN (ANALYZE, BUFFERS, TIMING OFF)` with
  `track_io_timing` on, to say where their time goes: `_executed_p50_ms`/`_p99_ms`, their
  execution times (no planning, as the API's prepared statement); `_io_tail_share`, over the
  slowest 1% of them, the share of their execution the backend spent reading pages it did not
  hold in shared buffers (from the page cache or the disk) and writing dirty ones it evicted;
  `_io_share`, the same over all of them; `_blocks_read_p50`/`_p99`, pages read per read;
  `_io_ms_per_block`, the I/O time per page read (an `O_DIRECT` page read's beside it says
  whether they came from the disk);
  Two patterns: `recent`, starts in the view's last 2 days (what dashboards
  poll), and `any`, starts anywhere in it (the worst case: once the view outgrows memory,
  most of those pages come from disk);
- `disk_page_p50_ms`, `disk_page_p99_ms`: the physical limit beside those reads, single
  8 KiB reads at random pages of the view's files with `O_DIRECT` (past the page cache, as
  a page a read does not find in memory comes), as many as the s60 reads;
- `incr_publish_ms`: an incremental run's publication (`publish_incremental`: stage, read the
  stored cells, merge, upsert, flip) of one new hour of every key's cells (a fixed 600 keys
  x (60 + 1 + 1) cells whatever the view's size), median of 5 consecutive hours;
- `drop_week_s`: retention removing the view's first week of 1m cells (`expire_cells`: one
  time range detached whole, and the commit; what readers of the generation wait for),
  `delete_day_s`: its eighth day a day later (rows deleted from the next range; `_deleted`
  and `_dropped` beside: the cells each deleted and the ranges it removed; `_after_s`: the
  detached tables dropped after the commit, as the runner does), and `vacuum_s`: the VACUUM of the
  generation after that DELETE; `ranges`: the generation's tables (1m split by week, 1h and
  1d kept forever in one each);
  `vacuum_after_load_s`: the VACUUM (ANALYZE) autovacuum would run after the load, and
  `checkpoint_s` the CHECKPOINT writing what the load and that VACUUM dirtied (both run by
  the bench before its reads, so that they do not meet them; at 10^8 the VACUUM dirties every
  heap page).

The last line compares the big view with the small one: `<read>_p99_ratio` (target <= 1.5),
`<read>_any_p99_over_disk_page_p99` (the big view's reads from disk over one page read's p99),
`<read>_p50_ratio` and `incr_publish_ratio` (flat: ~1)."""

from __future__ import annotations

import argparse
import itertools
import mmap
import os
import random
import statistics
import sys
import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NamedTuple

import psycopg
from psycopg import sql

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from batch_layer.publish import Publication, _flip, expire_cells, publish_incremental
from bench.common import log, pct, with_db
from lambdactl.stack import stack_up
from serving_layer.batch_view import SERIES_SQL, CellQuery
from serving_layer.served_row import ServedRow
from shared.config import Settings
from shared.db.cell_tables import (
    add_time_ranges,
    create_generation,
    drop_detached_ranges,
    generation_table,
    index_generation,
    retention_groups,
    time_ranges,
)
from shared.db.cells import BatchCell
from shared.db.migrate import upgrade
from shared.gc_tuning import freeze_startup_objects
from shared.metric_plan import MetricPlan
from shared.windows import CellRef
from tests.conftest import drop_database

MINUTE, HOUR, DAY = 60_000, 3_600_000, 86_400_000
DAYS = 60
T0 = 1_767_225_600_000  # 2026-01-01T00:00:00Z: the view's first day
CELLS_PER_KEY = DAYS * (1440 + 24 + 1)
NEW_KEYS = 600
"""Keys an incremental publication's new hour holds, whatever the view's size."""

_GENERATE = """
INSERT INTO {table} (generation, metric, version, window_ms, start_ms, key, count, sum, min,
                     max, sketches, sketch_summaries)
SELECT %(generation)s, %(metric)s, %(version)s, w.size, %(t0)s + (c * w.per + j) * w.size,
       ARRAY['/page/' || lpad(k::text, 6, '0')], 1 + (k * 7 + c * w.per + j) %% 50,
       ((k * 13 + c * w.per + j) %% 1000) * 1.5, 0.5, 499.5, '{{}}'::bytea[], '{{}}'::float8[]
FROM (VALUES (%(m)s::bigint, %(hours)s, 60), (%(h)s::bigint, %(hours)s, 1),
             (%(d)s::bigint, %(days)s, 1)) AS w(size, chunks, per)
CROSS JOIN LATERAL generate_series(0, w.chunks - 1) AS c
CROSS JOIN LATERAL generate_series(0, %(keys)s - 1 + 0 * c) AS k
CROSS JOIN LATERAL generate_series(0, w.per - 1 + 0 * k) AS j
"""
"""An hourly run's order: the lateral series are evaluated in order, so each hour (a day for
1d) holds every key's cells in turn, a key's 60 minutes together (`HEAP_ORDER`)."""


def view_plan() -> MetricPlan:
    settings = Settings(
        sources=[{"name": "pageviews", "topic": "bench-view", "time_field": "ts"}],
        tables=[],
        metrics=[
            {
                "name": "views",
                "source": "pageviews",
                "key": ["page"],
                "value": "latency_ms",
                "aggregations": ["count", "sum", "min", "max"],
                "windows": ["1m", "1h", "1d"],
                "retention": {"1m": f"{DAYS - 7}d"},
                "grace": "2m",
            }
        ],
    )
    return settings.plans["views"]


def load(conn: psycopg.Connection[Any], plan: MetricPlan, keys: int) -> dict[str, float]:
    """Generate, key, attach and publish the view's one generation, in its time ranges as a
    full run lays them out (`add_time_ranges`); its load figures."""
    generation = conn.execute("SELECT nextval('batch_generation_seq')").fetchone()[0]  # type: ignore[index]
    with conn.transaction():
        groups = retention_groups([plan])
        table = create_generation(conn, generation, groups)
        add_time_ranges(
            conn,
            generation,
            {(plan.name, size): range(T0, T0 + DAYS * DAY, size) for size in (MINUTE, HOUR, DAY)},
            groups,
        )
        started = time.monotonic()
        conn.execute(
            sql.SQL(_GENERATE).format(table=table),
            {
                "generation": generation,
                "metric": plan.name,
                "version": plan.version,
                "t0": T0,
                "m": MINUTE,
                "h": HOUR,
                "d": DAY,
                "hours": DAYS * 24,
                "days": DAYS,
                "keys": keys,
            },
        )
        load_s = time.monotonic() - started
        started = time.monotonic()
        index_generation(conn, generation)
        index_s = time.monotonic() - started
        conn.execute(
            sql.SQL("ALTER TABLE batch_cells ATTACH PARTITION {} FOR VALUES IN ({})").format(
                table, sql.Literal(generation)
            )
        )
        _flip(conn, generation, publication(plan, T0 + DAYS * DAY))
    started = time.monotonic()
    conn.execute(sql.SQL("VACUUM (ANALYZE) {}").format(table))  # what autovacuum does next
    settle_s = time.monotonic() - started
    started = time.monotonic()
    checkpoint(conn)  # writes what the load and the VACUUM dirtied, before the reads
    checkpoint_s = time.monotonic() - started
    heap, total = conn.execute(
        "SELECT sum(pg_table_size(relid))::bigint, sum(pg_total_relation_size(relid))::bigint "
        "FROM pg_partition_tree(%s) WHERE isleaf",
        [f"batch_cells_g{generation}"],
    ).fetchone()  # type: ignore[misc]
    cells = keys * CELLS_PER_KEY
    return {
        "generation": generation,
        "cells": cells,
        "ranges": len(time_ranges(conn, generation)),
        "load_s": load_s,
        "index_s": index_s,
        "vacuum_after_load_s": settle_s,
        "checkpoint_s": checkpoint_s,
        "heap_bytes_per_cell": heap / cells,
        "index_bytes_per_cell": (total - heap) / cells,
        "bytes_per_cell": total / cells,
    }


def as_admin(conn: psycopg.Connection[Any], statement: str, params: Any = None) -> list[Any]:
    """`statement`'s rows, run as `postgres` on the connection's server (the local stack's
    cluster trusts it): what the bench's role may not do (CHECKPOINT, the data directory)."""
    try:
        with psycopg.connect(conn.info.dsn, user="postgres", autocommit=True) as admin:
            cursor = admin.execute(statement, params)
            return cursor.fetchall() if cursor.description else []
    except psycopg.Error as exc:
        raise SystemExit(
            f"bench/batch_view.py runs {statement.split()[0]} as postgres on the local stack's "
            f"PostgreSQL; elsewhere run it as a superuser ({exc})"
        ) from exc


def checkpoint(conn: psycopg.Connection[Any]) -> None:
    as_admin(conn, "CHECKPOINT")


def disk_page_reads(conn: psycopg.Connection[Any], generation: int, n: int) -> dict[str, float]:
    """The physical limit beside the reads from disk: p50 and p99 ms of `n` single 8 KiB reads
    at random pages of the generation's files, `O_DIRECT` (past the page cache, as a page the
    view's reads do not find in memory comes). Needs the server's data directory on this
    host (the local stack's)."""
    (directory,), *_ = as_admin(conn, "SHOW data_directory")
    pages = []  # (a file of the heap, its 8 KiB pages): each table in 1 GiB segments
    for (path,) in as_admin(
        conn,
        "SELECT pg_relation_filepath(relid) FROM pg_partition_tree(%s) WHERE isleaf",
        [generation_table(generation)],
    ):
        for segment in itertools.count():
            file = Path(directory) / (f"{path}.{segment}" if segment else path)
            if not file.exists():
                break
            if file.stat().st_size >= 8192:
                pages.append((file, file.stat().st_size // 8192))
    weights = [count for _, count in pages]
    rng = random.Random(generation)
    buffer = mmap.mmap(-1, 8192)  # page-aligned, as O_DIRECT needs
    latencies = []
    for _ in range(n):
        path, count = rng.choices(pages, weights=weights)[0]
        fd = os.open(path, os.O_RDONLY | os.O_DIRECT)
        try:
            started = time.perf_counter()
            os.preadv(fd, [buffer], rng.randrange(count) * 8192)
            latencies.append((time.perf_counter() - started) * 1000)
        finally:
            os.close(fd)
    return {"disk_page_p50_ms": pct(latencies, 0.5), "disk_page_p99_ms": pct(latencies, 0.99)}


def publication(plan: MetricPlan, watermark: int, snapshot: int = 0) -> Publication:
    topic = plan.source.topic
    return Publication(
        snapshot={topic: {"0": snapshot}},
        watermarks={plan.name: watermark},
        rebuild_from={topic: {"0": snapshot}},
        versions={plan.name: plan.version},
    )


def reads(
    conn: psycopg.Connection[Any], plan: MetricPlan, keys: int, cells: int, n: int, days: int
) -> dict[str, float]:
    """p50 and p99 ms of `n` series reads of `cells` 1m cells, each of a random key starting
    at a random minute of the view's last `days` days (after `n` unmeasured ones), and the
    8 KiB pages one such read touches (`EXPLAIN (ANALYZE, BUFFERS)`: hit in shared buffers
    and read from the OS; the read's cost follows them once the view outgrows memory)."""
    generation, stamp = conn.execute(
        "SELECT generation, xmin::text FROM served_view WHERE id = 1"
    ).fetchone()  # type: ignore[misc]
    rng = random.Random(cells * days)
    first_minute = (DAYS - days) * 1440

    served = ServedRow(stamp, generation, None)

    def params() -> dict[str, Any]:
        first = T0 + (first_minute + rng.randrange(days * 1440 - cells)) * MINUTE
        refs = [CellRef(MINUTE, first + j * MINUTE) for j in range(cells)]
        key = [f"/page/{rng.randrange(keys):06d}"]
        return CellQuery.one_key(key, dict.fromkeys(refs, False)).bound(
            plan.name, plan.version, served
        )

    latencies = []
    dirty_mb, written_kib = _kernel("/proc/meminfo", "Dirty:") / 1024, _written_kib()
    for i in range(2 * n):
        if i == n:
            dirty_mb, written_kib = _kernel("/proc/meminfo", "Dirty:") / 1024, _written_kib()
        asked = params()
        started = time.perf_counter()
        rows = conn.execute(SERIES_SQL, asked, prepare=True).fetchall()
        elapsed = (time.perf_counter() - started) * 1000
        assert len(rows) == cells and rows[0][3] == MINUTE, (asked["key"], len(rows))
        if i >= n:
            latencies.append(elapsed)
    written_mb = (_written_kib() - written_kib) / 1024
    waits = [explained(conn, params()) for _ in range(n)]
    tail = sorted(waits, key=lambda wait: wait.execution_ms)[-max(1, n // 100) :]
    blocks_read = [wait.blocks_read for wait in waits]
    asked = params()
    plan_node = conn.execute(
        sql.SQL("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) ") + sql.SQL(SERIES_SQL), asked
    ).fetchone()[0][0]["Plan"]  # type: ignore[index]
    pages = plan_node["Shared Hit Blocks"] + plan_node["Shared Read Blocks"]
    heap_pages = conn.execute(
        "SELECT count(DISTINCT (tableoid, (ctid::text::point)[0])) FROM batch_cells "
        "WHERE generation = %(generation)s AND metric = %(metric)s AND version = %(version)s "
        f"AND window_ms = {MINUTE} AND key = %(key)s AND start_ms = ANY(%(starts)s)",
        asked,
    ).fetchone()[0]  # type: ignore[index]
    return {
        "p50_ms": pct(latencies, 0.5),
        "p99_ms": pct(latencies, 0.99),
        "pages": pages,
        "heap_pages": heap_pages,
        "dirty_mb": dirty_mb,
        "written_mb": written_mb,
        "executed_p50_ms": pct([w.execution_ms for w in waits], 0.5),
        "executed_p99_ms": pct([w.execution_ms for w in waits], 0.99),
        "io_tail_share": IoWait.share(tail),
        "io_share": IoWait.share(waits),
        "blocks_read_p50": pct(blocks_read, 0.5),
        "blocks_read_p99": pct(blocks_read, 0.99),
        "io_ms_per_block": sum(w.io_ms for w in waits) / max(1, sum(blocks_read)),
    }


class IoWait(NamedTuple):
    """One read's execution time, what of it the backend spent reading and writing pages
    (`track_io_timing`: pages it did not hold in shared buffers, and dirty buffers it evicted
    to make room), and how many pages it read."""

    execution_ms: float
    io_ms: float
    blocks_read: int

    @staticmethod
    def share(waits: Sequence[IoWait]) -> float:
        return sum(w.io_ms for w in waits) / sum(w.execution_ms for w in waits)


def explained(conn: psycopg.Connection[Any], asked: dict[str, Any]) -> IoWait:
    """One series read under `EXPLAIN (ANALYZE, BUFFERS, TIMING OFF)`: its execution time (not
    its planning: the API's statement is prepared, this one is not) and its top node's I/O
    time and pages read (children included). The database has `track_io_timing` on
    (`measure`)."""
    (document,) = conn.execute(
        sql.SQL("EXPLAIN (ANALYZE, BUFFERS, TIMING OFF, FORMAT JSON) ") + sql.SQL(SERIES_SQL),
        asked,
    ).fetchone()  # type: ignore[misc]
    node = document[0]["Plan"]
    io_ms = node.get("I/O Read Time", 0.0) + node.get("I/O Write Time", 0.0)
    return IoWait(document[0]["Execution Time"], io_ms, node["Shared Read Blocks"])


def _kernel(path: str, field: str) -> int:
    """A field of one of the kernel's counters files (`/proc/meminfo`: kB; `/proc/vmstat`)."""
    for line in Path(path).read_text().splitlines():
        if line.startswith(field):
            return int(line.split()[1])
    raise SystemExit(f"{path} has no {field.strip()} field")


def _written_kib() -> int:
    """KiB the machine has written to disk since boot (`pgpgout`)."""
    return _kernel("/proc/vmstat", "pgpgout ")


def incremental_publications(conn: psycopg.Connection[Any], plan: MetricPlan) -> float:
    """Median ms of 5 incremental publications, each of one new hour after the view's end."""
    generation = conn.execute("SELECT generation FROM served_view WHERE id = 1").fetchone()[0]  # type: ignore[index]
    times = []
    end = T0 + DAYS * DAY
    for hour in range(5):
        start = end + hour * HOUR
        new = [
            BatchCell(
                plan.name,
                plan.version,
                size,
                cell_start,
                [f"/page/new{k:04d}"],
                60,
                99.0,
                0.5,
                3.0,
                [],
                [],
            )
            for k in range(NEW_KEYS)
            for size, cell_start in [
                *((MINUTE, start + m * MINUTE) for m in range(60)),
                (HOUR, start),
                (DAY, start - start % DAY),
            ]
        ]
        started = time.perf_counter()
        publish_incremental(
            conn,
            generation,
            {plan.source.topic: {"0": hour}},
            new,
            [],
            publication(plan, start + HOUR, snapshot=hour + 1),
            {plan.name: ()},
        )
        times.append((time.perf_counter() - started) * 1000)
    return statistics.median(times)


def expire(conn: psycopg.Connection[Any], plan: MetricPlan) -> dict[str, float]:
    """Retention (`expire_cells`) at the view's end and a day later: first the 1m cells of
    the view's first week go, a whole time range dropped; then those of its eighth day, rows
    deleted from the next range (and the VACUUM after that DELETE)."""
    generation = conn.execute("SELECT generation FROM served_view WHERE id = 1").fetchone()[0]  # type: ignore[index]
    figures: dict[str, float] = {}
    for name, watermark in (("drop_week", T0 + DAYS * DAY), ("delete_day", T0 + (DAYS + 1) * DAY)):
        started = time.monotonic()
        with conn.transaction():
            expired = expire_cells(conn, generation, [plan], {plan.name: watermark})
        figures[f"{name}_s"] = time.monotonic() - started
        figures[f"{name}_deleted"], figures[f"{name}_dropped"] = expired
        started = time.monotonic()
        drop_detached_ranges(conn)
        figures[f"{name}_after_s"] = time.monotonic() - started
    started = time.monotonic()
    conn.execute(sql.SQL("VACUUM {}").format(sql.Identifier(f"batch_cells_g{generation}")))
    figures["vacuum_s"] = time.monotonic() - started
    return figures


def measure(base: Settings, name: str, cells: int, n: int) -> dict[str, float]:
    plan = view_plan()
    keys = max(1, round(cells / CELLS_PER_KEY))
    dbname = f"lp_bench_view_{name}_{uuid.uuid4().hex[:6]}"
    with psycopg.connect(base.postgres.url, autocommit=True) as admin:
        admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(dbname)))
        as_admin(admin, f"ALTER DATABASE {dbname} SET track_io_timing = on")  # `explained`
    url = with_db(base.postgres.url, dbname)
    try:
        upgrade(url)
        with psycopg.connect(url, autocommit=True) as conn:
            log(f"{name}: generating {keys * CELLS_PER_KEY:,} cells ({keys} keys x {DAYS} days)")
            figures = load(conn, plan, keys)
            log(f"{name}: loaded in {figures['load_s']:.0f} s, keyed in {figures['index_s']:.0f} s")
            for pattern, days in (("recent", 2), ("any", DAYS)):
                for cells_read, count in ((60, n), (1440, n // 4)):
                    read = reads(conn, plan, keys, cells_read, count, days)
                    for figure, value in read.items():
                        figures[f"s{cells_read}_{pattern}_{figure}"] = value
            figures.update(disk_page_reads(conn, int(figures["generation"]), n))
            figures["incr_publish_ms"] = incremental_publications(conn, plan)
            figures.update(expire(conn, plan))
        shown = " ".join(
            f"{k}={v:.3g}" if isinstance(v, float) else f"{k}={v}" for k, v in figures.items()
        )
        print(f"BENCH batch_view view={name} {shown}", flush=True)
        return figures
    finally:
        drop_database(base.postgres.url, dbname)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cells", type=int, default=100_000_000)
    parser.add_argument("--small", type=int, default=1_000_000)
    parser.add_argument("--reads", type=int, default=2000, help="s60 reads per view")
    args = parser.parse_args()
    freeze_startup_objects(10_000)  # as the API's server does: reads timed as it would time them
    base = Settings()
    stack_up(base, ("postgres",))
    small = measure(base, "small", args.small, args.reads)
    big = measure(base, "big", args.cells, args.reads)
    ratios = {
        **{
            f"{read}_{q}_ratio": big[f"{read}_{q}_ms"] / small[f"{read}_{q}_ms"]
            for read in ("s60_recent", "s1440_recent", "s60_any", "s1440_any")
            for q in ("p50", "p99")
        },
        **{
            f"{read}_any_p99_over_disk_page_p99": big[f"{read}_any_p99_ms"]
            / big["disk_page_p99_ms"]
            for read in ("s60", "s1440")
        },
        "incr_publish_ratio": big["incr_publish_ms"] / small["incr_publish_ms"],
        "cells_ratio": big["cells"] / small["cells"],
    }
    print("BENCH batch_view " + " ".join(f"{k}={v:.3g}" for k, v in ratios.items()), flush=True)


if __name__ == "__main__":
    main()
