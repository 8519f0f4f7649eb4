"""Rule 2 and rule 4 with a real broker and Redis: late, out-of-order and duplicate events."""

from __future__ import annotations

import socket
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from lambdactl.generator import GeneratorSpec, generate, produce
from shared.kafka import create_topics
from tests import oracle
from tests.conftest import Platform
from tests.speed.support import (
    expected_base_cells,
    late_counts,
    side_topic,
    speed_cells,
    start_worker,
    stop_worker,
    wait_until_applied,
    with_speed,
)

pytestmark = [pytest.mark.services, pytest.mark.timeout(180)]

MINUTE = 60_000


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_cells_equal_oracle_over_non_late_events(platform: Platform, tmp_path: Path) -> None:
    port = free_port()
    platform = with_speed(platform, cleanup_interval_s=3600.0, metrics_port=port)
    settings = platform.settings
    source = settings.sources[0]
    bootstrap = settings.kafka.bootstrap_servers
    create_topics(settings)
    now = int(time.time() * 1000) // MINUTE * MINUTE
    spec = GeneratorSpec(now - 40 * MINUTE, now, 6000, late_fraction=0.05, seed=11)
    produce(bootstrap, source.topic, generate(spec))
    worker = start_worker(platform, tmp_path / "worker.log")
    try:
        wait_until_applied(platform, workers=[worker])
        produce(
            bootstrap, source.topic, generate(GeneratorSpec(now - 5 * MINUTE, now, 1500, seed=12))
        )
        wait_until_applied(platform, workers=[worker])
        exposed = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read()
    finally:
        assert stop_worker(worker) == 0

    records = oracle.read_topic(bootstrap, source.topic)
    want, result = expected_base_cells(platform, records)
    assert oracle.compare(want, speed_cells(platform)) == []
    assert sum(result.late.values()) > 0 and result.duplicates > 0
    assert late_counts(platform) == {m: n for m, n in result.late.items() if n}
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(exposed.decode())
        for s in family.samples
    }
    for metric, n in result.late.items():
        assert samples[("speed_late_events_total", (("metric", metric),))] == n
    assert samples[("speed_duplicates_dropped_total", (("topic", source.topic),))] == (
        result.duplicates
    )
    assert samples[("speed_events_total", (("topic", source.topic),))] == len(records)

    by_offset = {(r.partition, r.offset): r.value for r in records}
    late: list[tuple[str, Any, dict[str, str]]] = side_topic(platform, ".late")
    assert len({key for key, _, _ in late}) == len(late), "a late event was published twice"
    for key, value, _ in late:
        topic, partition, offset = key.rsplit(":", 2)
        assert topic == source.topic
        assert by_offset[(int(partition), int(offset))] == value
