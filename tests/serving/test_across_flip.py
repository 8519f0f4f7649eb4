"""The API against the real layers: a Spark full run, a Faust speed worker, then a second full
run flipping the generation while the API is queried. Every answer — before, during and after
the flip — must equal the brute-force oracle for the W it reports."""

from __future__ import annotations

import threading
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

MINUTE, HOUR = 60_000, 3_600_000
QUERIES = [("views_by_page", {"page": "/"}), ("views_total", {})]


def _full_run(platform: Platform, spark: Any) -> dict[str, int]:
    with connect(platform.settings.postgres.url, autocommit=True) as conn:
        run_id = queue_run(conn, RunRequest("full"))[0]
    run_full(platform.settings, spark, run_id)
    with connect(platform.settings.postgres.url, autocommit=True) as conn:
        served = read_served(conn)
    assert served is not None
    return dict(served.watermarks)


def _ask(
    client: TestClient, metric: str, window: str, start: int, end: int, key: dict[str, str]
) -> dict[str, Any]:
    r = client.get(
        f"/v1/metrics/{metric}/series",
        params={"window": window, "start": format_time(start), "end": format_time(end), **key},
    )
    assert r.status_code == 200, r.text
    body: dict[str, Any] = r.json()
    return body


def _mismatches(
    body: dict[str, Any],
    key: tuple[str, ...],
    batch: dict[Any, Any],
    speed: dict[Any, Any],
    window_ms: int,
    start: int,
    end: int,
) -> list[str]:
    """`body` against the oracle: batch cells up to W, speed cells after; a window straddling
    W is the sum of its 1m cells from each side (distinct counts are checked on whole cells)."""
    metric = body["metric"]
    w = parse_time(body["batch_watermark"])
    assert w is not None
    want: dict[Any, Any] = {}
    for s in range(start, end, window_ms):
        parts = []
        for c in range(s, s + window_ms, MINUTE):
            side = batch if c + MINUTE <= w else speed
            cell = side.get((metric, MINUTE, c, key))
            if cell is not None:
                parts.append(cell)
        if not parts:
            continue
        if window_ms == MINUTE:
            want[(metric, window_ms, s, key)] = parts[0]
        else:
            total = {"count": sum(p["count"] for p in parts)}
            want[(metric, window_ms, s, key)] = total
    got = {}
    for point in body["points"]:
        cell = (metric, window_ms, parse_time(point["start"]), key)
        fields = {k: v for k, v in point.items() if k not in ("start", "end", "source")}
        got[cell] = fields if window_ms == MINUTE else {"count": fields["count"]}
    return oracle.compare(want, got)


def test_answers_match_oracle_before_during_after_flip(platform: Platform, spark: Any) -> None:
    settings = platform.settings
    source = settings.sources[0]
    bootstrap = settings.kafka.bootstrap_servers
    create_topics(settings)
    now = int(time.time() * 1000) // MINUTE * MINUTE
    produce(
        bootstrap,
        source.topic,
        generate(GeneratorSpec(now - 150 * MINUTE, now - 60 * MINUTE, 3000, seed=11)),
    )
    w1 = _full_run(platform, spark)
    first = oracle.read_topic(bootstrap, source.topic)
    produce(bootstrap, source.topic, generate(GeneratorSpec(now - 55 * MINUTE, now, 2000, seed=12)))
    drain_with_worker(platform, platform.config_path.with_name("speed.log"))
    everything = oracle.read_topic(bootstrap, source.topic)
    batch1 = oracle.compute_cells(platform.config, first)
    batch2 = oracle.compute_cells(platform.config, everything)
    speed = oracle.compute_cells(platform.config, everything, late_rule=True, watermarks=w1)
    start, end = now - 180 * MINUTE, now + MINUTE
    hour_start = (now - 180 * MINUTE) // HOUR * HOUR

    answers: list[tuple[str, str, tuple[str, ...], dict[str, Any]]] = []
    stop = threading.Event()
    with TestClient(create_app(settings)) as client:

        def ask_all(phase: str) -> None:
            for metric, key in QUERIES:
                answers.append(
                    (phase, "1m", tuple(key.values()), _ask(client, metric, "1m", start, end, key))
                )
                answers.append(
                    (
                        phase,
                        "1h",
                        tuple(key.values()),
                        _ask(client, metric, "1h", hour_start, end, key),
                    )
                )

        def poll() -> None:
            while not stop.is_set():
                ask_all("during")
                time.sleep(0.05)

        ask_all("before")
        poller = threading.Thread(target=poll)
        poller.start()
        try:
            w2 = _full_run(platform, spark)
        finally:
            stop.set()
            poller.join(60)
        ask_all("after")

    assert all(w2[m] > w1[m] for m in w1), (w1, w2)
    seen: dict[str, set[str]] = {"before": set(), "during": set(), "after": set()}
    problems: list[str] = []
    for phase, window, key, body in answers:
        w = parse_time(body["batch_watermark"])
        metric = body["metric"]
        assert body["speed_status"] == "ok"
        if w == w1[metric]:
            batch, label = batch1, "W1"
        elif w == w2[metric]:
            batch, label = batch2, "W2"
        else:
            raise AssertionError(f"{phase}: unknown W {body['batch_watermark']}")
        seen[phase].add(label)
        window_ms = MINUTE if window == "1m" else HOUR
        lo = start if window == "1m" else hour_start
        problems += [
            f"{phase} {label} {metric} {window}: {line}"
            for line in _mismatches(body, key, batch, speed, window_ms, lo, end)
        ]
        sources = {p["source"] for p in body["points"]}
        if window == "1h":
            assert "mixed" in sources or w % HOUR == 0
    assert problems == []
    assert seen["before"] == {"W1"} and seen["after"] == {"W2"}
    assert len([a for a in answers if a[0] == "during"]) >= 4
