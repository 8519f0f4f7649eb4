"""Session metrics (rule 13 in docs/semantics.md) across the layers, with real speed workers on
Kafka and Redis, a real Spark run and the API, against the oracle's brute-force
sessionization: a worker killed with kill -9 between its Redis apply and its offset commit,
two workers sharing the partitions (the records keyed by user), a full run, then events after
its snapshot. Every answer a user reads — a key's session series, the total, a group, top
keys by sessions, one user's sessions — equals the oracle over every event, across W; and the
dashboard, in real headless Chromium, charts sessions and duration quantiles and lists one
user's sessions as the API answers them (screenshot: artifacts/dashboard-sessions.png)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient

from batch_layer import execute_run
from lambdactl.generator import GeneratorSpec, generate, produce
from serving_layer import create_app
from shared.config import Settings
from shared.db.runs import RunRequest
from shared.kafka import create_topics
from tests import oracle
from tests.batch.helpers import HOUR, MINUTE, oracle_mismatches, queue, run_record, served_view
from tests.browser import ARTIFACTS, chrome, open_dashboard, served
from tests.conftest import Platform, reconfigured
from tests.speed.support import (
    expected_base_cells,
    speed_cells,
    start_worker,
    stop_worker,
    wait_until_applied,
)

pytestmark = [pytest.mark.services, pytest.mark.timeout(900)]  # room to install chromium

METRIC = "visits"
METRICS: list[dict[str, Any]] = [
    {
        "name": METRIC,
        "source": "pageviews",
        "key": ["user_id"],
        "value": "latency_ms",
        "aggregations": ["count", "sum", "avg", "distinct(page)", "quantiles(latency_ms)"],
        "session": {"gap": "5m", "max_duration": "30m"},
        "windows": ["5m", "1h"],
        "grace": "2m",
    },
    {
        "name": "views",
        "source": "pageviews",
        "key": ["page"],
        "aggregations": ["count"],
        "windows": ["1m", "1h"],
    },
]
PARTS = (f"{METRIC}(sessions)", f"{METRIC}(bounces)")
_METRIC_FIELDS = ("count", "sum", "avg", "distinct_page", "p50", "p90", "p99")


def _as_cells(point: dict[str, Any], key: tuple[str, ...], size: int) -> dict[oracle.Cell, Any]:
    """A session point as the three plans' cells the oracle computes (durations in ms)."""
    start = oracle.parse_rfc3339_ms(point["start"])
    assert start is not None
    cells: dict[oracle.Cell, Any] = {
        (METRIC, size, start, key): {f: point[f] for f in _METRIC_FIELDS if f in point}
    }
    if point["sessions"]:
        part = {"count": point["sessions"], "sum": point["duration_sum_s"] * 1000}
        part["max"] = point["duration_max_s"] * 1000
        for q in ("p50", "p90", "p99"):
            part[q] = round(point[f"duration_{q}_s"] * 1000, 6)  # a duration is whole ms
        cells[(PARTS[0], size, start, key)] = part
    if point["bounces"]:
        cells[(PARTS[1], size, start, key)] = {"count": point["bounces"]}
    return cells


def _series_mismatches(
    client: TestClient, expected: dict[oracle.Cell, Any], user: str, span: tuple[int, int]
) -> list[str]:
    """A user's session series, 5m and 1h windows, against the oracle's cells."""
    problems = []
    for window, size in (("5m", 5 * MINUTE), ("1h", HOUR)):
        answer = client.get(
            f"/v1/metrics/{METRIC}/series",
            params={"window": window, "start": span[0], "end": span[1], "user_id": user},
        )
        assert answer.status_code == 200, answer.text
        got: dict[oracle.Cell, Any] = {}
        for point in answer.json()["points"]:
            got.update(_as_cells(point, (user,), size))
        want = {
            c: v
            for c, v in expected.items()
            if c[0] in (METRIC, *PARTS) and c[1] == size and c[3] == (user,)
        }
        problems += oracle.compare(want, got)
    return problems


def _totals(expected: dict[oracle.Cell, Any], size: int) -> dict[int, tuple[int, int, int]]:
    """Per window: (sessions, bounces, events) over every user."""
    totals: dict[int, list[int]] = {}
    for (name, window, start, _), values in expected.items():
        if window == size and name in (*PARTS, METRIC):
            slot = (*PARTS, METRIC).index(name)
            totals.setdefault(start, [0, 0, 0])[slot] += values["count"]
    return {start: (s, b, e) for start, (s, b, e) in totals.items()}


def _merged_mismatches(client: TestClient, expected: dict[oracle.Cell, Any], now: int) -> list[str]:
    span = (now - 4 * HOUR, now + HOUR)
    problems = []
    for user in ("u1", "u2", "u3", "u7", "u40"):
        problems += _series_mismatches(client, expected, user, span)
    total = client.get(
        f"/v1/metrics/{METRIC}/series", params={"window": "1h", "start": span[0], "end": span[1]}
    ).json()
    got = {
        oracle.parse_rfc3339_ms(p["start"]): (p["sessions"], p["bounces"], p["count"])
        for p in total["points"]
    }
    if got != _totals(expected, HOUR):
        problems.append(f"totals: got {got}, expected {_totals(expected, HOUR)}")
    return problems


def test_sessions_across_a_kill_workers_a_run_and_the_api(
    platform: Platform, spark: Any, tmp_path: Path
) -> None:
    world = reconfigured(
        platform,
        metrics=METRICS,
        speed={"max_poll_records": 300, "watermark_refresh_s": 1.0, "cleanup_interval_s": 3600.0},
    )
    settings = world.settings
    create_topics(settings)
    bootstrap, topic = settings.kafka.bootstrap_servers, settings.sources[0].topic
    now = int(time.time() * 1000) // MINUTE * MINUTE
    history = GeneratorSpec(
        now - 3 * HOUR, now - HOUR, 4000, late_fraction=0.0, keyed_by_user=True, seed=13
    )
    produce(bootstrap, topic, generate(history))

    log = tmp_path / "workers.log"
    killed = start_worker(world, log, fault="after_redis_apply_before_commit@5")
    assert killed.wait(120) == -9, "killed (SIGKILL) between a Redis apply and its commit"
    workers = [start_worker(world, log), start_worker(world, log)]
    try:
        wait_until_applied(world, workers=workers)
        records = oracle.read_topic(bootstrap, topic)
        want, _ = expected_base_cells(world, records)
        assert {c[0] for c in want} >= {METRIC, *PARTS}
        assert oracle.compare(want, speed_cells(world)) == [], "the kill lost or doubled nothing"

        run_id = queue(settings, RunRequest("full"))
        execute_run(settings, spark, run_id)
        assert run_record(settings, run_id).status == "succeeded"
        assert oracle_mismatches(settings, world.config) == []
        served, _ = served_view(settings)
        assert served is not None
        plan = settings.plan(METRIC)
        assert plan is not None
        w = served.watermark(METRIC, plan.version)
        assert w is not None and now - 3 * HOUR < w < now - HOUR

        # An incremental run over new events (in place: the generation stays), then more.
        for seed, (start, end) in (
            (14, (now - HOUR, now - 30 * MINUTE)),
            (15, (now - 30 * MINUTE, now)),
        ):
            spec = GeneratorSpec(start, end, 800, late_fraction=0.0, keyed_by_user=True, seed=seed)
            produce(bootstrap, topic, generate(spec))
            if seed == 14:
                incremental = queue(settings, RunRequest("incremental"))
                execute_run(settings, spark, incremental)
                assert run_record(settings, incremental).executed_mode == "incremental"
                assert oracle_mismatches(settings, world.config) == []
                served, _ = served_view(settings)
                assert served is not None and served.watermark(METRIC, plan.version) > w
                w = served.watermark(METRIC, plan.version)
        wait_until_applied(world, workers=workers)
        expected = oracle.compute_cells(world.config, oracle.read_topic(bootstrap, topic))
        with TestClient(create_app(settings)) as client:
            deadline = time.monotonic() + 30  # the workers continue from the run within ~1 s
            while (problems := _merged_mismatches(client, expected, now)) and (
                time.monotonic() < deadline
            ):
                time.sleep(0.5)
            assert problems == []
            _check_sessions_and_top(client, expected, now, w)
            _check_sql(client, expected, now)
        _dashboard_shows_sessions(settings, "u1")
    finally:
        for worker in workers:
            assert stop_worker(worker) == 0


def _check_sql(client: TestClient, expected: dict[oracle.Cell, Any], now: int) -> None:
    """The session metric as SQL's table of its sessions: one user's sessions as the
    sessions route lists them, the sessions, bounces and events per hour as the oracle counts
    them, and the top users by sessions as the top route ranks them."""

    def sql(query: str) -> list[list[Any]]:
        answer = client.post("/v1/sql", json={"query": query, "format": "arrays"})
        assert answer.status_code == 200, answer.text
        rows: list[list[Any]] = answer.json()["rows"]
        return rows

    span = f"ts >= {now - 4 * HOUR} AND ts < {now + HOUR}"
    listed = client.get(
        f"/v1/metrics/{METRIC}/sessions",
        params={"start": now - 4 * HOUR, "end": now + HOUR, "user_id": "u1", "limit": 1000},
    ).json()["sessions"]
    rows = sql(
        f'SELECT ts, "end", events, duration_s, source FROM {METRIC} '
        f"WHERE user_id = 'u1' AND {span}"
    )
    assert rows == [
        [s["start"], s["end"], s["events"], s["duration_s"], s["source"]] for s in listed
    ]
    hourly = sql(
        "SELECT time_bucket('1h', ts), COUNT(*), COUNT(*) FILTER (WHERE events = 1), "
        f"SUM(events) FROM {METRIC} WHERE {span} GROUP BY 1"
    )
    got = {oracle.parse_rfc3339_ms(t): (n, bounces, events) for t, n, bounces, events in hourly}
    assert got == {t: v for t, v in _totals(expected, HOUR).items() if v[0]}
    hour = now - 2 * HOUR
    start = hour - hour % HOUR
    top = sql(
        f"SELECT user_id, COUNT(*) AS sessions FROM {METRIC} WHERE ts >= {start} AND "
        f"ts < {start + HOUR} GROUP BY user_id ORDER BY sessions DESC LIMIT 5"
    )
    ranked = client.get(
        f"/v1/metrics/{METRIC}/top", params={"window": "1h", "at": hour, "by": "sessions", "n": 5}
    ).json()["items"]
    assert top == [[i["key"]["user_id"], i["value"]] for i in ranked]


def _check_sessions_and_top(
    client: TestClient, expected: dict[oracle.Cell, Any], now: int, w: int
) -> None:
    """One user's sessions across W and the top users by sessions, as the oracle has them."""
    sessions = {
        start: (values["count"], expected[(PARTS[0], 0, start, key)]["max"])
        for (name, size, start, key), values in expected.items()
        if name == METRIC and size == 0 and key == ("u1",)
    }
    answer = client.get(
        f"/v1/metrics/{METRIC}/sessions",
        params={"start": now - 4 * HOUR, "end": now + HOUR, "user_id": "u1", "limit": 1000},
    )
    assert answer.status_code == 200, answer.text
    body = answer.json()
    listed = {
        oracle.parse_rfc3339_ms(s["start"]): (s["events"], s["duration_s"] * 1000)
        for s in body["sessions"]
    }
    assert listed == sessions
    sources = {s["source"] for s in body["sessions"]}
    assert sources == {"batch", "speed"}, "u1's sessions come from both sides of W"
    assert all(
        (s["source"] == "batch") == (oracle.parse_rfc3339_ms(s["start"]) < w)  # type: ignore[operator]
        for s in body["sessions"]
    )

    hour = now - 2 * HOUR
    top = client.get(
        f"/v1/metrics/{METRIC}/top", params={"window": "1h", "at": hour, "by": "sessions", "n": 5}
    ).json()
    counts = {
        key[0]: v["count"]
        for (name, size, start, key), v in expected.items()
        if name == PARTS[0] and size == HOUR and start == hour - hour % HOUR
    }
    best = sorted(counts.items(), key=lambda item: (-item[1], item[0]))[:5]
    assert [(i["key"]["user_id"], i["value"]) for i in top["items"]] == best
    listing = httpx.Response(200, content=client.get("/v1/metrics").content).json()
    (info,) = [m for m in listing["metrics"] if m["name"] == METRIC]
    assert info["session"] == {"gap": "5m", "max_duration": "30m"}
    assert info["aggregations"][:2] == ["sessions", "bounces"] and "sessions" in info["by"]


def _dashboard_shows_sessions(settings: Settings, user: str) -> None:
    """The dashboard over the session metric: sessions per window charted by default (the
    total: no key, no sessions list), then one user's, their `duration_p50_s`, and that user's
    sessions listed newest first exactly as the API answers the query the page sent, from
    both views."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    requests: list[str] = []
    with served(create_app(settings), requests) as url, chrome() as driver:
        wait = open_dashboard(driver, url, 30)

        def picker(element_id: str) -> Any:
            return Select(driver.find_element(By.ID, element_id))

        def title() -> str:
            return str(driver.find_element(By.ID, "chart-title").text)

        wait.until(lambda _: METRIC in [o.get_attribute("value") for o in picker("metric").options])
        picker("metric").select_by_value(METRIC)
        wait.until(lambda _: title().startswith(f"{METRIC} · sessions") and "total" in title())
        assert driver.find_element(By.ID, "sessions-card").get_attribute("hidden") is not None
        wait.until(lambda _: user in [o.text for o in picker("key").options])
        picker("key").select_by_visible_text(user)
        wait.until(lambda _: title().endswith(f"· {user}"))
        heading = driver.find_element(By.ID, "sessions-title")
        wait.until(lambda _: heading.text.startswith(f"Sessions of {user} ("))
        sent = [r for r in requests if r.startswith(f"/v1/metrics/{METRIC}/sessions?")]
        answer = httpx.get(url + sent[-1]).json()
        listed = answer["sessions"][::-1]
        assert heading.text == f"Sessions of {user} ({len(listed)})"
        rows = [
            [cell.text for cell in row.find_elements(By.TAG_NAME, "td")]
            for row in driver.find_elements(By.CSS_SELECTOR, "#sessions tr")
        ]
        assert [(r[2], int(r[3])) for r in rows] == [(s["source"], s["events"]) for s in listed]
        assert {r[2] for r in rows} == {"batch", "speed"}

        picker("field").select_by_value("duration_p50_s")
        wait.until(lambda _: "duration_p50_s" in title())
        query = driver.find_element(By.ID, "chart").get_attribute("data-query")
        series = httpx.get(f"{url}/v1/metrics/{METRIC}/series?{query}").json()
        drawn = [
            c.get_attribute("data-start")
            for c in driver.find_elements(By.CSS_SELECTOR, "#points circle")
        ]
        assert drawn == [p["start"] for p in series["points"] if p["duration_p50_s"] is not None]
        assert drawn, "a day of sessions draws their median durations"
        ARTIFACTS.mkdir(exist_ok=True)
        driver.save_screenshot(str(ARTIFACTS / "dashboard-sessions.png"))
        assert [e for e in driver.get_log("browser") if e["level"] == "SEVERE"] == []
