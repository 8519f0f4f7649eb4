"""The serving layer's core without HTTP (`serving_layer.query`), against real PostgreSQL and
Redis: a query built in code — as the SQL interface builds them — answers the rows the HTTP
route renders for the same question, of every shape; and a query past the cell bound is
refused when it is built, before anything is read."""

from __future__ import annotations

import random
from typing import Any

import orjson
import pytest
from fastapi import HTTPException
from fastapi.testclient import TestClient

from serving_layer import create_app
from serving_layer.query import KeysQuery, SeriesQuery, TopQuery
from serving_layer.read_plan import Point
from serving_layer.selection import Selection
from serving_layer.timefmt import format_time
from serving_layer.windowing import WindowSpec
from shared.aggregations import DEFAULT_RENDER
from tests.conftest import Platform
from tests.serving.views import load_views, random_events

pytestmark = [pytest.mark.services, pytest.mark.timeout(120)]

MINUTE, HOUR = 60_000, 3_600_000
T0 = 1_767_225_600_000  # 2026-01-01T00:00:00Z
W = T0 + 37 * MINUTE
PAGES = ["/", "/a", "/b"]


def _points(points: list[Point]) -> list[dict[str, Any]]:
    """The points as the API renders them, each checked to hold the values it renders."""
    rendered = [orjson.loads(orjson.dumps(point.json)) for point in points]
    for point, shown in zip(points, rendered, strict=True):
        assert {k: shown[k] for k in point.values} == point.values
    return rendered


def test_queries_built_in_code_answer_what_the_routes_render(platform: Platform) -> None:
    settings = platform.settings
    events = random_events(random.Random(31), T0 - HOUR, T0 + HOUR, 1200, PAGES)
    load_views(settings, events, W, 31)
    metric = settings.plans["views_by_page"]
    window = (T0 - HOUR, T0 + HOUR)
    span = {"start": format_time(window[0]), "end": format_time(window[1])}
    by_page = Selection(metric.key, (), ("page",))
    one_page = Selection(metric.key, (("page", frozenset({"/a"})),))
    minutes, hopping = WindowSpec(MINUTE, MINUTE), WindowSpec(10 * MINUTE, 5 * MINUTE)
    with TestClient(create_app(settings)) as client:
        state = client.app.state  # type: ignore[attr-defined]

        def read(query: Any) -> Any:
            return client.portal.call(query.read, state.view, state.async_db)  # type: ignore[union-attr]

        def get(path: str, **params: str) -> dict[str, Any]:
            response = client.get(f"/v1/metrics/views_by_page/{path}", params=params)
            assert response.status_code == 200, response.text
            body: dict[str, Any] = response.json()
            return body

        # one key of a configured window: the exact path
        query = SeriesQuery.of(settings, metric, minutes, window, one_page, DEFAULT_RENDER, 100)
        answer = read(query)
        body = get("series", window="1m", page="/a", **span)
        assert query.one_key and _points(answer.rows[()]) == body["points"]
        assert format_time(answer.watermark) == body["batch_watermark"] == format_time(W)
        assert {p["source"] for p in body["points"]} == {"batch", "speed"}
        # hopping windows, one series per page
        query = SeriesQuery.of(settings, metric, hopping, window, by_page, DEFAULT_RENDER, 100)
        answer = read(query)
        body = get("series", window="10m", step="5m", group_by="page", **span)
        assert [g["key"]["page"] for g in body["groups"]] == sorted(PAGES)
        for group in body["groups"]:
            assert _points(answer.rows[(group["key"]["page"],)]) == group["points"]
        assert answer.batch_cells > 0 and answer.speed_states > 0
        # one page over the same hopping windows: its group's points, from its sub-cells alone
        grouped = answer
        query = SeriesQuery.of(settings, metric, hopping, window, one_page, DEFAULT_RENDER, 100)
        answer = read(query)
        body = get("series", window="10m", step="5m", page="/a", **span)
        assert not query.one_key and _points(answer.rows[()]) == body["points"]
        assert _points(answer.rows[()]) == _points(grouped.rows[("/a",)])
        assert 0 < answer.speed_states < grouped.speed_states
        # top over an hour straddling W
        at = T0 + 30 * MINUTE
        top = TopQuery.of(settings, metric, "count", HOUR, at, by_page, 10, DEFAULT_RENDER)
        answer = read(top)
        body = get("top", window="1h", at=format_time(at), by="count")
        assert [[{"page": g[0]}, v] for g, v in answer.rows] == [
            [item["key"], item["value"]] for item in body["items"]
        ]
        assert sum(v for _, v in answer.rows) == sum(
            1 for e in events if T0 <= e.time_ms < T0 + HOUR
        )
        # keys
        keys = KeysQuery.of(settings, metric, window, "/", Selection(metric.key), 100)
        answer = read(keys)
        body = get("keys", prefix="/", **span)
        assert (
            [{"page": k[0]} for k in answer.rows]
            == body["keys"]
            == [{"page": p} for p in sorted(PAGES)]
        )


def test_a_query_past_the_cell_bound_is_refused_when_built(platform: Platform) -> None:
    settings = platform.settings
    metric = settings.plans["views_by_page"]
    limit = settings.serving.max_cells
    too_long = (T0, T0 + (limit + 1) * MINUTE)
    with pytest.raises(HTTPException) as refused:
        SeriesQuery.of(
            settings,
            metric,
            WindowSpec(MINUTE, MINUTE),
            too_long,
            Selection(metric.key),
            DEFAULT_RENDER,
            100,
        )
    assert refused.value.status_code == 400
    assert f"more than the limit of {limit}" in str(refused.value.detail)
    with pytest.raises(HTTPException, match="smaller window"):
        TopQuery.of(
            settings,
            metric,
            "count",
            (limit + 1) * MINUTE,
            T0,
            Selection(metric.key, (), ("page",)),
            10,
            DEFAULT_RENDER,
        )
