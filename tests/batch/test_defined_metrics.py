"""A full run of metrics with `where` and `fields` (rule 10 in docs/semantics.md) against the
brute-force oracle, which evaluates the expressions with DuckDB (not the project's code): the
sample history plus events built to hit every way an expression or an input can fail."""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests import oracle
from tests.batch.helpers import (
    HOUR,
    full_run_of,
    oracle_mismatches,
)
from tests.conftest import Platform

pytestmark = [pytest.mark.services, pytest.mark.timeout(600)]

METRICS: list[dict[str, Any]] = [
    {
        "name": "slow_by_country",
        "source": "pageviews",
        "fields": {
            "bucket": "CASE WHEN latency_ms < 50 THEN 'fast' WHEN latency_ms < 100 THEN 'ok' "
            "ELSE 'slow' END",
            "latency_s": "latency_ms / 1000",
            "local_hour": "hour(ts, 'Europe/Berlin')",
        },
        "where": "latency_ms >= 20 AND page NOT LIKE '/page/1%'",
        "key": ["geo.country", "bucket"],
        "value": "latency_s",
        "aggregations": ["count", "sum", "min", "max", "distinct(user_id)", "quantiles(latency_s)"],
        "windows": ["1m", "1h"],
        "grace": "2m",
    },
    {
        "name": "by_local_hour",
        "source": "pageviews",
        "fields": {
            "local_hour": "hour(ts, 'America/New_York')",
            "day": "date(ts, 'Asia/Kolkata')",
            "cents": "CAST(round(latency_ms * 100) AS BIGINT)",
            "user": "upper(substr(user_id, 1, 2))",
        },
        "key": ["local_hour", "day"],
        "value": "cents",
        "aggregations": ["count", "sum", "max", "distinct(user)"],
        "windows": ["1h"],
        "grace": "2m",
    },
]


def _hostile(ts: int) -> list[tuple[bytes, bytes]]:
    """Events on which expressions fail in every way the language defines (each yields its
    documented value: a NULL, a skip, a filtered event), and nested fields of every shape."""
    base = {"page": "/x", "user_id": "u1", "latency_ms": 120.0, "geo": {"country": "de"}}
    variants: list[dict[str, Any]] = [
        {"latency_ms": "120"},  # text where a number is wanted: filtered (NULL comparison)
        {"latency_ms": None},
        {"latency_ms": True},
        {"latency_ms": 1e300},  # 1e300 * 100 is finite; round and CAST: NULL cents
        {"latency_ms": 2**70},  # beyond 64 bits: a DOUBLE
        {"latency_ms": -0.0},
        {"geo": {"country": 7}},  # an integer dimension: "7"
        {"geo": {"country": None}},  # key_invalid
        {"geo": "de"},  # a path through a text: missing
        {"geo": {"country": "d\u0000e"}},  # NUL: key_invalid
        {"geo": {"country": "é" * 600}},  # over 1,024 bytes: key_too_long
        {"geo": {"country": {"nested": 1}}},
        {"user_id": 12345},  # substr of a number: NULL, a skipped distinct field
        {"user_id": "日本語"},
        {"page": "/page/17"},  # NOT LIKE: filtered
        {"page": None},  # NOT (NULL LIKE ...) is NULL: filtered
    ]
    return [
        (
            f"h{i}".encode(),
            json.dumps({**base, **variant, "ts": ts + i, "event_id": f"h{i}"}).encode(),
        )
        for i, variant in enumerate(variants)
    ]


def test_a_full_run_of_defined_metrics_equals_the_oracle(platform: Platform, spark: Any) -> None:
    world, record, _ = full_run_of(
        platform, spark, METRICS, lambda now: _hostile(now - 2 * HOUR), seed=27
    )
    settings = world.settings
    assert oracle_mismatches(settings, world.config) == []
    records = oracle.read_topic(settings.kafka.bootstrap_servers, settings.sources[0].topic)
    expected = oracle.compute(world.config, records)
    assert record.skipped == {m: n for m, n in expected.skipped.items() if n}
    assert expected.skipped["slow_by_country"] >= 6, "the hostile events skip"
    counted = sum(
        v["count"] for c, v in expected.cells.items() if c[0] == "slow_by_country" and c[1] == HOUR
    )
    assert 0 < counted < 3000, "the filter drops some events and keeps others"
