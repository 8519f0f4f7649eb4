"""Runs of metrics with lookups (rule 11 in docs/semantics.md) against the brute-force oracle,
which joins by the rule itself: a table that changes mid-stream, a back-dated version, two
versions valid from the same time, a deleted key (flag and tombstone), a key absent from the
table, an integer join key, invalid table records; then a back-dated update arriving after the
events it applies to, which the next run (asked for as incremental) recomputes."""

from __future__ import annotations

import time
from typing import Any

import pytest

from batch_layer import execute_run
from lambdactl.generator import GeneratorSpec
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
    table_history,
)
from tests.conftest import Platform, reconfigured

pytestmark = [pytest.mark.services, pytest.mark.timeout(600)]


def test_runs_join_tables_as_of_event_time(platform: Platform, spark: Any) -> None:
    tag = platform.config["sources"][0]["topic"]
    world = reconfigured(platform, metrics=LOOKUP_METRICS, tables=[pages_table(tag)])
    settings = world.settings
    create_topics(settings)
    now = int(time.time() * 1000) // MINUTE * MINUTE
    start, mid, end = now - 3 * HOUR, now - 2 * HOUR, now - HOUR
    produce_table(settings, table_history(start, mid, end))
    produce_spec(settings, GeneratorSpec(start, end, 3000, seed=28))
    produce_raw(settings, integer_pages(mid))
    run_id = queue(settings, RunRequest("full"))
    execute_run(settings, spark, run_id)
    assert run_record(settings, run_id).status == "succeeded"
    assert oracle_mismatches(settings, world.config) == []

    records = [
        *oracle.read_topic(settings.kafka.bootstrap_servers, settings.sources[0].topic),
        *oracle.read_topic(settings.kafka.bootstrap_servers, settings.tables[0].topic),
    ]
    expected = oracle.compute(world.config, records)
    sections = {c[3] for c in expected.cells if c[0] == "views_by_section"}
    assert {("news",), ("world",), ("sport",), ("second",), ("seven",), ("none",)} <= sections
    assert ("first",) not in sections and ("later",) not in sections
    assert expected.table_malformed == {"pages": 3}

    # A back-dated version arriving after the events it applies to: the next run, asked for
    # as incremental, runs full and recomputes every cell it changes.
    produce_table(settings, back_dated(start, mid))
    run_id = queue(settings, RunRequest("incremental"))
    execute_run(settings, spark, run_id)
    record = run_record(settings, run_id)
    assert record.status == "succeeded" and record.executed_mode == "full"
    assert oracle_mismatches(settings, world.config) == []
    records += oracle.read_topic(settings.kafka.bootstrap_servers, settings.tables[0].topic)[-2:]
    after = oracle.compute(world.config, records)
    renamed = {c[3] for c in after.cells if c[0] == "views_by_section"}
    assert ("renamed",) in renamed and ("news",) not in renamed and ("world",) not in renamed

    # No table change: the next incremental run stays incremental.
    run_id = queue(settings, RunRequest("incremental"))
    execute_run(settings, spark, run_id)
    assert run_record(settings, run_id).executed_mode == "incremental"
    assert oracle_mismatches(settings, world.config) == []
