"""Hostile events against the real stack (issue #26): the issue's reproductions and a seeded
corpus of records real data and attackers produce (extreme numbers, NUL and control
characters, long strings, deep nesting, bytes that are not UTF-8) land between clean
history and the next run. Afterwards: no speed partition is stalled (every record applied, no
stall reported), every dead letter says what is wrong, the next incremental run succeeds and
moves W, both layers equal the oracle on every cell, and the API answers every query over the
hostile data without a 5xx, under a 2 GiB memory cap."""

from __future__ import annotations

import json
import random
import time
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest

from batch_layer import execute_run
from lambdactl.generator import GeneratorSpec, SampleRecord, generate, produce
from serving_layer.timefmt import format_time
from shared.db.runs import RunRequest
from shared.kafka import create_topics
from shared.speed_view import redis_client, stalled_partitions
from tests import oracle
from tests.batch.helpers import oracle_mismatches, queue, run_record, served_view
from tests.conftest import Platform
from tests.e2e.support import speed_mismatches_after_w
from tests.serving.api_process import running_api
from tests.speed.support import drain_with_worker, side_topic

pytestmark = [pytest.mark.services, pytest.mark.timeout(600)]

MINUTE = 60_000
HOSTILE_VALUES: list[Any] = [
    1.7e308,
    -1.7e308,
    2**63,
    -(2**63),
    2**63 - 1024,
    10**30,
    1e-320,
    -0.0,
    True,
    None,
    "a\x00b",
    "\x00",
    "\x01\x7f\u2028",
    "é" * 512,
    "é" * 513,
    "x" * 100_000,
    "日本" * 300,
    10**1000,
    {"deep": [[[[{"x": 1}]]]]},
    [],
    "",
    "1" * 19,
]
"""What the fuzzer puts in a field; the ones at a limit sit on both sides of it."""


def issue_reproductions(now: int) -> list[SampleRecord]:
    """The issue's table, rows 3-5: values whose sum overflows (same page, minute and
    partition; then +inf and -inf in one day), a NUL in a dimension, 100 KB ids and pages."""
    t = now - 20 * MINUTE
    random_page = "".join(random.Random(100).choices("ab", k=100_000))

    def event(event_id: str, ts: int, **fields: Any) -> bytes:
        base = {"ts": ts, "event_id": event_id, "page": "/max", "user_id": "u", "latency_ms": 1}
        return orjson.dumps({**base, **fields})

    return [
        SampleRecord(b"same", event("max-1", t, latency_ms=1.7e308)),
        SampleRecord(b"same", event("max-2", t + 1, latency_ms=1.7e308)),
        SampleRecord(b"max-3", event("max-3", t + MINUTE, latency_ms=1.7e308)),
        SampleRecord(b"min-1", event("min-1", t + 2 * MINUTE, latency_ms=-1.7e308)),
        SampleRecord(b"nul", event("nul-page", t, page="a\x00b")),
        SampleRecord(b"big-id", event("i" * 100_000, t)),
        SampleRecord(b"big-page", event("big-page", t, page=random_page)),
        SampleRecord(b"nul-id", event("id\x00", t)),
    ]


def fuzzed(now: int, count: int, seed: int) -> list[SampleRecord]:
    """Valid events with one to three fields replaced by hostile values, some of them mangled
    into bytes that are no longer JSON (cut, invalid UTF-8, nested 5,000 deep)."""
    rng = random.Random(seed)
    records = []
    ids: set[str] = set()
    for i in range(count):
        event: dict[str, Any] = {
            "ts": now - rng.randrange(2 * MINUTE, 25 * MINUTE),
            "event_id": f"fuzz-{i}",
            "page": rng.choice(["/", "/a", "/b"]),
            "user_id": f"u{rng.randrange(50)}",
            "latency_ms": rng.uniform(1, 500),
        }
        for name in rng.sample(sorted(event), rng.randint(1, 3)):
            event[name] = rng.choice(HOSTILE_VALUES)
        if json.dumps(event["event_id"]) in ids:  # a copy of an id is a retry: same payload
            event["event_id"] = f"fuzz-{i}"
        ids.add(json.dumps(event["event_id"]))
        value = json.dumps(event, ensure_ascii=rng.random() < 0.5).encode()
        mangle = rng.random()
        if mangle < 0.05:
            value = value[: rng.randrange(len(value))]
        elif mangle < 0.1:
            at = rng.randrange(len(value))
            value = value[:at] + bytes([rng.choice([0x00, 0x80, 0xC3, 0xFF])]) + value[at:]
        elif mangle < 0.12:
            value = value[:-1] + b', "nest": ' + b"[" * 5000 + b"]" * 5000 + b"}"
        records.append(SampleRecord(f"fuzz-{i}".encode(), value))
    return records


def test_hostile_records_neither_stall_nor_fail_nor_corrupt(
    platform: Platform, spark: Any, tmp_path: Path
) -> None:
    settings = platform.settings
    source = settings.sources[0]
    bootstrap = settings.kafka.bootstrap_servers
    create_topics(settings)
    now = int(time.time() * 1000) // MINUTE * MINUTE
    history = GeneratorSpec(now - 90 * MINUTE, now - 30 * MINUTE, 3000, seed=3)
    produce(bootstrap, source.topic, generate(history))
    first = queue(settings, RunRequest("full"))
    execute_run(settings, spark, first)
    assert run_record(settings, first).status == "succeeded"
    before, _ = served_view(settings)
    assert before is not None

    hostile = issue_reproductions(now) + fuzzed(now, 400, seed=26)
    produce(bootstrap, source.topic, iter(hostile))
    produce(bootstrap, source.topic, generate(GeneratorSpec(now - 25 * MINUTE, now, 1000, seed=4)))
    records = oracle.read_topic(bootstrap, source.topic)
    drain_with_worker(platform, tmp_path / "speed.log")  # every record applied: nothing stalled
    assert stalled_partitions(redis_client(settings.redis)) == {}
    mismatches = speed_mismatches_after_w(platform, records)
    assert mismatches == [], "\n".join(mismatches)

    expected = oracle.compute(platform.config, records, late_rule=True)
    malformed = sum(expected.malformed.values())
    dead = side_topic(platform, ".dlq")
    assert len(dead) == malformed >= 60
    for _, _, headers in dead:
        assert headers["reason"] != "unprocessable", headers
        field = {"time": "'ts'", "id": "'event_id'"}.get(headers["reason"].split("_")[0])
        assert field is None or field in headers["detail"], headers

    second = queue(settings, RunRequest("incremental"))
    execute_run(settings, spark, second)
    run = run_record(settings, second)
    assert run.status == "succeeded", run.error
    after, _ = served_view(settings)
    assert after is not None
    for metric in ("views_by_page", "views_total"):
        assert after.watermarks[metric] > before.watermarks[metric], "W did not move"
    assert oracle_mismatches(settings, platform.config) == []

    day = {"start": format_time(now - 120 * MINUTE), "end": format_time(now + MINUTE)}
    queries = [
        ("series", {"window": "1d", **day}),
        ("series", {"window": "1h", **day, "group_by": "page"}),
        ("series", {"window": "1m", **day, "page": "/max"}),
        ("top", {"window": "1d", "at": day["start"], "by": "count"}),
        ("top", {"window": "1h", "at": format_time(now - 20 * MINUTE), "by": "sum"}),
        ("top", {"window": "1h", "at": format_time(now - 20 * MINUTE), "by": "p99"}),
        ("keys", {**day, "prefix": "/"}),
    ]
    log = tmp_path / "serve.log"
    with (
        running_api(platform.env, log, capped=True) as (base, process),
        httpx.Client(base_url=base, timeout=60) as client,
    ):
        for route, params in queries:
            response = client.get(f"/v1/metrics/views_by_page/{route}", params=params)
            assert response.status_code == 200, (route, params, response.text)
            assert b"Infinity" not in response.content and b"NaN" not in response.content
        assert process.poll() is None and "Traceback" not in log.read_text()
