"""Sessions in the batch layer (rule 13 in docs/semantics.md) against the oracle's brute-force
sessionization: the pass on Spark (`batch_layer.sessions`), every row's session, with keys
spread over tasks and Arrow batches of a few rows, so a key's rows cross batch boundaries, and
keys whose dimensions join to nearly the same text; and a full run's cells of session metrics
and their parts beside a tumbling metric."""

from __future__ import annotations

import json
import random
from collections import defaultdict
from typing import Any

import pytest
from pyspark.sql.types import ArrayType, LongType, StringType, StructField, StructType

from batch_layer import execute_run, run_runner
from batch_layer.sessions import DURATION_COLUMN, SESSION_COLUMN, with_sessions
from lambdactl.generator import GeneratorSpec
from shared.db.connect import connect
from shared.db.runs import RunRequest, list_runs
from shared.db.sessions import boundary_sessions
from shared.sessions import Session, SessionRule
from tests import oracle
from tests.batch.helpers import (
    HOUR,
    MINUTE,
    full_run_of,
    oracle_mismatches,
    produce_raw,
    produce_spec,
    queue,
    run_record,
    served_view,
    snapshot_records,
    spark_conf,
)
from tests.conftest import Platform
from tests.oracle import sessionize

pytestmark = [pytest.mark.services, pytest.mark.timeout(600)]

RULES = {"visits": SessionRule(30_000, 120_000), "routes": SessionRule(5_000, 12_000)}
SCHEMA = StructType(
    [
        StructField("metric", StringType(), False),
        StructField("key", ArrayType(StringType()), False),
        StructField("time_ms", LongType(), False),
        StructField("value", LongType(), True),
    ]
)


def _rows(seed: int) -> list[tuple[str, list[str], int, int]]:
    chance = random.Random(seed)
    keys = [["u1"], ["u2"], ["a", "b"], ["a\x01b"], ["ab"], [""], ["é"]]
    rows = []
    for _ in range(1_500):
        metric = chance.choice(sorted(RULES))
        key = chance.choice(keys)
        # bursts (many events a few seconds apart) and pauses, out of order
        burst = chance.randrange(0, 40) * 60_000
        rows.append((metric, key, burst + chance.randrange(0, 200_000), chance.randrange(100)))
    rows += [("visits", ["busy"], t, 1) for t in range(0, 1_000_000, 1_000)]  # cut at max
    chance.shuffle(rows)
    return rows


@pytest.mark.parametrize("batch_rows", [5, 10_000])
def test_every_row_is_in_its_oracle_session(spark: Any, batch_rows: int) -> None:
    rows = _rows(batch_rows)
    frame = spark.createDataFrame(rows, SCHEMA).repartition(3)
    with spark_conf(spark, {"spark.sql.execution.arrow.maxRecordsPerBatch": str(batch_rows)}):
        result = with_sessions(frame, RULES, tasks=4).collect()
    assert len(result) == len(rows)
    assert set(result[0].asDict()) == {
        "metric",
        "key",
        "time_ms",
        "value",
        SESSION_COLUMN,
        DURATION_COLUMN,
    }
    times: dict[tuple[str, tuple[str, ...]], list[int]] = defaultdict(list)
    for metric, key, time_ms, _ in rows:
        times[metric, tuple(key)].append(time_ms)
    expected: dict[tuple[str, tuple[str, ...], int], int] = {}
    durations: dict[tuple[str, tuple[str, ...], int], list[int]] = {}
    for (metric, key), group in times.items():
        rule = RULES[metric]
        for session in sessionize(group, rule.gap_ms, rule.max_duration_ms):
            durations[metric, key, session.first] = [session.last - session.first]
            for t in group:
                if session.first <= t <= session.last:
                    expected[metric, key, t] = session.first
    got = {(r.metric, tuple(r.key), r.time_ms): r[SESSION_COLUMN] for r in result}
    assert got == expected
    given: dict[tuple[str, tuple[str, ...], int], list[int]] = defaultdict(list)
    for r in result:
        if r[DURATION_COLUMN] is not None:
            given[r.metric, tuple(r.key), r[SESSION_COLUMN]].append(r[DURATION_COLUMN])
    assert given == durations, "one row of each session carries its duration"
    busy = {v for (metric, key, _), v in got.items() if key == ("busy",)}
    assert busy == set(range(0, 1_000_000, 120_000))


SESSION_METRICS: list[dict[str, Any]] = [
    {
        "name": "visits",
        "source": "pageviews",
        "key": ["user_id"],
        "value": "latency_ms",
        "aggregations": ["count", "sum", "min", "max", "avg", "distinct(page)"],
        "session": {"gap": "5m", "max_duration": "30m"},
        "windows": ["5m", "1h"],
        "grace": "2m",
    },
    {
        "name": "country_visits",
        "source": "pageviews",
        "fields": {"slow": "CASE WHEN latency_ms >= 50 THEN 'slow' ELSE 'fast' END"},
        "where": "page <> '/'",
        "key": ["geo.country", "slow"],
        "aggregations": ["count", "quantiles(latency_ms)"],
        "session": {"gap": "1m", "max_duration": "20m"},
        "windows": ["1m", "1h"],
    },
    {
        "name": "views",
        "source": "pageviews",
        "key": ["page"],
        "aggregations": ["count", "distinct(user_id)"],
        "windows": ["1m", "1h"],
    },
]


def _bridging(ts: int, tag: str = "b") -> list[tuple[bytes, bytes]]:
    """One user's events: two sessions, then a late one between them that bridges them, a
    copy of it, and a run of events a minute apart that max_duration cuts."""
    times = [ts, ts + 60_000, ts + 9 * MINUTE, ts + 5 * MINUTE, ts + 5 * MINUTE]
    times += [ts + HOUR + i * MINUTE for i in range(45)]
    ids = [f"{tag}{i}" for i in range(len(times))]
    ids[4] = ids[3]  # the copy
    return [
        (
            event_id.encode(),
            json.dumps(
                {
                    "ts": t,
                    "event_id": event_id,
                    "page": "/b",
                    "user_id": "bridge",
                    "latency_ms": 60.0,
                    "geo": {"country": "nz"},
                }
            ).encode(),
        )
        for event_id, t in zip(ids, times, strict=True)
    ]


def test_a_full_run_of_session_metrics_equals_the_oracle(platform: Platform, spark: Any) -> None:
    world, _, now = full_run_of(
        platform, spark, SESSION_METRICS, lambda now: _bridging(now - 3 * HOUR), seed=29
    )
    settings = world.settings
    assert oracle_mismatches(settings, world.config) == []
    served, cells = served_view(settings)
    assert served is not None
    names = {cell[0] for cell in cells}
    assert {"visits", "visits(sessions)", "visits(bounces)", "country_visits(sessions)"} <= names
    bridge = [
        (cell, value)
        for cell, value in cells.items()
        if cell[0] == "visits(sessions)" and cell[3] == ("bridge",) and cell[1] == HOUR
    ]
    assert sum(value.count for _, value in bridge) == 3, "one bridged session, two cut at 30m"
    visits, views = settings.plan("visits"), settings.plan("views")
    assert visits is not None and views is not None
    w_visits = served.watermark(visits.name, visits.version)
    w_views = served.watermark(views.name, views.version)
    assert w_visits is not None and w_views is not None
    assert w_views - w_visits >= 31 * MINUTE, "a session metric's W lags by max_duration + grace"
    for part in ("visits(sessions)", "visits(bounces)"):
        plan = settings.plan(part)
        assert plan is not None
        assert served.watermark(part, plan.version) == w_visits, "a part's W is its metric's"

    # What the speed layer continues each key from: its last served session that may reach W.
    expected = oracle.compute_cells(world.config, snapshot_records(settings, served))
    seeds: dict[tuple[str, ...], Session] = {}
    longest = 30 * MINUTE
    for (name, size, start, key), values in sorted(expected.items()):
        if name == "visits(sessions)" and size == 0 and w_visits - longest <= start < w_visits:
            events = expected[("visits", 0, start, key)]["count"]
            seeds[key] = Session(start, start + int(values["max"]), events)
    sessions_part = settings.plan("visits(sessions)")
    assert sessions_part is not None and seeds
    with connect(settings.postgres.url) as conn:
        found = boundary_sessions(conn, served.generation, visits, sessions_part, w_visits)
    assert found == seeds

    # Incremental runs: late events bridging sessions of the served view (each key continued
    # from its last session starting max_duration before the earliest new event), then
    # events after the snapshot extending its last sessions; each equals the oracle.
    produce_raw(settings, _bridging(now - 3 * HOUR + 20 * MINUTE, "again"))
    for seed in (None, 31):
        if seed is not None:
            produce_spec(
                settings, GeneratorSpec(now - HOUR, now, 600, late_fraction=0.0, seed=seed)
            )
        again = queue(settings, RunRequest("incremental"))
        execute_run(settings, spark, again)
        assert run_record(settings, again).status == "succeeded"
        assert run_record(settings, again).executed_mode == "incremental"
        assert oracle_mismatches(settings, world.config) == []

    # A range would cut sessions at its bounds: the queue refuses one while a session metric
    # is configured, and one queued before (as the runner's own request is, unchecked) fails
    # with that reason, once (a retry would meet the same configuration), moving nothing.
    before, cells_before = served_view(settings)
    ranged = queue(settings, RunRequest("range", now - 2 * HOUR, now - HOUR))
    assert run_runner(settings, once=True, spark=spark, schedule=False) == 1
    failed = run_record(settings, ranged)
    assert failed.status == "failed" and failed.executed_mode is None, failed
    assert failed.error is not None
    for words in ("session metrics 'visits', 'country_visits'", "rule 13", '{"mode": "full"}'):
        assert words in failed.error, failed.error
    with connect(settings.postgres.url, autocommit=True) as conn:
        assert [r.id for r in list_runs(conn) if r.retry_of == ranged] == []
    after, cells_after = served_view(settings)
    assert after == before and cells_after == cells_before, "W and the cells stay as served"
