"""`top` ranks keys over the merged view (ties by key ascending); `keys` lists the keys seen in
a range on both sides of W."""

from __future__ import annotations

import random
from typing import Any

import pytest
from fastapi.testclient import TestClient

from serving_layer.timefmt import format_time
from shared.db.connect import connect
from tests.conftest import Platform
from tests.serving.views import Event, batch_rows, expected, publish, random_events, write_speed

pytestmark = [pytest.mark.services, pytest.mark.timeout(120)]

MINUTE, HOUR = 60_000, 3_600_000
T0 = 1_767_225_600_000
W = T0 + 20 * MINUTE
PAGES = [f"/p{i}" for i in range(12)]


def _load(platform: Platform, events: list[Event]) -> None:
    metric = platform.settings.plan("views_by_page")
    assert metric is not None
    publish(platform.settings, batch_rows(platform.settings, metric, events, W), {metric.name: W})
    write_speed(platform.settings, metric, events, W)


def test_top_ranks_merged_view(platform: Platform, client: TestClient) -> None:
    events = random_events(random.Random(5), T0 - 2 * HOUR, T0 + 2 * HOUR, 800, PAGES)
    _load(platform, events)
    metric = platform.settings.plan("views_by_page")
    assert metric is not None
    for by in metric.output_names:
        for at_offset in (-HOUR, 30 * MINUTE, HOUR + 5 * MINUTE):
            _check_top(client, metric, events, by, T0 + at_offset)


def _check_top(client: TestClient, metric: Any, events: list[Event], by: str, at: int) -> None:
    start = at - at % HOUR
    r = client.get(
        "/v1/metrics/views_by_page/top",
        params={"window": "1h", "at": format_time(at), "by": by, "n": 5},
    )
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["start"] == format_time(start) and body["end"] == format_time(start + HOUR)
    by_key: dict[str, list[Event]] = {}
    for e in events:
        if start <= e.time_ms < start + HOUR:
            by_key.setdefault(e.key[0], []).append(e)
    want = sorted(
        ((k, expected(metric, es)[by]) for k, es in by_key.items()), key=lambda i: (-i[1], i[0])
    )
    got = [(item["key"]["page"], item["value"]) for item in body["items"]]
    assert len(got) == min(5, len(want))
    source = "batch" if start + HOUR <= W else "speed" if start >= W else "mixed"
    assert {item["source"] for item in body["items"]} == {source}
    if by == "distinct_user_id":
        for (_, gv), (_, wv) in zip(got, want, strict=False):
            assert abs(gv - wv) <= 0.05 * wv + 1
    else:
        assert [k for k, _ in got] == [k for k, _ in want[:5]], by
        for (_, gv), (_, wv) in zip(got, want, strict=False):
            assert gv == pytest.approx(wv, rel=1e-9)


def test_top_ties_by_key_ascending(platform: Platform, client: TestClient) -> None:
    events = [
        Event(T0 + i * MINUTE, (page,), 1.0, "u")
        for i, page in enumerate(["/b", "/a", "/c", "/a", "/b", "/c", "/d"])
    ]
    _load(platform, events)
    r = client.get(
        "/v1/metrics/views_by_page/top",
        params={"window": "1h", "at": format_time(T0), "by": "count", "n": 4},
    )
    assert [(i["key"]["page"], i["value"]) for i in r.json()["items"]] == [
        ("/a", 2),
        ("/b", 2),
        ("/c", 2),
        ("/d", 1),
    ]


def test_keys_from_both_layers(platform: Platform, client: TestClient) -> None:
    events = [
        Event(T0 - HOUR, ("/old",), 1.0, "u"),
        Event(T0 + 5 * MINUTE, ("/batch",), 1.0, "u"),
        Event(W + 5 * MINUTE, ("/speed",), 1.0, "u"),
        Event(W + 6 * MINUTE, ("/speed2",), 1.0, "u"),
    ]
    _load(platform, events)
    params = {"start": format_time(T0), "end": format_time(T0 + HOUR)}
    r = client.get("/v1/metrics/views_by_page/keys", params=params)
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["keys"] == [{"page": "/batch"}, {"page": "/speed"}, {"page": "/speed2"}]
    assert body["truncated"] is False
    r = client.get("/v1/metrics/views_by_page/keys", params={**params, "prefix": "/s", "limit": 1})
    assert r.json()["keys"] == [{"page": "/speed"}] and r.json()["truncated"] is True
    r = client.get("/v1/metrics/views_total/keys", params=params)
    assert r.json()["keys"] == []  # views_total has no cells here


def test_cached_top_follows_an_in_place_publication(platform: Platform, client: TestClient) -> None:
    """A batch-only `top` answer is kept for one stamp of the served row: an incremental run's
    upsert (cells and served row in one transaction, rule 6) must show in the next answer."""
    events = random_events(random.Random(9), T0 - 2 * HOUR, T0, 300, PAGES)
    _load(platform, events)
    params = {"window": "1h", "at": format_time(T0 - HOUR), "by": "count", "n": 3}
    first = client.get("/v1/metrics/views_by_page/top", params=params).json()["items"]
    assert client.get("/v1/metrics/views_by_page/top", params=params).json()["items"] == first
    last = first[-1]["key"]["page"]
    with connect(platform.settings.postgres.url) as conn:
        conn.execute(
            "UPDATE batch_cells SET count = count + 1000 WHERE metric = 'views_by_page' "
            "AND window_ms = %s AND start_ms = %s AND key = %s",
            [HOUR, T0 - HOUR, [last]],
        )
        conn.execute("UPDATE served_view SET published_at = now()")
        conn.commit()
    after = client.get("/v1/metrics/views_by_page/top", params=params).json()["items"]
    assert after[0] == {**first[-1], "value": first[-1]["value"] + 1000}
