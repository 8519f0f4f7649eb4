"""The batch layer's session pass (rule 13 in docs/semantics.md, `batch_layer.sessions`) on
Spark: every row's session equals the oracle's brute-force sessionization of its (metric,
key), with keys spread over tasks and Arrow batches of a few rows, so a key's rows cross batch
boundaries, and keys whose dimensions join to nearly the same text."""

from __future__ import annotations

import random
from collections import defaultdict
from typing import Any

import pytest
from pyspark.sql.types import ArrayType, LongType, StringType, StructField, StructType

from batch_layer.sessions import SESSION_COLUMN, with_sessions
from shared.sessions import SessionRule
from tests.batch.helpers import spark_conf
from tests.oracle import sessionize

pytestmark = pytest.mark.services

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
    assert set(result[0].asDict()) == {"metric", "key", "time_ms", "value", SESSION_COLUMN}
    times: dict[tuple[str, tuple[str, ...]], list[int]] = defaultdict(list)
    for metric, key, time_ms, _ in rows:
        times[metric, tuple(key)].append(time_ms)
    expected: dict[tuple[str, tuple[str, ...], int], int] = {}
    for (metric, key), group in times.items():
        rule = RULES[metric]
        for session in sessionize(group, rule.gap_ms, rule.max_duration_ms):
            for t in group:
                if session.first <= t <= session.last:
                    expected[metric, key, t] = session.first
    got = {(r.metric, tuple(r.key), r.time_ms): r[SESSION_COLUMN] for r in result}
    assert got == expected
    busy = {v for (metric, key, _), v in got.items() if key == ("busy",)}
    assert busy == set(range(0, 1_000_000, 120_000))
