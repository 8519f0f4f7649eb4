"""The whole path once, with the real services: produce → batch run (Spark → PostgreSQL) →
speed worker (Faust → Redis) → GET /series, compared with the brute-force oracle."""

from __future__ import annotations

import time
from typing import Any

import pytest
from fastapi.testclient import TestClient

from batch_layer import run_full
from lambdactl.generator import GeneratorSpec, generate, produce
from serving_layer import create_app
from serving_layer.timefmt import format_time
from shared.db.connect import connect
from shared.db.runs import RunRequest, queue_run
from shared.db.served import read_served
from shared.kafka import create_topics
from tests import oracle
from tests.conftest import Platform
from tests.speed.support import drain_with_worker

pytestmark = [pytest.mark.services, pytest.mark.timeout(600)]

MINUTE = 60_000


def expected_point(
    metric: str,
    window_ms: int,
    start: int,
    key: tuple[str, ...],
    watermark: int,
    batch_cells: dict[Any, Any],
    speed_cells: dict[Any, Any],
) -> dict[str, Any] | None:
    cell = (metric, window_ms, start, key)
    if start + window_ms <= watermark:
        return batch_cells.get(cell)
    assert start >= watermark, "1m cells never straddle W"
    return speed_cells.get(cell)


def test_merged_series_equals_oracle_across_batch_and_speed(platform: Platform, spark: Any) -> None:
    settings = platform.settings
    source = settings.sources[0]
    bootstrap = settings.kafka.bootstrap_servers
    create_topics(settings)
    now = int(time.time() * 1000) // MINUTE * MINUTE
    history = GeneratorSpec(
        now - 150 * MINUTE, now - 40 * MINUTE, 6000, malformed_fraction=0.01, seed=1
    )
    produce(bootstrap, source.topic, generate(history))

    with connect(settings.postgres.url, autocommit=True) as conn:
        run_id = queue_run(conn, RunRequest("full"))[0]
    summary = run_full(settings, spark, run_id)
    assert summary.malformed > 0
    with connect(settings.postgres.url, autocommit=True) as conn:
        served = read_served(conn)
        status = conn.execute("SELECT status FROM batch_runs WHERE id = %s", [run_id]).fetchone()
    assert served is not None and status == ("succeeded",)
    history_records = oracle.read_topic(bootstrap, source.topic)

    live = GeneratorSpec(now - 35 * MINUTE, now, 3000, seed=2)
    produce(bootstrap, source.topic, generate(live))
    drain_with_worker(platform, platform.config_path.with_name("speed.log"))
    all_records = oracle.read_topic(bootstrap, source.topic)

    watermarks = {m: served.watermarks[m] for m in ("views_by_page", "views_total")}
    batch_cells = oracle.compute_cells(platform.config, history_records)
    speed_cells = oracle.compute_cells(
        platform.config, all_records, late_rule=True, watermarks=watermarks
    )
    start, end = now - 180 * MINUTE, now + MINUTE
    sources_seen: set[str] = set()
    mismatches: list[str] = []
    with TestClient(create_app(settings)) as client:
        for metric, key_params in [
            ("views_total", {}),
            ("views_by_page", {"page": "/"}),
            ("views_by_page", {"page": "/page/3"}),
        ]:
            response = client.get(
                f"/v1/metrics/{metric}/series",
                params={
                    "window": "1m",
                    "start": format_time(start),
                    "end": format_time(end),
                    **key_params,
                },
            )
            assert response.status_code == 200, response.text
            body = response.json()
            assert body["batch_watermark"] == format_time(watermarks[metric])
            assert body["speed_status"] == "ok"
            key = tuple(key_params.values())
            got = {p["start"]: p for p in body["points"]}
            for window_start in range(start, end, MINUTE):
                want = expected_point(
                    metric, MINUTE, window_start, key, watermarks[metric], batch_cells, speed_cells
                )
                point = got.pop(format_time(window_start), None)
                if want is None:
                    if point is not None:
                        mismatches.append(f"{metric}{key} {window_start}: unexpected {point}")
                    continue
                if point is None:
                    mismatches.append(f"{metric}{key} {window_start}: missing, want {want}")
                    continue
                sources_seen.add(point["source"])
                fields = {k: v for k, v in point.items() if k not in ("start", "end", "source")}
                mismatches += oracle.compare(
                    {(metric, MINUTE, window_start, key): want},
                    {(metric, MINUTE, window_start, key): fields},
                )
            assert not got, f"points outside the requested range: {list(got)}"
    assert mismatches == []
    assert sources_seen == {"batch", "speed"}
