"""The de-dup horizon (rule 4 in docs/semantics.md, "The de-dup horizon") with real Spark runs:
copies a partition's stream time has passed by more than the horizon count again, nearer
ones do not — within one read, and against the ids an earlier run remembered — and every
served cell equals the oracle, which applies the same rule. The id table forgets whole days
once every partition has passed them by the horizon, and a full run publishes what the
incremental runs did."""

from __future__ import annotations

import time
from typing import Any

import orjson
import pytest

from batch_layer import execute_run
from lambdactl.generator import GeneratorSpec, SampleRecord
from shared.db.connect import connect
from shared.db.runs import RunRequest
from shared.kafka import create_topics
from tests import oracle
from tests.batch.helpers import (
    DAY,
    HOUR,
    MINUTE,
    oracle_mismatches,
    produce_raw,
    produce_spec,
    queue,
    run_record,
    same_cells,
    served_view,
    snapshot_records,
)
from tests.conftest import Platform, reconfigured

pytestmark = [pytest.mark.services, pytest.mark.timeout(400)]

HORIZON = 30 * MINUTE


def _by_time(records: list[SampleRecord]) -> list[SampleRecord]:
    def ts(record: SampleRecord) -> int:
        value = orjson.loads(record.value)
        return value["ts"] if isinstance(value, dict) and isinstance(value.get("ts"), int) else 0

    return sorted((r for r in records if ts(r)), key=ts)


def _run(settings: Any, mode: str, spark: Any) -> str:
    run_id = queue(settings, RunRequest(mode))  # type: ignore[arg-type]
    execute_run(settings, spark, run_id)
    record = run_record(settings, run_id)
    assert record.status == "succeeded", record.error
    assert record.executed_mode is not None
    return record.executed_mode


def _remembered(settings: Any) -> tuple[set[tuple[Any, ...]], list[str]]:
    """(the remembered ids a later copy can still be a duplicate of, the day tables)."""
    served, _ = served_view(settings)
    assert served is not None
    times = served.stream_times[settings.sources[0].topic]
    with connect(settings.postgres.url, autocommit=True) as conn:
        rows = conn.execute(
            'SELECT source, partition, event_id, "offset", time_ms FROM horizon_ids'
        ).fetchall()
        tables = conn.execute(
            "SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid "
            "WHERE i.inhparent = 'horizon_ids'::regclass ORDER BY 1"
        ).fetchall()
    live = {r for r in rows if r[4] >= times[str(r[1])] - HORIZON}
    return live, [name for (name,) in tables]


def _counted(config: dict[str, Any], settings: Any, horizon: str | None) -> int:
    served, _ = served_view(settings)
    assert served is not None
    sources = [{**config["sources"][0], "dedup_horizon": horizon}]
    every = oracle.compute_cells(config | {"sources": sources}, snapshot_records(settings, served))
    return sum(
        int(v["count"]) for (m, w, _s, _k), v in every.items() if m == "views_total" and w == MINUTE
    )


def test_copies_past_the_horizon_count_again_in_full_and_incremental_runs(
    platform: Platform, spark: Any
) -> None:
    source = {**platform.config["sources"][0], "dedup_horizon": "30m"}
    world = reconfigured(platform, sources=[source])
    settings, config = world.settings, world.config
    create_topics(settings)
    now = _now()
    first = _by_time(
        produce_spec(
            settings,
            GeneratorSpec(now - 2 * DAY - 3 * HOUR, now - 2 * DAY - HOUR, 2000, seed=61),
        )
    )
    # copies of the earliest events (2 h behind their partitions: they count again) and of
    # the latest (within 30 min: duplicates)
    produce_raw(settings, [(r.key, r.value) for r in first[:60] + first[-60:]])
    assert _run(settings, "full", spark) == "full"
    assert oracle_mismatches(settings, config) == []
    assert _counted(config, settings, "30m") >= _counted(config, settings, None) + 50
    _, tables_before = _remembered(settings)
    assert tables_before, "the full run remembers the ids within the horizon"

    # Copies of the first history's latest events before anything newer (their partitions'
    # stream times have not moved: duplicates of ids the full run remembered), the next
    # two days' events, the same copies again (now two days behind: they count again), and
    # copies of the new events' latest (duplicates within the read).
    latest = [(r.key, r.value) for r in first[-60:]]
    produce_raw(settings, latest)
    second = _by_time(
        produce_spec(settings, GeneratorSpec(now - 3 * HOUR, now - HOUR, 1500, seed=62))
    )
    produce_raw(settings, latest + [(r.key, r.value) for r in second[-60:]])
    assert _run(settings, "incremental", spark) == "incremental"
    assert oracle_mismatches(settings, config) == []
    incremental_ids, tables_after = _remembered(settings)
    assert not set(tables_before) & set(tables_after), "days past the horizon are dropped"
    _, incremental_cells = served_view(settings)

    assert _run(settings, "full", spark) == "full"
    full_ids, _ = _remembered(settings)
    _, full_cells = served_view(settings)
    assert same_cells(incremental_cells, full_cells) == []
    assert incremental_ids == full_ids and full_ids


def _now() -> int:
    return int(time.time() * 1000) // MINUTE * MINUTE
