"""Runs of metrics with lookups (rule 11 in docs/semantics.md) against the brute-force oracle,
which joins by the rule itself: a table that changes mid-stream, a back-dated version, two
versions valid from the same time, a deleted key (flag and tombstone), a key absent from the
table, an integer join key, invalid table records; then updates arriving after the events they
apply to, which the next incremental runs recompute: one back-dated before W (the run re-reads
every partition from offset 0), one valid after W (it re-reads from the rebuild index's offsets),
with copies of events counted before. Twice: with the table broadcast (a small table's join)
and joined by sorting both sides (a big one's)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import orjson
import pytest

from batch_layer import execute_run
from batch_layer.decode import InputLayout
from batch_layer.lookups import read_versions
from lambdactl.generator import GeneratorSpec
from shared.config import Settings
from shared.db.runs import RunRequest
from shared.kafka import create_topics
from tests import oracle
from tests.batch.helpers import (
    HOUR,
    LOOKUP_METRICS,
    MINUTE,
    back_dated,
    integer_pages,
    oracle_mismatches,
    pages_table,
    produce_raw,
    produce_spec,
    produce_table,
    queue,
    run_record,
    served_view,
    spark_conf,
    table_history,
    table_version,
)
from tests.conftest import Platform, reconfigured

pytestmark = [pytest.mark.services, pytest.mark.long(115), pytest.mark.timeout(600)]


def _page_one(event_id: str, ts: int) -> tuple[bytes, bytes]:
    event = {"ts": ts, "event_id": event_id, "page": "/page/1", "user_id": "u1", "latency_ms": 2.0}
    return event_id.encode(), orjson.dumps(event)


@contextmanager
def _join_strategy(spark: Any, strategy: str) -> Iterator[dict[str, Any]]:
    """The `spark` settings that make the runs join the table by `strategy`: `broadcast` (the
    default for a small table) or `sorted` (as for a table over `broadcast_table_records`,
    with Spark kept from broadcasting on its own meanwhile: adaptive execution would, the
    test's table being small)."""
    if strategy == "broadcast":
        yield {}
        return
    never = {
        "spark.sql.autoBroadcastJoinThreshold": "-1",
        "spark.sql.adaptive.autoBroadcastJoinThreshold": "-1",
    }
    with spark_conf(spark, never):
        yield {"broadcast_table_records": 0}


def _broadcast(spark: Any, settings: Settings) -> bool:
    """Whether the runs would broadcast the table of the metrics' first join."""
    layout = InputLayout.of([p for p in settings.plans.values() if p.config.lookups])
    join = layout.joins[0]
    ends = {str(p): 100 for p in range(settings.tables[0].partitions)}
    plan = read_versions(spark, settings, join, ends)._jdf.queryExecution().analyzed()
    return "strategy=broadcast" in plan.toString()


@pytest.mark.parametrize("strategy", ["broadcast", "sorted"])
def test_runs_join_tables_as_of_event_time(platform: Platform, spark: Any, strategy: str) -> None:
    with _join_strategy(spark, strategy) as join_settings:
        _join_tables_as_of_event_time(platform, spark, join_settings)


def _join_tables_as_of_event_time(
    platform: Platform, spark: Any, join_settings: dict[str, Any]
) -> None:
    tag = platform.config["sources"][0]["topic"]
    plain = {"name": "views", "source": "pageviews", "key": ["page"], "aggregations": ["count"]}
    visits = {  # sessions of a user's events the table does not rename: a change re-cuts them
        "name": "visits",
        "source": "pageviews",
        "lookups": [{"table": "pages", "on": "page", "as": "p"}],
        "where": "COALESCE(p.section, 'none') <> 'renamed'",
        "key": ["user_id"],
        "aggregations": ["count"],
        "session": {"gap": "10m", "max_duration": "1h"},
        "windows": ["5m", "1h"],
        "grace": "2m",
    }
    metrics = [*LOOKUP_METRICS, {**plain, "windows": ["1m"], "grace": "2m"}, visits]
    world = reconfigured(
        platform,
        metrics=metrics,
        tables=[pages_table(tag)],
        spark=join_settings,
    )
    settings = world.settings
    assert _broadcast(spark, settings) == (join_settings == {})
    create_topics(settings)
    now = int(time.time() * 1000) // HOUR * HOUR
    start, mid, end = now - 3 * HOUR, now - 2 * HOUR, now - HOUR
    produce_table(settings, table_history(start, mid, end))
    # Events of two days before, first in every partition: a back-dated version recomputes
    # from its own UTC day on, and the history index says where that day's events begin.
    produce_raw(settings, [_page_one(f"old-{i}", start - 48 * HOUR + i) for i in range(12)])
    generated = produce_spec(settings, GeneratorSpec(start, end, 3000, seed=28))
    produce_raw(settings, integer_pages(mid))
    # Events just past the hour `end`, the newest: W ends up before `end` (grace 2m), so `end`
    # is a boundary of every window at or after W, where the rebuild index reaches.
    edge = [_page_one(f"edge-{i}", end + i * 5_000) for i in range(8)]
    produce_raw(settings, edge)
    run_id = queue(settings, RunRequest("full"))
    execute_run(settings, spark, run_id)
    assert run_record(settings, run_id).status == "succeeded"
    assert oracle_mismatches(settings, world.config) == []
    served, _ = served_view(settings)
    assert served is not None and served.history_index is not None
    days = {
        day
        for pairs in served.history_index[settings.sources[0].topic].values()
        for day, _ in pairs
    }
    assert len(days) >= 2  # the old events' day and the others'

    records = [
        *oracle.read_topic(settings.kafka.bootstrap_servers, settings.sources[0].topic),
        *oracle.read_topic(settings.kafka.bootstrap_servers, settings.tables[0].topic),
    ]
    expected = oracle.compute(world.config, records)
    sections = {c[3] for c in expected.cells if c[0] == "views_by_section"}
    assert {("news",), ("world",), ("sport",), ("second",), ("seven",), ("none",)} <= sections
    assert ("first",) not in sections and ("later",) not in sections
    assert expected.table_malformed == {"pages": 3}

    # A back-dated version arriving after the events it applies to: the next incremental run
    # recomputes every cell from its valid-from time on.
    produce_table(settings, back_dated(start, mid))
    run_id = queue(settings, RunRequest("incremental"))
    execute_run(settings, spark, run_id)
    record = run_record(settings, run_id)
    assert record.status == "succeeded" and record.executed_mode == "incremental"
    assert oracle_mismatches(settings, world.config) == []
    records += oracle.read_topic(settings.kafka.bootstrap_servers, settings.tables[0].topic)[-2:]
    after = oracle.compute(world.config, records)
    renamed = {c[3] for c in after.cells if c[0] == "views_by_section"}
    assert ("renamed",) in renamed and ("news",) not in renamed and ("world",) not in renamed

    # A version valid after W, with new events and copies of events counted before (one
    # re-read with its copy, one before the re-read offsets): only the cells from `end` on
    # are recomputed, every event counted once.
    produce_table(settings, [table_version("/page/1", end + 12_000, section="edge")])
    copy = (generated[0].key, generated[0].value)
    produce_raw(settings, [edge[1], copy, _page_one("edge-new", end + 50_000)])
    run_id = queue(settings, RunRequest("incremental"))
    execute_run(settings, spark, run_id)
    record = run_record(settings, run_id)
    assert record.status == "succeeded" and record.executed_mode == "incremental"
    assert oracle_mismatches(settings, world.config) == []

    # A version valid from a minute past an hour, no new event: `visits` takes /page/1's
    # events (renamed until then) back from then on, so the sessions they join, which began
    # up to max_duration earlier, before that hour, are cut again.
    produce_table(settings, [table_version("/page/1", end - HOUR + MINUTE, section="back")])
    run_id = queue(settings, RunRequest("incremental"))
    execute_run(settings, spark, run_id)
    record = run_record(settings, run_id)
    assert record.status == "succeeded" and record.executed_mode == "incremental"
    assert oracle_mismatches(settings, world.config) == []
    _, cells = served_view(settings)
    edge_cells = {c: cell.count for c, cell in cells.items() if c[3] == ("edge",)}
    assert sum(n for c, n in edge_cells.items() if c[1] == HOUR) == 6  # edge-3..7, edge-new

    # No table change: the next incremental run stays incremental.
    run_id = queue(settings, RunRequest("incremental"))
    execute_run(settings, spark, run_id)
    assert run_record(settings, run_id).executed_mode == "incremental"
    assert oracle_mismatches(settings, world.config) == []
