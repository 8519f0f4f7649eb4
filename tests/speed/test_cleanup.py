"""Rule 8: once a W has been served for `cleanup_delay_s`, the worker deletes its cells ending
at or before it (and de-dup sets late for every metric); cells after W stay exact."""

from __future__ import annotations

import time
from pathlib import Path

import orjson
import pytest

from lambdactl.generator import GeneratorSpec, generate, produce
from shared.db.connect import connect
from shared.kafka import create_topics
from shared.metric_plan import versions_of
from shared.speed_view import redis_client
from shared.speed_view.keys import ids_of_key, ids_pattern
from tests import oracle
from tests.conftest import Platform
from tests.speed.support import (
    expected_base_cells,
    speed_cells,
    start_worker,
    stop_worker,
    wait_until_applied,
    with_speed,
)

pytestmark = [pytest.mark.services, pytest.mark.timeout(180)]

MINUTE = 60_000


def test_cells_at_or_before_a_served_w_are_deleted(platform: Platform, tmp_path: Path) -> None:
    platform = with_speed(
        platform, cleanup_delay_s=1.0, cleanup_interval_s=0.5, watermark_refresh_s=0.5
    )
    settings = platform.settings
    topic = settings.sources[0].topic
    bootstrap = settings.kafka.bootstrap_servers
    client = redis_client(settings.redis)
    create_topics(settings)
    now = int(time.time() * 1000) // MINUTE * MINUTE
    produce(bootstrap, topic, generate(GeneratorSpec(now - 30 * MINUTE, now, 4000, seed=51)))
    worker = start_worker(platform, tmp_path / "worker.log")
    try:
        wait_until_applied(platform, workers=[worker])
        before = speed_cells(platform)
        w = now - 15 * MINUTE
        assert any(start + size <= w for _, size, start, _ in before)
        versions = versions_of(settings.plans.values())
        with connect(settings.postgres.url, autocommit=True) as conn:
            conn.execute(
                "INSERT INTO served_view (id, generation, snapshot, watermarks, rebuild_from, "
                "versions) VALUES (1, 1, '{}', %s, '{}', %s)",
                [
                    orjson.dumps(dict.fromkeys(versions, w)).decode(),
                    orjson.dumps(versions).decode(),
                ],
            )
        deadline = time.monotonic() + 30
        while any(start + size <= w for _, size, start, _ in speed_cells(platform)):
            assert time.monotonic() < deadline, "cells at or before W were not deleted"
            time.sleep(0.25)
        assert worker.poll() is None
    finally:
        assert stop_worker(worker) == 0
    records = oracle.read_topic(bootstrap, topic)
    want, _ = expected_base_cells(platform, records)
    after_w = {c: v for c, v in want.items() if c[2] >= w}
    assert after_w and oracle.compare(after_w, speed_cells(platform)) == []
    for key in client.scan_iter(match=ids_pattern(topic)):
        _partition, bucket = ids_of_key(key.decode())
        assert bucket + MINUTE > w, f"de-dup set {key!r} outlived its cells"
