"""Rule 12 through the API against real PostgreSQL and Redis: while PostgreSQL does not
answer, a series answers the windows from the W last read on, from the speed view, with
`batch_status: "unavailable"` — the same points the merged view gave for them — and omits the
rest; `top` over a window before W and `keys` answer 503; once the row last read is older than
`speed.cleanup_delay_s`, series answer 503 too."""

from __future__ import annotations

import random
from typing import Any

import pytest
from fastapi.testclient import TestClient

from serving_layer import create_app
from serving_layer.pools import AsyncDb, async_pool
from serving_layer.timefmt import format_time, parse_time
from tests.conftest import Platform
from tests.serving.views import load_views, random_events

pytestmark = [pytest.mark.services, pytest.mark.timeout(120)]

MINUTE, HOUR, DAY = 60_000, 3_600_000, 86_400_000
T0 = 1_767_225_600_000  # 2026-01-01T00:00:00Z
W = T0 + 37 * MINUTE
UNREACHABLE = "postgresql://lp:lp@127.0.0.1:1/lp"  # nothing listens on port 1


def _get(client: TestClient, path: str, **params: str) -> tuple[int, dict[str, Any]]:
    response = client.get(path, params=params)
    return response.status_code, response.json()


def test_series_answer_from_the_speed_view_while_postgres_is_unreachable(
    platform: Platform,
) -> None:
    events = random_events(random.Random(12), T0 - HOUR, T0 + HOUR, 1500, ["/", "/a", "/b"])
    load_views(platform.settings, events, W, 12)
    window = {"start": format_time(T0 - HOUR), "end": format_time(T0 + HOUR)}
    queries: list[tuple[str, dict[str, str]]] = [
        ("/v1/metrics/views_by_page/series", {"window": "1m", "page": "/a", **window}),
        ("/v1/metrics/views_by_page/series", {"window": "1m", **window}),  # the total
        ("/v1/metrics/views_by_page/series", {"window": "5m", "group_by": "page", **window}),
        ("/v1/metrics/views_total/series", {"window": "1h", **window}),
    ]
    top_after_w = {"window": "1m", "at": format_time(W + 5 * MINUTE), "by": "count"}
    top_before_w = {"window": "1h", "at": format_time(T0 - HOUR), "by": "count"}
    dead = platform.settings.model_copy(
        update={"postgres": platform.settings.postgres.model_copy(update={"url": UNREACHABLE})}
    )
    with TestClient(create_app(platform.settings)) as client:
        merged = [_get(client, path, **params) for path, params in queries]
        top = _get(client, "/v1/metrics/views_by_page/top", **top_after_w)
        assert all(status == 200 for status, _ in [*merged, top]), merged
        assert all(body["batch_status"] == "ok" for _, body in [*merged, top])

        pool = async_pool(dead)
        client.portal.call(pool.open)  # type: ignore[union-attr]
        client.app.state.async_db = AsyncDb(pool)  # type: ignore[attr-defined]
        try:
            answered = []
            for (path, params), (_, before) in zip(queries, merged, strict=True):
                status, body = _get(client, path, **params)
                assert status == 200, body
                assert body["batch_status"] == "unavailable"
                assert body["batch_watermark"] == format_time(W)
                assert body["speed_status"] == "ok"
                for got, want in zip(_series(body), _series(before), strict=True):
                    assert got == [p for p in want if parse_time(p["start"]) >= W], path
                    assert all(p["source"] == "speed" for p in got)
                answered.append(sum(map(len, _series(body))))
            # 1m and 5m windows after W answered; the 1h window straddling W omitted
            assert answered[0] >= 20 and answered[1] >= 20 and answered[2] >= 10, answered
            assert answered[3] == 0, answered
            status, body = _get(client, "/v1/metrics/views_by_page/top", **top_after_w)
            assert status == 200 and body["batch_status"] == "unavailable"
            assert body["items"] == top[1]["items"]
            status, body = _get(client, "/v1/metrics/views_by_page/top", **top_before_w)
            assert status == 503 and "PostgreSQL" in body["detail"], body
            status, body = _get(client, "/v1/metrics/views_by_page/keys", **window)
            assert status == 503, body
            scrape = client.get("/metrics").text
            assert "lambda_serving_batch_unavailable_total 5.0" in scrape  # 4 series, 1 top

            client.app.state.view.batch.speed_only_for_s = 0.0  # type: ignore[attr-defined]
            status, body = _get(client, queries[0][0], **queries[0][1])
            assert status == 503 and "PostgreSQL" in body["detail"], body
        finally:
            client.portal.call(pool.close)  # type: ignore[union-attr]


def _series(body: dict[str, Any]) -> list[list[dict[str, Any]]]:
    """The answer's points, one list per group (one list without `group_by`)."""
    if "groups" in body:
        return [group["points"] for group in body["groups"]]
    return [body["points"]]
