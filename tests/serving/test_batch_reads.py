"""How the serving layer's reads of one key's batch cells run in PostgreSQL: each run of
consecutive cells asked for is one range of the generation's index by key, whatever the
planner estimates for the key. A rollup's only key (`{}`, the total) is rare among the
metric's cells, so the planner estimated it at one row and scanned all of the rollup's cells
once per cell asked for: a day's total took 11 ms of PostgreSQL instead of 0.1 ms, and a
burst of such requests queued up (bench/serve.py's `total_rollup`). A run goes to the time
ranges holding its cells (the generation's other ranges are pruned at run time: "Time
partitions" in docs/architecture.md)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from serving_layer.batch_view import SERIES_SQL, CellQuery
from serving_layer.served_row import ServedRow
from shared.db.connect import connect
from shared.windows import CellRef
from tests.conftest import Platform, reconfigured
from tests.serving.views import Event, batch_rows, publish

pytestmark = [pytest.mark.services, pytest.mark.timeout(120)]

MINUTE = 60_000
T0 = 1_767_225_600_000  # 2026-01-01T00:00:00Z
W = T0 + 2 * 60 * MINUTE
KEYS = [(f"c{c}", f"p{p}") for c in range(40) for p in range(25)]


def _scans(plan: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """Every node of an EXPLAIN (FORMAT JSON) plan."""
    yield plan
    for child in plan.get("Plans", ()):
        yield from _scans(child)


def test_a_rollup_total_reads_its_cells_as_one_range_of_the_index_by_key(
    platform: Platform,
) -> None:
    grid = {
        "name": "grid",
        "source": "pageviews",
        "key": ["country", "page"],
        "aggregations": ["count"],
        "rollups": [[]],
        "windows": ["1m", "1h"],
        "grace": "2m",
    }
    settings = reconfigured(platform, metrics=[grid]).settings
    events = [Event(t, key, 1.0, "u") for t in range(T0, W, MINUTE) for key in KEYS]
    total = settings.plans["grid[]"]
    rows = [r for plan in settings.plans.values() for r in batch_rows(settings, plan, events, W)]
    publish(settings, rows, {name: W for name in settings.plans})
    asked = [W - 30 * MINUTE + i * MINUTE for i in range(30)]
    # two runs: the first 20 cells without their sketches, the last 10 with them
    needs = {CellRef(MINUTE, start): i >= 20 for i, start in enumerate(asked)}
    with connect(settings.postgres.url, autocommit=True) as conn:
        conn.execute("ANALYZE batch_cells")
        ((generation, stamp),) = conn.execute(
            "SELECT generation, xmin::text FROM served_view"
        ).fetchall()
        params = CellQuery.one_key([], needs).bound(
            total.name, total.version, ServedRow(stamp, generation, W)
        )
        cells = conn.execute(SERIES_SQL, params).fetchall()
        ((explained,),) = conn.execute(
            "EXPLAIN (ANALYZE, FORMAT JSON) " + SERIES_SQL, params
        ).fetchall()
        scans = [
            n
            for n in _scans(explained[0]["Plan"])
            if n.get("Relation Name", "").startswith("batch_cells")
        ]
        ran = [scan for scan in scans if scan["Actual Loops"] > 0]
        indexes = {
            name: definition
            for name, definition in conn.execute(
                "SELECT indexname, indexdef FROM pg_indexes WHERE indexname = ANY(%s)",
                [[scan["Index Name"] for scan in ran]],
            ).fetchall()
        }
    assert sorted((row[4], row[5]) for row in cells) == [(start, len(KEYS)) for start in asked]
    assert ran, explained
    assert sum(scan["Actual Loops"] for scan in ran) == 2, ran  # one per run, the rest pruned
    for scan in ran:
        assert "(metric, version, window_ms, key, start_ms)" in indexes[scan["Index Name"]]
        assert "r.first_ms" in scan["Index Cond"] and "key" in scan["Index Cond"], scan
        assert not scan.get("Rows Removed by Filter"), scan
    assert sum(scan["Actual Rows"] * scan["Actual Loops"] for scan in ran) == len(asked), ran
