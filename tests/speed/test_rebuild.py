"""Rule 9: Redis loses the speed view mid-stream (FLUSHDB); the worker notices the missing
epoch marker, rebuilds from `rebuild_from` (0: no batch run yet) and ends equal to the oracle."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import yaml

from lambdactl.generator import GeneratorSpec, generate, produce
from shared.config import Settings
from shared.kafka import create_topics
from shared.speed_view import EPOCH_KEY, REBUILDING_KEY, redis_client
from tests import oracle
from tests.conftest import Platform
from tests.speed.support import (
    expected_base_cells,
    speed_cells,
    start_worker,
    stop_worker,
    wait_for_log,
    wait_until_applied,
    with_speed,
)

pytestmark = [pytest.mark.services, pytest.mark.timeout(180)]

MINUTE = 60_000


def test_flushdb_mid_stream_rebuilds(platform: Platform, tmp_path: Path) -> None:
    platform = with_speed(platform, watermark_refresh_s=0.5, cleanup_interval_s=3600.0)
    settings = platform.settings
    topic = settings.sources[0].topic
    bootstrap = settings.kafka.bootstrap_servers
    client = redis_client(settings.redis)
    create_topics(settings)
    now = int(time.time() * 1000) // MINUTE * MINUTE
    produce(bootstrap, topic, generate(GeneratorSpec(now - 30 * MINUTE, now, 8000, seed=41)))
    log = tmp_path / "worker.log"
    worker = start_worker(platform, log)
    try:
        wait_until_applied(platform, workers=[worker])
        client.flushdb()
        seen_rebuilding = False
        deadline = time.monotonic() + 30
        while "event=rebuild_started" not in log.read_text():
            seen_rebuilding = seen_rebuilding or bool(client.scard(REBUILDING_KEY))
            assert time.monotonic() < deadline, "the worker never noticed the lost epoch"
            time.sleep(0.05)
        produce(bootstrap, topic, generate(GeneratorSpec(now - 5 * MINUTE, now, 2000, seed=42)))
        wait_until_applied(platform, workers=[worker])
    finally:
        assert stop_worker(worker) == 0
    records = oracle.read_topic(bootstrap, topic)
    want, _ = expected_base_cells(platform, records)
    assert oracle.compare(want, speed_cells(platform)) == []
    assert client.get(EPOCH_KEY) is not None


def test_changed_metric_definitions_rebuild_the_partitions(
    platform: Platform, tmp_path: Path
) -> None:
    settings = platform.settings
    topic = settings.sources[0].topic
    bootstrap = settings.kafka.bootstrap_servers
    create_topics(settings)
    now = int(time.time() * 1000) // MINUTE * MINUTE
    produce(bootstrap, topic, generate(GeneratorSpec(now - 30 * MINUTE, now, 4000, seed=43)))
    worker = start_worker(platform, tmp_path / "old.log")
    try:
        wait_until_applied(platform, workers=[worker])
    finally:
        assert stop_worker(worker) == 0

    metrics = [dict(m) for m in platform.config["metrics"]]
    metrics[1]["grace"] = "5m"
    config = {**platform.config, "metrics": metrics}
    path = tmp_path / "changed.yaml"
    path.write_text(yaml.safe_dump(config))
    changed = Platform(
        Settings(**config), config, path, {**platform.env, "LAMBDA_CONFIG": str(path)}
    )
    name = settings.metrics[1].name
    assert changed.settings.plans[name].version != settings.plans[name].version
    log = tmp_path / "new.log"
    worker = start_worker(changed, log)
    try:
        wait_for_log(log, "event=position")
        wait_until_applied(changed, workers=[worker])
    finally:
        assert stop_worker(worker) == 0
    assert "reason=metric_definitions" in log.read_text()
    records = oracle.read_topic(bootstrap, topic)
    want, _ = expected_base_cells(changed, records)
    assert oracle.compare(want, speed_cells(changed)) == []
