"""Full, incremental and range runs on the real broker, PostgreSQL and Spark, against the
oracle and against each other (rules 4-7)."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

from batch_layer import execute_run
from lambdactl.generator import GeneratorSpec
from shared.config import Settings
from shared.db.connect import connect
from shared.db.runs import RunRequest
from shared.kafka import create_topics
from tests.batch.helpers import (
    DAY,
    HOUR,
    MINUTE,
    edge_cases,
    oracle_mismatches,
    produce_raw,
    produce_spec,
    queue,
    read_view,
    run_record,
    same_cells,
    served_view,
)
from tests.conftest import Platform

pytestmark = [pytest.mark.services, pytest.mark.timeout(400)]


class Hammer(threading.Thread):
    """A reader reading the served row and its cells in one snapshot, as fast as it can:
    records (snapshot, total count of `views_total`'s base cells) per observation."""

    def __init__(self, settings: Settings) -> None:
        super().__init__(daemon=True)
        self.settings = settings
        self.stop = threading.Event()
        self.seen: dict[str, set[int]] = {}
        self.reads = 0

    def run(self) -> None:
        with connect(self.settings.postgres.url, autocommit=True) as conn:
            while not self.stop.is_set():
                served, cells = read_view(conn)
                if served is None:
                    time.sleep(0.01)
                    continue
                total = sum(
                    c.count for k, c in cells.items() if k[0] == "views_total" and k[1] == MINUTE
                )
                key = repr(sorted(served.snapshot[self.settings.sources[0].topic].items()))
                key += repr(sorted(served.watermarks.items()))
                self.seen.setdefault(key, set()).add(total)
                self.reads += 1


def _ids(settings: Settings) -> set[tuple[Any, ...]]:
    with connect(settings.postgres.url, autocommit=True) as conn:
        return set(conn.execute('SELECT source, event_id, partition, "offset" FROM dedup_ids'))


def _run(settings: Settings, request: RunRequest, spark: Any) -> Any:
    run_id = queue(settings, request)
    summary = execute_run(settings, spark, run_id)
    record = run_record(settings, run_id)
    assert record.status == "succeeded", record.error
    return summary, record


def test_incremental_equals_full_and_oracle(platform: Platform, spark: Any) -> None:
    settings = platform.settings
    create_topics(settings)
    now = int(time.time() * 1000) // MINUTE * MINUTE
    first = produce_spec(
        settings,
        GeneratorSpec(now - 6 * HOUR, now - 3 * HOUR, 3000, malformed_fraction=0.01, seed=11),
    )
    edges = edge_cases(now - 4 * HOUR)
    produce_raw(settings, [edges[0], *edges[2:]])
    hammer = Hammer(settings)
    hammer.start()
    try:
        full1, _ = _run(settings, RunRequest("full"), spark)
        assert full1.malformed > 0
        served1, _ = served_view(settings)
        assert served1 is not None

        # new events, late ones, and copies whose first copy an earlier run counted
        produce_spec(settings, GeneratorSpec(now - 3 * HOUR, now - HOUR, 2000, seed=12))
        produce_raw(settings, [(r.key, r.value) for r in first[:150]])
        produce_raw(settings, [edges[1]])
        incr, incr_record = _run(settings, RunRequest("incremental"), spark)
        assert incr.mode == "incremental" and incr_record.executed_mode == "incremental"
        assert incr.rows_in < 2400, "an incremental run reads only the new offsets"
        served2, incr_cells = served_view(settings)
        incr_ids = _ids(settings)
        assert served2 is not None and served2.generation == served1.generation
        for metric, w in served2.watermarks.items():
            assert w >= served1.watermarks[metric]
        assert incr_record.w_before == served1.watermarks
        assert incr_record.w_after == served2.watermarks
        assert oracle_mismatches(settings, platform.config) == []

        # a run with nothing new changes nothing
        _run(settings, RunRequest("incremental"), spark)
        served3, cells3 = served_view(settings)
        assert served3 == served2 and same_cells(cells3, incr_cells) == []

        _run(settings, RunRequest("full"), spark)
        served4, full_cells = served_view(settings)
        assert served4 is not None and served4.generation > served2.generation
    finally:
        hammer.stop.set()
        hammer.join(10)
    assert served4.snapshot == served2.snapshot
    assert served4.watermarks == served2.watermarks
    assert served4.rebuild_from == served2.rebuild_from
    assert same_cells(incr_cells, full_cells) == []
    assert incr_ids == _ids(settings)
    # reader consistency: every served row was always read with the cells of its own run
    assert hammer.reads > 10
    assert len(hammer.seen) >= 2
    assert all(len(totals) == 1 for totals in hammer.seen.values()), hammer.seen


def test_incremental_without_a_served_rebuild_index_rereads_after_w(
    platform: Platform, spark: Any
) -> None:
    """A served row published before the rebuild index existed: the incremental run re-reads
    each partition from its `rebuild_from` once, and publishes what a full run would."""
    settings = platform.settings
    create_topics(settings)
    now = int(time.time() * 1000) // MINUTE * MINUTE
    produce_spec(settings, GeneratorSpec(now - 5 * HOUR, now - 2 * HOUR, 2000, seed=21))
    _run(settings, RunRequest("full"), spark)
    with connect(settings.postgres.url, autocommit=True) as conn:
        conn.execute("UPDATE served_view SET rebuild_index = '{}'")
    produce_spec(settings, GeneratorSpec(now - 2 * HOUR, now - HOUR, 800, seed=22))
    incr, _ = _run(settings, RunRequest("incremental"), spark)
    assert incr.mode == "incremental"
    after_incremental, incr_cells = served_view(settings)
    _run(settings, RunRequest("full"), spark)
    after_full, full_cells = served_view(settings)
    assert after_incremental is not None and after_full is not None
    assert after_incremental.rebuild_index, "the incremental run publishes the index again"
    assert after_incremental.rebuild_from == after_full.rebuild_from
    assert after_incremental.rebuild_index == after_full.rebuild_index
    assert same_cells(incr_cells, full_cells) == []


def test_range_run_changes_only_its_range(platform: Platform, spark: Any) -> None:
    settings = platform.settings
    create_topics(settings)
    today = int(time.time() * 1000) // DAY * DAY
    produce_spec(settings, GeneratorSpec(today - 3 * DAY, today, 3000, seed=21))
    _run(settings, RunRequest("full"), spark)
    served, cells = served_view(settings)
    assert served is not None
    with connect(settings.postgres.url, autocommit=True) as conn:
        conn.execute("UPDATE batch_cells SET count = count + 1000")
    # events after the served snapshot are not part of a range run
    produce_spec(settings, GeneratorSpec(today - 2 * DAY, today - DAY, 500, seed=22))
    start = today - 2 * DAY + 5 * HOUR
    _summary, record = _run(settings, RunRequest("range", start, start + HOUR), spark)
    assert record.executed_mode == "range"
    after, range_cells = served_view(settings)
    assert after is not None
    assert after.watermarks == served.watermarks and after.snapshot == served.snapshot
    lo, hi = today - 2 * DAY, today - DAY  # widened to the 1d boundaries
    inside = {c: v for c, v in cells.items() if lo <= c[2] < hi}
    assert (
        inside
        and same_cells({c: v for c, v in range_cells.items() if lo <= c[2] < hi}, inside) == []
    )
    outside = {c for c in cells if not lo <= c[2] < hi}
    assert outside and all(range_cells[c].count == cells[c].count + 1000 for c in outside)


def test_changed_metric_versions_run_full(platform: Platform, spark: Any) -> None:
    settings = platform.settings
    create_topics(settings)
    now = int(time.time() * 1000) // MINUTE * MINUTE
    produce_spec(settings, GeneratorSpec(now - 2 * HOUR, now, 800, seed=31))
    _run(settings, RunRequest("full"), spark)
    served, _ = served_view(settings)
    assert served is not None
    changed = platform.config | {
        "metrics": [
            platform.config["metrics"][0],
            {**platform.config["metrics"][1], "grace": "5m"},
        ]
    }
    settings2 = Settings(**changed)
    summary, record = _run(settings2, RunRequest("incremental"), spark)
    assert summary.mode == record.executed_mode == "full"
    after, _ = served_view(settings2)
    assert after is not None and after.generation > served.generation
    assert after.versions["views_total"] != served.versions["views_total"]
    assert oracle_mismatches(settings2, changed) == []
