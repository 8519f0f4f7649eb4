"""`quantiles(latency_ms)` through both layers and the API, against the oracle's exact
quantiles: a full run serves the history, a speed worker the live events after W, and the API
answers 1m windows on both sides of W, the 1h window straddling W (batch cells merged with
speed sub-cells) and the 1d roll-up, plus `top?by=p99`. Every p-value must lie within the KLL
sketch's normalized rank error of the exact answer over the same events (rule 8's split)."""

from __future__ import annotations

import time
from typing import Any

import pytest
from fastapi.testclient import TestClient

from batch_layer import run_full
from lambdactl.generator import GeneratorSpec, generate, produce
from serving_layer import create_app
from serving_layer.timefmt import format_time, parse_time
from shared.db.connect import connect
from shared.db.runs import RunRequest, queue_run
from shared.db.served import read_served
from shared.kafka import create_topics
from tests import oracle
from tests.conftest import Platform
from tests.speed.support import drain_with_worker

pytestmark = [pytest.mark.services, pytest.mark.timeout(600)]

MINUTE, HOUR, DAY = 60_000, 3_600_000, 86_400_000
METRIC = "views_by_page"
QUANTILES = ("p50", "p90", "p99")


def _exact(
    window_ms: int,
    start: int,
    key: tuple[str, ...],
    watermark: int,
    batch_cells: dict[oracle.Cell, dict[str, Any]],
    speed_cells: dict[oracle.Cell, dict[str, Any]],
) -> tuple[int, dict[str, oracle.ExactQuantile]] | None:
    """Count and exact quantiles of a window composed as rule 8 composes it: base cells ending
    at or before W from the batch side, the rest from the speed side (their exact values
    pooled, never their quantiles averaged)."""
    values: list[float] = []
    count = 0
    for cell_start in range(start, start + window_ms, MINUTE):
        side = batch_cells if cell_start + MINUTE <= watermark else speed_cells
        cell = side.get((METRIC, MINUTE, cell_start, key))
        if cell is not None:
            count += cell["count"]
            values.extend(cell["p50"].values)
    if not count:
        return None
    return count, {
        name: oracle.ExactQuantile(q, values)
        for name, q in zip(QUANTILES, oracle.DEFAULT_QUANTILES, strict=True)
    }


def test_quantiles_match_exact_ones_across_w_and_the_daily_rollup(
    platform: Platform, spark: Any
) -> None:
    settings = platform.settings
    source = settings.sources[0]
    bootstrap = settings.kafka.bootstrap_servers
    create_topics(settings)
    now = int(time.time() * 1000) // MINUTE * MINUTE
    history = GeneratorSpec(now - 150 * MINUTE, now - 40 * MINUTE, 6000, seed=31)
    produce(bootstrap, source.topic, generate(history))
    with connect(settings.postgres.url, autocommit=True) as conn:
        run_id = queue_run(conn, RunRequest("full"))[0]
    run_full(settings, spark, run_id)
    with connect(settings.postgres.url, autocommit=True) as conn:
        served = read_served(conn)
    assert served is not None
    watermark = served.watermarks[METRIC]
    history_records = oracle.read_topic(bootstrap, source.topic)

    produce(bootstrap, source.topic, generate(GeneratorSpec(now - 35 * MINUTE, now, 3000, seed=32)))
    drain_with_worker(platform, platform.config_path.with_name("speed.log"))
    all_records = oracle.read_topic(bootstrap, source.topic)
    batch_cells = oracle.compute_cells(platform.config, history_records)
    speed_cells = oracle.compute_cells(
        platform.config, all_records, late_rule=True, watermarks={METRIC: watermark}
    )

    key = ("/",)
    checked: dict[str, int] = {}
    mismatches: list[str] = []
    with TestClient(create_app(settings)) as client:
        for window_ms, window, span in (
            (MINUTE, "1m", (now - 150 * MINUTE, now + MINUTE)),
            (HOUR, "1h", (now - 3 * HOUR, now + MINUTE)),
            (DAY, "1d", (now - DAY, now + MINUTE)),
        ):
            response = client.get(
                f"/v1/metrics/{METRIC}/series",
                params={
                    "window": window,
                    "start": format_time(span[0]),
                    "end": format_time(span[1]),
                    "page": key[0],
                },
            )
            assert response.status_code == 200, response.text
            for point in response.json()["points"]:
                start = parse_time(point["start"])
                want = _exact(window_ms, start, key, watermark, batch_cells, speed_cells)
                assert want is not None, f"{window} {point['start']}: a point the oracle lacks"
                count, quantiles = want
                assert point["count"] == count, (window, point["start"])
                for name, exact in quantiles.items():
                    if not exact.accepts(point[name]):
                        lo, hi = exact.rank_bounds(point[name])
                        mismatches.append(
                            f"{window} {point['start']} {name}: {point[name]} has rank "
                            f"{lo:.4f}..{hi:.4f}, want {exact.q} ± {oracle.KLL_RANK_EPS}"
                        )
                checked[point["source"]] = checked.get(point["source"], 0) + 1

        # `top` ranks by a quantile of the merged window; here the straddling hour.
        at = watermark - watermark % HOUR
        response = client.get(
            f"/v1/metrics/{METRIC}/top",
            params={"window": "1h", "at": format_time(at), "by": "p99", "n": 5},
        )
        assert response.status_code == 200, response.text
        items = response.json()["items"]
        assert items and [i["value"] for i in items] == sorted(
            (i["value"] for i in items), reverse=True
        )
        for item in items:
            want = _exact(HOUR, at, (item["key"]["page"],), watermark, batch_cells, speed_cells)
            assert want is not None
            assert want[1]["p99"].accepts(item["value"]), item

        hour = {"window": "1h", "start": format_time(at), "end": format_time(at + HOUR)}
        response = client.get(
            f"/v1/metrics/{METRIC}/series", params={**hour, "page": "/", "q": "0.25,0.999"}
        )
        assert response.status_code == 200, response.text
        (point,) = response.json()["points"]
        assert {"p25", "p99.9"} <= point.keys() and "p50" not in point
        response = client.get(
            f"/v1/metrics/{METRIC}/series", params={**hour, "page": "/", "q": "1.5"}
        )
        assert response.status_code == 400 and "q=" in response.json()["detail"]

    assert mismatches == []
    assert checked.get("batch", 0) >= 20 and checked.get("speed", 0) >= 10, checked
    assert checked.get("mixed", 0) >= 1, "the hour and the day straddling W were checked"
