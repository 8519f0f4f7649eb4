"""Merge rule 8 through the API against real PostgreSQL and Redis: random W, windows and
events, each event stored in exactly one layer by its base cell's position against W; every
window's point must equal the brute force over its events."""

from __future__ import annotations

import random
from typing import Any

import pytest
from fastapi.testclient import TestClient

from serving_layer import create_app
from serving_layer.timefmt import format_time, parse_time
from shared.db.connect import connect
from shared.durations import format_duration
from shared.speed_view import EPOCH_KEY, redis_client
from shared.windows import point_source, window_starts
from tests.conftest import Platform
from tests.oracle import compare
from tests.serving.views import expected, key_of, load_views, random_events, write_speed

pytestmark = [pytest.mark.services, pytest.mark.timeout(300)]

MINUTE, HOUR, DAY = 60_000, 3_600_000, 86_400_000
T0 = 1_767_225_600_000  # 2026-01-01T00:00:00Z
PAGES = ["/", "/a", "/b", "/c"]


def _load(platform: Platform, seed: int, w_offset_min: int) -> tuple[list[Any], int]:
    rng = random.Random(seed)
    events = random_events(rng, T0 - DAY, T0 + DAY, 1500, PAGES)
    watermark = T0 + w_offset_min * MINUTE
    load_views(platform.settings, events, watermark, seed)
    return events, watermark


def _check_series(
    client: TestClient,
    platform: Platform,
    events: list[Any],
    watermark: int,
    window_ms: int,
    start: int,
    end: int,
) -> None:
    for metric in platform.settings.plans.values():
        if window_ms not in metric.windows_ms:
            continue
        params = {
            "window": format_duration(window_ms),
            "start": format_time(start),
            "end": format_time(end),
        }
        key: tuple[str, ...] = ()
        if metric.key:
            params["page"] = "/a"
            key = ("/a",)
        r = client.get(f"/v1/metrics/{metric.name}/series", params=params)
        assert r.status_code == 200, r.text
        body = r.json()
        assert body["batch_watermark"] == format_time(watermark)
        assert body["speed_status"] == "ok"
        want, want_sources = {}, {}
        for s in window_starts(start, end, window_ms):
            inside = [
                e for e in events if s <= e.time_ms < s + window_ms and key_of(metric, e) == key
            ]
            if inside:
                cell = (metric.name, window_ms, s, key)
                want[cell] = expected(metric, inside)
                want_sources[cell] = point_source(s, s + window_ms, watermark)
        got, got_sources = {}, {}
        for point in body["points"]:
            cell = (metric.name, window_ms, parse_time(point["start"]), key)
            got[cell] = {k: v for k, v in point.items() if k not in ("start", "end", "source")}
            got_sources[cell] = point["source"]
        assert compare(want, got) == []
        assert got_sources == want_sources


@pytest.mark.parametrize("w_offset_min", [-7 * 60 - 13, 0, 17])
def test_series_equals_brute_force_across_w(platform: Platform, w_offset_min: int) -> None:
    events, watermark = _load(platform, seed=w_offset_min, w_offset_min=w_offset_min)
    with TestClient(create_app(platform.settings)) as client:
        for window_ms in (MINUTE, HOUR, DAY):
            span = {MINUTE: 3 * HOUR, HOUR: 2 * DAY, DAY: 3 * DAY}[window_ms]
            _check_series(
                client,
                platform,
                events,
                watermark,
                window_ms,
                watermark - span // 2 + 7,
                watermark + span // 2,
            )


def test_redis_down_answers_batch_only(platform: Platform) -> None:
    _load(platform, seed=3, w_offset_min=0)
    cfg = platform.settings.model_copy(
        update={
            "redis": platform.settings.redis.model_copy(update={"url": "redis://127.0.0.1:1/0"})
        }
    )
    with TestClient(create_app(cfg)) as client:
        r = client.get(
            "/v1/metrics/views_by_page/series",
            params={
                "window": "1h",
                "start": format_time(T0 - DAY),
                "end": format_time(T0 + DAY),
                "page": "/",
            },
        )
        assert r.status_code == 200, r.text
        body = r.json()
        assert body["speed_status"] == "unavailable"
        assert body["points"]
        assert {p["source"] for p in body["points"]} == {"batch"}
        r = client.get(
            "/v1/metrics/views_by_page/top", params={"window": "1h", "at": format_time(T0 + HOUR)}
        )
        assert r.status_code == 200 and r.json()["speed_status"] == "unavailable"
        r = client.get(
            "/v1/metrics/views_by_page/keys",
            params={"start": format_time(T0 - DAY), "end": format_time(T0 + DAY)},
        )
        assert r.status_code == 200 and r.json()["keys"]
        assert client.get("/v1/status").status_code == 200
        assert client.get("/readyz").status_code == 503


def test_rebuilding_when_epoch_missing(platform: Platform, client: TestClient) -> None:
    _load(platform, seed=4, w_offset_min=0)
    redis_client(platform.settings.redis).delete(EPOCH_KEY)
    r = client.get(
        "/v1/metrics/views_total/series",
        params={"window": "1m", "start": format_time(T0), "end": format_time(T0 + HOUR)},
    )
    assert r.json()["speed_status"] == "rebuilding"


def test_cached_batch_cells_follow_an_in_place_publication(platform: Platform) -> None:
    """An incremental/range run upserts cells into the served generation and rewrites the
    served row in the same transaction (rule 6): the next answer must show the new cells."""
    _load(platform, seed=5, w_offset_min=0)
    params = {"window": "1m", "start": format_time(T0 - HOUR), "end": format_time(T0)}
    with TestClient(create_app(platform.settings)) as client:
        before = client.get("/v1/metrics/views_total/series", params=params).json()["points"]
        again = client.get("/v1/metrics/views_total/series", params=params).json()["points"]
        assert before == again and before
        first = parse_time(before[0]["start"])
        with connect(platform.settings.postgres.url) as conn:
            conn.execute(
                "UPDATE batch_cells SET count = count + 1000 "
                "WHERE metric = 'views_total' AND window_ms = %s AND start_ms = %s",
                [MINUTE, first],
            )
            conn.execute("UPDATE served_view SET published_at = now()")
            conn.commit()
        after = client.get("/v1/metrics/views_total/series", params=params).json()["points"]
        assert after[0]["count"] == before[0]["count"] + 1000
        assert after[1:] == before[1:]


def test_speed_points_follow_changed_sub_cells(platform: Platform) -> None:
    """Speed points are cached by the exact sub-cell states they merge: new events in the
    speed view (every sub-cell rewritten) must show in the next answer."""
    events, watermark = _load(platform, seed=6, w_offset_min=0)
    span = (watermark, watermark + 3 * HOUR)
    with TestClient(create_app(platform.settings)) as client:
        _check_series(client, platform, events, watermark, MINUTE, *span)
        more = events + random_events(random.Random(7), *span, 400, PAGES)
        redis_client(platform.settings.redis).flushdb()
        for metric in platform.settings.plans.values():
            write_speed(platform.settings, metric, more, watermark, seed=8)
        _check_series(client, platform, more, watermark, MINUTE, *span)


def test_windows_across_w_follow_changed_sub_cells(platform: Platform) -> None:
    """A window reaching past W is cached under the served stamp and a digest of the speed
    states it merges, on the one-key path and on a sliced total: new events in the speed view
    must show in the next answer of both."""
    events, watermark = _load(platform, seed=9, w_offset_min=17)
    span = (watermark - 3 * HOUR, watermark + 3 * HOUR)
    params = {"window": "1h", "start": format_time(span[0]), "end": format_time(span[1])}

    def total_counts(client: TestClient) -> dict[str, int]:
        r = client.get("/v1/metrics/views_by_page/series", params=params)
        assert r.status_code == 200, r.text
        return {p["start"]: p["count"] for p in r.json()["points"]}

    def brute_counts(chosen: list[Any]) -> dict[str, int]:
        counts: dict[str, int] = {}
        for e in chosen:
            start = e.time_ms // HOUR * HOUR
            if span[0] <= start < span[1]:
                counts[format_time(start)] = counts.get(format_time(start), 0) + 1
        return counts

    with TestClient(create_app(platform.settings)) as client:
        for _ in range(2):  # the second answer comes from the caches
            _check_series(client, platform, events, watermark, HOUR, *span)
            assert total_counts(client) == brute_counts(events)
        more = events + random_events(random.Random(10), watermark, span[1], 400, PAGES)
        redis_client(platform.settings.redis).flushdb()
        for metric in platform.settings.plans.values():
            write_speed(platform.settings, metric, more, watermark, seed=11)
        _check_series(client, platform, more, watermark, HOUR, *span)
        assert total_counts(client) == brute_counts(more)
