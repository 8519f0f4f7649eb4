"""The batch view's time partitions against the real PostgreSQL ("Time partitions" in
docs/architecture.md): a full generation is loaded into time ranges of its retained windows
(one range for a window kept forever) in the table of each plan's retention group, an
incremental or range publication adds the ranges its cells need to the served generation,
retention drops a range whose cells are all past it and deletes within the others (also
where another metric keeps the same window forever), and a drop that would wait on a reader
deletes instead; every kept cell stays as it was."""

from __future__ import annotations

import random
import threading
import time
from itertools import groupby
from typing import Any

import psycopg
import pyarrow as pa
import pytest

from batch_layer.publish import (
    Expired,
    Publication,
    _flip,
    _load_cells,
    expire_cells,
    publish_full_generation,
    publish_incremental,
    publish_range,
)
from batch_layer.run_plan import CELL_SCHEMA
from shared.db.cell_tables import (
    DAY_MS,
    RetentionGroup,
    TimeRange,
    add_time_ranges,
    drop_detached_ranges,
    generation_table,
    index_generation,
    retention_groups,
    time_ranges,
)
from shared.db.cells import BatchCell
from shared.db.connect import connect
from shared.metric_plan import MetricPlan
from tests.conftest import Platform, reconfigured

pytestmark = pytest.mark.services

MINUTE, HOUR = 60_000, 3_600_000
T0 = 2_920 * 7 * DAY_MS  # a boundary of the 1m ranges (7 days)
METRIC = {
    "name": "views",
    "source": "pageviews",
    "key": ["page"],
    "value": "latency_ms",
    "aggregations": ["count", "sum"],
    "windows": ["1m", "1h"],
    "retention": {"1m": "7d"},
    "grace": "2m",
}


def _plan(platform: Platform) -> MetricPlan:
    return reconfigured(platform, metrics=[METRIC]).settings.plans["views"]


def _cell(plan: MetricPlan, size: int, start: int, page: str = "/a", count: int = 1) -> BatchCell:
    return BatchCell(
        plan.name, plan.version, size, start, [page], count, float(count), None, None, [], []
    )


def _publication(plan: MetricPlan, watermark: int, offset: int) -> Publication:
    return Publication(
        snapshot={plan.source.topic: {"0": offset}},
        watermarks={plan.name: watermark},
        rebuild_from={plan.source.topic: {"0": offset}},
        versions={plan.name: plan.version},
    )


def _publish_incremental(
    conn: psycopg.Connection[Any],
    plan: MetricPlan,
    generation: int,
    cells: list[BatchCell],
    watermark: int,
) -> None:
    """An incremental publication of `cells` into `generation` (after the full one), committed."""
    publish_incremental(
        conn,
        generation,
        {plan.source.topic: {"0": 1}},
        cells,
        [],
        _publication(plan, watermark, 2),
        {plan.name: plan.kinds},
    )
    conn.commit()


def _stored(conn: psycopg.Connection[Any]) -> set[tuple[int, int, int]]:
    return set(
        conn.execute(
            "SELECT c.window_ms, c.start_ms, c.count FROM batch_cells c "
            "JOIN served_view s ON c.generation = s.generation"
        ).fetchall()
    )


def _three_weeks(plan: MetricPlan) -> list[BatchCell]:
    """A 1m cell every 6 hours and a 1h cell every day, over 21 days from T0."""
    minutes = [_cell(plan, MINUTE, T0 + i * 6 * HOUR) for i in range(84)]
    hours = [_cell(plan, HOUR, T0 + d * DAY_MS) for d in range(21)]
    return minutes + hours


def _publish_three_weeks(conn: psycopg.Connection[Any], plan: MetricPlan) -> int:
    """A full generation of `_three_weeks`, its retained windows split; its number."""
    generation, _ = publish_full_generation(
        conn,
        _three_weeks(plan),
        [],
        [],
        _publication(plan, T0 + 21 * DAY_MS, 1),
        retention_groups([plan]),
    )
    return generation


def test_a_generation_is_loaded_into_ranges_and_publications_add_what_they_need(
    platform: Platform,
) -> None:
    plan = _plan(platform)
    with connect(platform.settings.postgres.url) as conn:
        generation = _publish_three_weeks(conn, plan)
        assert time_ranges(conn, generation) == [
            TimeRange(MINUTE, T0, T0 + 7 * DAY_MS, "r0"),
            TimeRange(MINUTE, T0 + 7 * DAY_MS, T0 + 14 * DAY_MS, "r0"),
            TimeRange(MINUTE, T0 + 14 * DAY_MS, T0 + 21 * DAY_MS, "r0"),
            TimeRange(HOUR, None, None, "r0"),  # kept forever: never dropped, never split
        ]
        conn.commit()
        before = _stored(conn)
        later = [_cell(plan, MINUTE, T0 + 22 * DAY_MS), _cell(plan, MINUTE, T0 + 21 * DAY_MS, "/b")]
        _publish_incremental(conn, plan, generation, later, T0 + 23 * DAY_MS)
        publish_range(
            conn, generation, {plan.source.topic: {"0": 2}}, [], [_cell(plan, MINUTE, T0 - HOUR)]
        )
        conn.commit()
        assert time_ranges(conn, generation)[0] == TimeRange(MINUTE, None, T0, "r0")
        assert TimeRange(MINUTE, T0 + 21 * DAY_MS, T0 + 28 * DAY_MS, "r0") in time_ranges(
            conn, generation
        )
        new = {(MINUTE, T0 + 22 * DAY_MS, 1), (MINUTE, T0 + 21 * DAY_MS, 1), (MINUTE, T0 - HOUR, 1)}
        assert _stored(conn) == before | new


def _key_runs(conn: psycopg.Connection[Any], generation: int) -> dict[str, list[str]]:
    """Per time range's table of `generation`: the pages of its 1m cells in heap order (by
    ctid), a key's consecutive cells written as one run of its page."""
    runs: dict[str, list[str]] = {}
    for r in time_ranges(conn, generation):
        if r.window_ms != MINUTE:
            continue
        table = r.table(generation)
        keys = conn.execute(f'SELECT key[1] FROM "{table}" ORDER BY ctid').fetchall()
        runs[table] = [page for page, _ in groupby(k for (k,) in keys)]
    return runs


@pytest.mark.parametrize("as_arrow", [True, False], ids=["arrow", "rows"])
def test_a_publication_writes_each_ranges_cells_key_by_key(
    platform: Platform, as_arrow: bool
) -> None:
    """`HEAP_ORDER`: a series of one key reads a page or two per range, not a page per cell,
    however the run handed its cells over (a full run's Arrow table comes in Spark's order)."""
    plan = _plan(platform)
    pages = [f"/{i:03d}" for i in range(40)]
    cells = [
        _cell(plan, MINUTE, T0 + d * DAY_MS + m * MINUTE, page)
        for d in range(10)
        for m in range(30)
        for page in pages
    ]
    random.Random(7).shuffle(cells)
    handed: pa.Table | list[BatchCell] = cells
    if as_arrow:
        table = pa.Table.from_pylist(
            [dict(zip(CELL_SCHEMA.names, c.columns(), strict=True)) for c in cells], CELL_SCHEMA
        )  # in chunks, as a run's table comes from Spark's batches
        handed = pa.Table.from_batches(table.to_batches(max_chunksize=1000), CELL_SCHEMA)
    with connect(platform.settings.postgres.url) as conn:
        generation, written = publish_full_generation(
            conn, handed, [], [], _publication(plan, T0 + 11 * DAY_MS, 1), retention_groups([plan])
        )
        conn.commit()
        assert written == len(cells)
        runs = _key_runs(conn, generation)
        assert len(runs) == 2  # days 0-6 and 7-9
        for table, keys in runs.items():
            assert sorted(keys) == pages, f"{table}: a key's cells are not together: {keys[:20]}"
        hour = [
            _cell(plan, MINUTE, T0 + 10 * DAY_MS + m * MINUTE, page)
            for m in range(60)
            for page in pages
        ]
        random.Random(8).shuffle(hour)
        _publish_incremental(conn, plan, generation, hour, T0 + 11 * DAY_MS)
        second = next(r for r in time_ranges(conn, generation) if r.holds(T0 + 10 * DAY_MS))
        appended = _key_runs(conn, generation)[second.table(generation)]
        assert appended[len(pages) :] == pages  # the new hour after the run's, key by key


def _expire(platform: Platform, plan: MetricPlan, watermark: int) -> tuple[int, Expired]:
    """Publish three weeks, expire under `watermark`; (generation, what was removed)."""
    with connect(platform.settings.postgres.url) as conn:
        generation = _publish_three_weeks(conn, plan)
    with connect(platform.settings.postgres.url) as conn:
        removed = expire_cells(conn, generation, [plan], {plan.name: watermark})
        conn.commit()
    return generation, removed


def _kept(plan: MetricPlan, watermark: int) -> set[tuple[int, int, int]]:
    kept_from = plan.windows.kept_from(MINUTE, watermark)
    assert kept_from is not None
    return {
        (c.window_ms, c.start_ms, c.count)
        for c in _three_weeks(plan)
        if c.window_ms == HOUR or c.start_ms >= kept_from
    }


def test_retention_drops_a_range_wholly_past_it_and_deletes_within_the_next(
    platform: Platform,
) -> None:
    plan = _plan(platform)
    watermark = T0 + 15 * DAY_MS + 3 * HOUR  # keeps 1m cells from day 8, 3h on
    generation, removed = _expire(platform, plan, watermark)
    with connect(platform.settings.postgres.url) as conn:
        assert _stored(conn) == _kept(plan, watermark)
        # the first week's 28 cells went with their range; the rest row by row
        assert removed == Expired(84 + 21 - len(_kept(plan, watermark)) - 28, 1)
        assert TimeRange(MINUTE, T0, T0 + 7 * DAY_MS, "r0") not in time_ranges(conn, generation)
        assert TimeRange(MINUTE, T0 + 7 * DAY_MS, T0 + 14 * DAY_MS, "r0") in time_ranges(
            conn, generation
        )
        # detached by the publication, dropped after it (by the runner; or by the next run,
        # had it crashed in between): the commit readers waited for unlinked no file
        first_week = TimeRange(MINUTE, T0, T0 + 7 * DAY_MS, "r0").table(generation)
        assert _exists(conn, first_week)
        assert drop_detached_ranges(conn) == [first_week]
        assert not _exists(conn, first_week)
        assert drop_detached_ranges(conn) == []
        assert _stored(conn) == _kept(plan, watermark)


def _exists(conn: psycopg.Connection[Any], table: str) -> bool:
    return conn.execute("SELECT to_regclass(%s)", [table]).fetchone() != (None,)


def test_a_drop_that_would_wait_on_a_reader_deletes_instead(platform: Platform) -> None:
    plan = _plan(platform)
    watermark = T0 + 15 * DAY_MS
    holding, done = threading.Event(), threading.Event()

    def read_and_hold() -> None:
        with connect(platform.settings.postgres.url) as reader:
            reader.execute("SELECT count(*) FROM batch_cells").fetchone()
            holding.set()
            done.wait(30)

    with connect(platform.settings.postgres.url) as conn:
        generation = _publish_three_weeks(conn, plan)
    reader = threading.Thread(target=read_and_hold)
    reader.start()
    try:
        assert holding.wait(10)
        began = time.monotonic()
        with connect(platform.settings.postgres.url) as conn:
            removed = expire_cells(conn, generation, [plan], {plan.name: watermark})
            conn.commit()
        waited = time.monotonic() - began
    finally:
        done.set()
        reader.join()
    assert 0.4 < waited < 10
    with connect(platform.settings.postgres.url) as conn:
        assert _stored(conn) == _kept(plan, watermark)
        assert removed == Expired(84 + 21 - len(_kept(plan, watermark)), 0)
        assert TimeRange(MINUTE, T0, T0 + 7 * DAY_MS, "r0") in time_ranges(conn, generation)


def test_retention_drops_a_range_whole_where_another_metric_keeps_the_window_forever(
    platform: Platform,
) -> None:
    totals = {**METRIC, "name": "totals", "key": [], "retention": {}}
    settings = reconfigured(platform, metrics=[METRIC, totals]).settings
    views, kept = settings.plans["views"], settings.plans["totals"]
    plans = [views, kept]
    cells = [
        *_three_weeks(views),
        *(_cell(kept, c.window_ms, c.start_ms) for c in _three_weeks(kept)),
    ]
    watermark = T0 + 15 * DAY_MS + 3 * HOUR
    publication = Publication(
        snapshot={views.source.topic: {"0": 1}},
        watermarks={views.name: watermark, kept.name: watermark},
        rebuild_from={views.source.topic: {"0": 1}},
        versions={views.name: views.version, kept.name: kept.version},
    )
    with connect(platform.settings.postgres.url) as conn:
        generation, _ = publish_full_generation(
            conn, cells, [], [], publication, retention_groups(plans)
        )
        conn.commit()
        # views' 1m cells in weeks of its own group; totals' (kept forever) in one range
        assert time_ranges(conn, generation) == [
            TimeRange(MINUTE, T0, T0 + 7 * DAY_MS, "r0"),
            TimeRange(MINUTE, T0 + 7 * DAY_MS, T0 + 14 * DAY_MS, "r0"),
            TimeRange(MINUTE, T0 + 14 * DAY_MS, T0 + 21 * DAY_MS, "r0"),
            TimeRange(HOUR, None, None, "r0"),
            TimeRange(MINUTE, None, None, "rest"),
            TimeRange(HOUR, None, None, "rest"),
        ]
        removed = expire_cells(conn, generation, plans, publication.watermarks)
        conn.commit()
        assert removed == Expired(84 + 21 - len(_kept(views, watermark)) - 28, 1)
        assert TimeRange(MINUTE, T0, T0 + 7 * DAY_MS, "r0") not in time_ranges(conn, generation)
        stored = set(
            conn.execute(
                "SELECT c.metric, c.window_ms, c.start_ms FROM batch_cells c "
                "JOIN served_view s ON c.generation = s.generation"
            ).fetchall()
        )
        assert stored == {
            *(("views", w, start) for w, start, _ in _kept(views, watermark)),
            *(("totals", c.window_ms, c.start_ms) for c in _three_weeks(kept)),
        }
        # a later publication's cells go to each metric's group
        later = [_cell(views, MINUTE, T0 + 22 * DAY_MS), _cell(kept, MINUTE, T0 + 22 * DAY_MS)]
        publish_incremental(
            conn,
            generation,
            {views.source.topic: {"0": 1}},
            later,
            [],
            Publication(
                {views.source.topic: {"0": 2}},
                {views.name: T0 + 23 * DAY_MS, kept.name: T0 + 23 * DAY_MS},
                {views.source.topic: {"0": 2}},
                publication.versions,
            ),
            {plan.name: plan.kinds for plan in plans},
        )
        conn.commit()
        assert TimeRange(MINUTE, T0 + 21 * DAY_MS, T0 + 28 * DAY_MS, "r0") in time_ranges(
            conn, generation
        )
        held = conn.execute(
            f'SELECT metric FROM "{TimeRange(MINUTE, None, None, "rest").table(generation)}" '
            "WHERE start_ms = %s",
            [T0 + 22 * DAY_MS],
        ).fetchall()
        assert held == [("totals",)]


def test_a_generation_laid_out_before_retention_groups_still_grows_and_expires(
    platform: Platform,
) -> None:
    """A generation whose time ranges hang off its own table (as migration 0007 and the runs
    before retention groups laid them out) takes publications and retention until the next
    full run lays out a new one."""
    plan = _plan(platform)
    with connect(platform.settings.postgres.url) as conn:
        generation = conn.execute("SELECT nextval('batch_generation_seq')").fetchone()[0]  # type: ignore[index]
        table = psycopg.sql.Identifier(generation_table(generation))
        conn.execute(
            psycopg.sql.SQL(
                "CREATE TABLE {} (LIKE batch_cells) PARTITION BY RANGE (window_ms, start_ms)"
            ).format(table)
        )
        cells = _three_weeks(plan)
        add_time_ranges(
            conn,
            generation,
            {(plan.name, MINUTE): range(T0, T0 + 21 * DAY_MS, DAY_MS), (plan.name, HOUR): [T0]},
            [RetentionGroup("", frozenset(), {MINUTE: 7 * DAY_MS})],  # the generation's own
        )
        _load_cells(conn, table, generation, cells)
        index_generation(conn, generation)
        conn.execute(
            psycopg.sql.SQL(
                "ALTER TABLE batch_cells ATTACH PARTITION {} FOR VALUES IN ({})"
            ).format(table, psycopg.sql.Literal(generation))
        )
        _flip(conn, generation, _publication(plan, T0 + 21 * DAY_MS, 1))
        conn.commit()
        assert time_ranges(conn, generation) == [
            TimeRange(MINUTE, T0, T0 + 7 * DAY_MS),
            TimeRange(MINUTE, T0 + 7 * DAY_MS, T0 + 14 * DAY_MS),
            TimeRange(MINUTE, T0 + 14 * DAY_MS, T0 + 21 * DAY_MS),
            TimeRange(HOUR, None, None),
        ]
        _publish_incremental(
            conn, plan, generation, [_cell(plan, MINUTE, T0 + 22 * DAY_MS)], T0 + 23 * DAY_MS
        )
        assert TimeRange(MINUTE, T0 + 21 * DAY_MS, T0 + 28 * DAY_MS) in time_ranges(
            conn, generation
        )
        watermark = T0 + 15 * DAY_MS + 3 * HOUR
        removed = expire_cells(conn, generation, [plan], {plan.name: watermark})
        conn.commit()
        assert removed.dropped == 1
        assert TimeRange(MINUTE, T0, T0 + 7 * DAY_MS) not in time_ranges(conn, generation)
        assert _stored(conn) == _kept(plan, watermark) | {(MINUTE, T0 + 22 * DAY_MS, 1)}
