"""Migrating a populated batch view to time partitions (`0007_time_partitions`): a database
at the revision before, serving a generation of half a million cells in one table, upgrades
while a reader keeps reading the served view; the reader is never held up, every cell is
kept, the served generation is then time-partitioned, gains its index by key
(`0008_cells_by_key`, again while read) and an incremental publication goes on into it;
downgrading copies it back into one table, again without losing a cell."""

from __future__ import annotations

import threading
import time
from typing import Any

import psycopg
import pytest
from alembic import command

from batch_layer.publish import Publication, _flip, publish_incremental
from serving_layer.batch_view import SERIES_SQL, CellQuery
from serving_layer.served_row import ServedRow
from shared.db.cell_tables import DAY_MS, REST, TimeRange, by_key_name, time_ranges
from shared.db.cells import BatchCell
from shared.db.connect import connect
from shared.db.migrate import alembic_config
from shared.windows import CellRef
from tests.conftest import Platform

pytestmark = [pytest.mark.services, pytest.mark.timeout(600)]

T0 = 56 * 364 * DAY_MS
MINUTES, KEYS = 14_400, 35  # ten days of 1m cells of 35 keys: 504,000 cells
SNAPSHOT = {"t": {"0": 5}}

_POPULATE = """
INSERT INTO {table} (generation, metric, version, window_ms, start_ms, key, count, sum, min,
                     max, sketches, sketch_summaries)
SELECT %(generation)s, 'views', 'v1', 60000, %(t0)s + m * 60000, ARRAY['/p' || k],
       1 + (m + k) %% 7, (m * k) %% 1000, NULL, NULL, '{{}}', '{{}}'
FROM generate_series(0, %(minutes)s - 1) m, generate_series(1, %(keys)s) k
"""

_CHECKSUM = """
SELECT count(*), sum(c.count), md5(string_agg(c.start_ms || c.key[1] || c.sum, ','
                                              ORDER BY c.start_ms, c.key))
FROM batch_cells c JOIN served_view s ON c.generation = s.generation
"""


def _populate_one_table(conn: psycopg.Connection[Any]) -> None:
    """The batch view as revision 0006 left it: the served generation in one table."""
    generation = conn.execute("SELECT nextval('batch_generation_seq')").fetchone()[0]  # type: ignore[index]
    table = psycopg.sql.Identifier(f"batch_cells_g{generation}")
    conn.execute(psycopg.sql.SQL("CREATE TABLE {} (LIKE batch_cells)").format(table))
    conn.execute(
        psycopg.sql.SQL(_POPULATE).format(table=table),
        {"generation": generation, "t0": T0, "minutes": MINUTES, "keys": KEYS},
    )
    conn.execute(
        psycopg.sql.SQL(
            "ALTER TABLE {} ADD PRIMARY KEY (generation, metric, version, window_ms, start_ms, key)"
        ).format(table)
    )
    conn.execute(
        psycopg.sql.SQL("ALTER TABLE batch_cells ATTACH PARTITION {} FOR VALUES IN ({})").format(
            table, psycopg.sql.Literal(generation)
        )
    )
    _flip(
        conn,
        generation,
        Publication(SNAPSHOT, {"views": T0 + MINUTES * 60_000}, SNAPSHOT, {"views": "v1"}),
    )
    conn.commit()


class SlowestRead:
    """Reads one key's hour of 1m cells over and over as the API does (the served row, then
    `SERIES_SQL`: the row again and its generation's cells by primary key, joined only while
    the row keeps the stamp read; a new stamp, the flip, means reading again), keeping the
    slowest read. `error`: what failed in the reading thread, for the test to raise."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.slowest_s = 0.0
        self.reads = 0
        self.replanned = 0
        self.error: BaseException | None = None
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run)

    def _run(self) -> None:
        try:
            self._read_until_stopped()
        except BaseException as exc:
            self.error = exc

    def _read_until_stopped(self) -> None:
        starts = [T0 + 5 * DAY_MS + i * 60_000 for i in range(60)]
        hour = CellQuery.one_key(["/p7"], {CellRef(60_000, start): False for start in starts})
        with connect(self.url, autocommit=True) as conn:
            while not self.stop.is_set():
                began = time.monotonic()
                row = conn.execute("SELECT generation, xmin::text FROM served_view").fetchone()
                assert row is not None
                cells = conn.execute(
                    SERIES_SQL, hour.bound("views", "v1", ServedRow(row[1], row[0], None))
                ).fetchall()
                if cells[0][-1] != row[1]:  # flipped between the two statements
                    self.replanned += 1
                    continue
                assert [c[4] for c in cells] == starts
                self.slowest_s = max(self.slowest_s, time.monotonic() - began)
                self.reads += 1
                time.sleep(0.01)


def _ranges_by_key(conn: psycopg.Connection[Any], generation: int) -> tuple[int, int]:
    """How many time ranges the generation has, and how many of them an index by key."""
    row = conn.execute(
        "SELECT count(*), count(*) FILTER (WHERE EXISTS (SELECT FROM pg_indexes i "
        "WHERE i.tablename = t.relid::regclass::text "
        "AND i.indexdef LIKE '%%(metric, version, window_ms, key, start_ms)')) "
        "FROM pg_partition_tree(%s) t WHERE t.isleaf",
        [f"batch_cells_g{generation}"],
    ).fetchone()
    assert row is not None
    return row[0], row[1]


def _relkind(conn: psycopg.Connection[Any]) -> str:
    row = conn.execute(
        "SELECT c.relkind FROM served_view s JOIN pg_class c "
        "ON c.relname = 'batch_cells_g' || s.generation"
    ).fetchone()
    assert row is not None
    return str(row[0])


def test_a_populated_batch_view_migrates_without_holding_readers_up(platform: Platform) -> None:
    url = platform.settings.postgres.url
    config = alembic_config(url)
    command.downgrade(config, "0006")
    with connect(url) as conn:
        _populate_one_table(conn)
        before = conn.execute(_CHECKSUM).fetchone()
    assert before is not None and before[0] == MINUTES * KEYS

    reader = SlowestRead(url)
    reader.thread.start()
    began = time.monotonic()
    try:
        command.upgrade(config, "0007")
        upgrade_s = time.monotonic() - began
    finally:
        reader.stop.set()
        reader.thread.join()
    if reader.error is not None:
        raise reader.error
    assert reader.reads > 10 and reader.replanned <= 2, (reader.reads, reader.replanned)
    assert upgrade_s > 2 * reader.slowest_s and reader.slowest_s < 1.0, (
        upgrade_s,
        reader.slowest_s,
    )

    with connect(url) as conn:
        assert conn.execute(_CHECKSUM).fetchone() == before
        assert _relkind(conn) == "p"
        served = conn.execute("SELECT generation FROM served_view").fetchone()[0]  # type: ignore[index]
        # without the metrics' retention at hand, every metric in one group and one range per
        # window: the next full run groups the metrics and splits the retained windows
        assert time_ranges(conn, served) == [TimeRange(60_000, None, None, REST)]
        assert _ranges_by_key(conn, served) == (1, 1)
        # as 0007 left a generation before 0008: no index by key
        conn.execute(psycopg.sql.SQL("DROP INDEX {}").format(by_key_name(served)))
        conn.commit()
        assert _ranges_by_key(conn, served) == (1, 0)

    reader = SlowestRead(url)
    reader.thread.start()
    try:
        command.upgrade(config, "0008")
    finally:
        reader.stop.set()
        reader.thread.join()
    if reader.error is not None:
        raise reader.error
    assert reader.reads > 0 and reader.slowest_s < 1.0, (reader.reads, reader.slowest_s)

    with connect(url) as conn:
        assert conn.execute(_CHECKSUM).fetchone() == before
        assert _ranges_by_key(conn, served) == (1, 1)
        later = T0 + 20 * DAY_MS
        publish_incremental(
            conn,
            served,
            SNAPSHOT,
            [BatchCell("views", "v1", 60_000, later, ["/p1"], 3, 3.0, None, None, [], [])],
            [],
            Publication({"t": {"0": 6}}, {"views": later + 60_000}, SNAPSHOT, {"views": "v1"}),
            {"views": ()},
        )
        conn.commit()
        before = conn.execute(_CHECKSUM).fetchone()
        assert before is not None and before[0] == MINUTES * KEYS + 1

    command.downgrade(config, "0006")
    with connect(url) as conn:
        assert conn.execute(_CHECKSUM).fetchone() == before
        assert _relkind(conn) == "r"
    command.upgrade(config, "head")
