"""The whole path with a de-dup horizon and retention configured (#30): produce (with copies
re-sent within and past the horizon) → full run → speed worker → GET /series, then an
incremental run, compared with the oracle, which applies both rules. Copies past the horizon
count again in the batch view and are late for the speed layer; 1m cells past retention are
absent (the API refuses them) while the 1h series over the same range stays exact."""

from __future__ import annotations

import time
from typing import Any

import orjson
import pytest
from fastapi.testclient import TestClient

from batch_layer import execute_run
from lambdactl.generator import GeneratorSpec, SampleRecord, generate, produce
from serving_layer import create_app
from serving_layer.timefmt import format_time
from shared.config import Settings
from shared.db.runs import RunRequest
from shared.kafka import create_topics
from tests import oracle
from tests.batch.helpers import queue, run_record, served_view
from tests.conftest import Platform, reconfigured
from tests.e2e.test_walking_skeleton import expected_point
from tests.speed.support import drain_with_worker

pytestmark = [pytest.mark.services, pytest.mark.timeout(600)]

MINUTE = 60_000
HOUR = 60 * MINUTE
KEYS: list[dict[str, str]] = [{}, {"page": "/"}, {"page": "/page/3"}]


def _resent(records: list[SampleRecord], first: int, last: int) -> list[SampleRecord]:
    """Copies of the `first` earliest and `last` latest events (by event time)."""
    timed = sorted(
        (r for r in records if isinstance(orjson.loads(r.value), dict)),
        key=lambda r: orjson.loads(r.value).get("ts", 0),
    )
    return timed[:first] + timed[-last:]


def _series(client: TestClient, metric: str, window: str, start: int, end: int, **key: str) -> Any:
    params = {"window": window, "start": format_time(start), "end": format_time(end), **key}
    return client.get(f"/v1/metrics/{metric}/series", params=params)


def _run(settings: Settings, spark: Any, mode: str) -> None:
    run_id = queue(settings, RunRequest(mode))  # type: ignore[arg-type]
    execute_run(settings, spark, run_id)
    record = run_record(settings, run_id)
    assert record.status == "succeeded" and record.executed_mode == mode, record.error


def _metric_of(key: dict[str, str]) -> str:
    return "views_by_page" if key else "views_total"


def test_horizon_and_retention_across_batch_speed_and_the_api(
    platform: Platform, spark: Any
) -> None:
    source = {**platform.config["sources"][0], "dedup_horizon": "20m"}
    metrics = [{**m, "retention": {"1m": "60m"}} for m in platform.config["metrics"]]
    world = reconfigured(platform, sources=[source], metrics=metrics)
    settings, config = world.settings, world.config
    bootstrap, topic = settings.kafka.bootstrap_servers, settings.sources[0].topic
    create_topics(settings)
    now = int(time.time() * 1000) // MINUTE * MINUTE
    history = list(generate(GeneratorSpec(now - 150 * MINUTE, now - 40 * MINUTE, 4000, seed=71)))
    produce(bootstrap, topic, iter(history + _resent(history, 40, 40)))
    _run(settings, spark, "full")
    served, _ = served_view(settings)
    assert served is not None
    history_records = oracle.read_topic(bootstrap, topic)

    live = list(generate(GeneratorSpec(now - 35 * MINUTE, now, 2000, seed=72)))
    produce(bootstrap, topic, iter(live + _resent(live, 40, 40)))
    drain_with_worker(world, world.config_path.with_name("speed.log"))
    records = oracle.read_topic(bootstrap, topic)

    without_horizon = {**config, "sources": [platform.config["sources"][0]]}
    assert _total(config, history_records) >= _total(without_horizon, history_records) + 30, (
        "copies past the horizon count again"
    )
    watermarks = {m: served.watermarks[m] for m in ("views_by_page", "views_total")}
    batch_cells = oracle.compute_cells(config, history_records)
    speed_cells = oracle.compute_cells(config, records, late_rule=True, watermarks=watermarks)
    mismatches: list[str] = []
    with TestClient(create_app(settings)) as client:
        for key in KEYS:
            metric = _metric_of(key)
            w = watermarks[metric]
            start = w - 50 * MINUTE
            answer = _series(client, metric, "1m", start, now + MINUTE, **key)
            assert answer.status_code == 200, answer.text
            got = {p["start"]: p for p in answer.json()["points"]}
            for at in range(start, now + MINUTE, MINUTE):
                want = expected_point(
                    metric, MINUTE, at, tuple(key.values()), w, batch_cells, speed_cells
                )
                mismatches += _compare(
                    metric, MINUTE, at, key, want, got.pop(format_time(at), None)
                )
            refused = _series(client, metric, "1m", w - 2 * HOUR, w, **key)
            assert refused.status_code == 400 and "keeps its 1m cells" in refused.text
    assert mismatches == []

    _run(settings, spark, "incremental")
    served, _ = served_view(settings)
    assert served is not None
    everything = oracle.compute_cells(config, oracle.read_topic(bootstrap, topic))
    with TestClient(create_app(settings)) as client:
        for key in KEYS:
            metric = _metric_of(key)
            w = served.watermarks[metric]
            first_hour = now - 3 * HOUR - (now - 3 * HOUR) % HOUR
            hours = _series(client, metric, "1h", first_hour, w - w % HOUR, **key)
            assert hours.status_code == 200, hours.text
            got = {p["start"]: p for p in hours.json()["points"]}
            for at in range(first_hour, w - w % HOUR, HOUR):
                want = everything.get((metric, HOUR, at, tuple(key.values())))
                mismatches += _compare(metric, HOUR, at, key, want, got.pop(format_time(at), None))
            minutes = _series(client, metric, "1m", w - 50 * MINUTE, w, **key)
            got = {p["start"]: p for p in minutes.json()["points"]}
            for at in range(w - 50 * MINUTE, w, MINUTE):
                want = everything.get((metric, MINUTE, at, tuple(key.values())))
                mismatches += _compare(
                    metric, MINUTE, at, key, want, got.pop(format_time(at), None)
                )
    assert mismatches == []


def _total(config: dict[str, Any], records: list[oracle.Record]) -> int:
    cells = oracle.compute_cells(config, records)
    return sum(
        int(v["count"]) for (m, w, _s, _k), v in cells.items() if m == "views_total" and w == MINUTE
    )


def _compare(
    metric: str, window: int, at: int, key: dict[str, str], want: Any, point: Any
) -> list[str]:
    if want is None:
        return [] if point is None else [f"{metric}{key} {at}: unexpected {point}"]
    if point is None:
        return [f"{metric}{key} {at}: missing, want {want}"]
    fields = {k: v for k, v in point.items() if k not in ("start", "end", "source")}
    cell = (metric, window, at, tuple(key.values()))
    return oracle.compare({cell: want}, {cell: fields})
