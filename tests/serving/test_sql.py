"""`POST /v1/sql` against the real stores: each statement's answer equals the HTTP API's
answer to the same question and the oracle's counts over the same events, across W; a
statement the dialect cannot answer is a 400 saying where and what to send."""

from __future__ import annotations

import random
from typing import Any

import pytest
from fastapi.testclient import TestClient

from serving_layer import create_app
from serving_layer.timefmt import format_time
from tests.conftest import Platform
from tests.serving.views import load_views, random_events

pytestmark = [pytest.mark.services, pytest.mark.timeout(120)]

MINUTE, HOUR = 60_000, 3_600_000
T0 = 1_767_225_600_000  # 2026-01-01T00:00:00Z
W = T0 + 37 * MINUTE
PAGES = ["/", "/a", "/b"]
SPAN = f"ts >= '{format_time(T0 - HOUR)}' AND ts < '{format_time(T0 + HOUR)}'"


def _sql(client: TestClient, query: str, form: str = "objects") -> dict[str, Any]:
    response = client.post("/v1/sql", json={"query": query, "format": form})
    assert response.status_code == 200, response.text
    body: dict[str, Any] = response.json()
    return body


def _refused(client: TestClient, query: str) -> str:
    response = client.post("/v1/sql", json={"query": query})
    assert response.status_code == 400, response.text
    detail: str = response.json()["detail"]
    return detail


def _series(client: TestClient, metric: str, **params: str) -> dict[str, Any]:
    span = {"start": format_time(T0 - HOUR), "end": format_time(T0 + HOUR)}
    response = client.get(f"/v1/metrics/{metric}/series", params={**span, **params})
    assert response.status_code == 200, response.text
    body: dict[str, Any] = response.json()
    return body


def test_sql_answers_equal_the_http_api_and_the_oracle(platform: Platform) -> None:
    settings = platform.settings
    events = random_events(random.Random(41), T0 - HOUR, T0 + HOUR, 1500, PAGES)
    load_views(settings, events, W, 41)
    with TestClient(create_app(settings)) as client:
        # a series of one page at 5m (not a configured window), with a quantile and source
        body = _sql(
            client,
            "SELECT time_bucket('5m', ts) AS t, COUNT(*) AS views, AVG(latency_ms), "
            "APPROX_PERCENTILE(latency_ms, 0.9) AS p90, source FROM views_by_page "
            f"WHERE {SPAN} AND page = '/a' GROUP BY 1 ORDER BY 1",
        )
        api = _series(client, "views_by_page", window="5m", page="/a", q="0.9")
        assert [c["name"] for c in body["columns"]] == ["t", "views", "avg", "p90", "source"]
        assert [c["type"] for c in body["columns"]] == [
            "timestamptz",
            "bigint",
            "double precision",
            "double precision",
            "text",
        ]
        assert body["rows"] == [
            {
                "t": p["start"],
                "views": p["count"],
                "avg": p["avg"],
                "p90": p["p90"],
                "source": p["source"],
            }
            for p in api["points"]
        ]
        assert {row["source"] for row in body["rows"]} == {"batch", "mixed", "speed"}
        assert body["batch_watermark"] == format_time(W) == api["batch_watermark"]
        assert sum(row["views"] for row in body["rows"]) == sum(
            1 for e in events if e.key == ("/a",)
        )

        # one series per page at a configured window, rows by window then page, as arrays
        body = _sql(
            client,
            "SELECT date_trunc('hour', ts), page, COUNT(*), APPROX_COUNT_DISTINCT(user_id) "
            f"FROM views_by_page WHERE {SPAN} GROUP BY 1, page",
            "arrays",
        )
        api = _series(client, "views_by_page", window="1h", group_by="page")
        expected = sorted(
            [p["start"], g["key"]["page"], p["count"], p["distinct_user_id"]]
            for g in api["groups"]
            for p in g["points"]
        )
        assert body["rows"] == expected
        assert [c["name"] for c in body["columns"]] == ["ts", "page", "count", "distinct_user_id"]

        # a total over the range (no bucket) per page, filtered by IN
        body = _sql(
            client,
            "SELECT page, COUNT(*) AS n, MAX(latency_ms) FROM views_by_page "
            f"WHERE {SPAN} AND page IN ('/', '/b') GROUP BY page",
        )
        assert body["rows"] == [
            {
                "page": page,
                "n": sum(1 for e in events if e.key == (page,)),
                "max": max(e.value for e in events if e.key == (page,)),
            }
            for page in ["/", "/b"]
        ]

        # a ranking over the hour straddling W, as the top route ranks it
        at = T0
        body = _sql(
            client,
            "SELECT page, COUNT(*) AS views FROM views_by_page WHERE "
            f"ts >= '{format_time(at)}' AND ts < '{format_time(at + HOUR)}' GROUP BY page "
            "ORDER BY views DESC LIMIT 2",
        )
        top = client.get(
            "/v1/metrics/views_by_page/top",
            params={"window": "1h", "at": format_time(at), "by": "count", "n": "2"},
        ).json()
        assert body["rows"] == [
            {"page": item["key"]["page"], "views": item["value"]} for item in top["items"]
        ]
        counts = sorted(
            (
                sum(1 for e in events if e.key == (p,) and at <= e.time_ms < at + HOUR)
                for p in PAGES
            ),
            reverse=True,
        )
        assert [row["views"] for row in body["rows"]] == counts[:2]

        # the keys seen
        body = _sql(client, f"SELECT DISTINCT page FROM views_by_page WHERE {SPAN}")
        assert body["rows"] == [{"page": page} for page in sorted(PAGES)]

        # EXPLAIN: the plan against the served row, nothing read
        body = _sql(
            client,
            f"EXPLAIN SELECT time_bucket('1h', ts), COUNT(*) FROM views_by_page WHERE {SPAN} "
            "AND page = '/a' GROUP BY 1",
            "arrays",
        )
        assert body["columns"] == [{"name": "QUERY PLAN", "type": "text"}]
        assert body["rows"] == [
            [
                "Series of views_by_page: 2 windows of 1h starting in "
                f"[{format_time(T0 - HOUR)}, {format_time(T0 + HOUR)})"
            ],
            ["  reads views_by_page"],
            ["  filters: page IN ('/a')"],
            [
                f"  W = {format_time(W)}; windows from the batch view: 1, straddling W: 1, "
                "from the speed view: 0"
            ],
        ]
        assert body["batch_watermark"] == format_time(W)

        # the metric without dimensions: its total series, as the API's
        body = _sql(
            client,
            f"SELECT time_bucket('1h', ts), COUNT(*) FROM views_total WHERE {SPAN} GROUP BY 1",
            "arrays",
        )
        api = _series(client, "views_total", window="1h")
        assert body["rows"] == [[p["start"], p["count"]] for p in api["points"]]


def test_statements_the_dialect_cannot_answer_say_where_and_what(platform: Platform) -> None:
    with TestClient(create_app(platform.settings)) as client:
        detail = _refused(client, f"SELECT COUNT(*) FROM nope WHERE {SPAN}")
        assert detail.startswith("line 1, column 22: unknown metric 'nope'"), detail
        detail = _refused(client, f"SELECT STDDEV(latency_ms) FROM views_by_page WHERE {SPAN}")
        assert "it answers COUNT(*), SUM(latency_ms)" in detail, detail
        assert "APPROX_PERCENTILE(latency_ms, <q in (0, 1)>)" in detail, detail
        detail = _refused(
            client, f"SELECT COUNT(*) FROM views_by_page WHERE {SPAN} AND country = 'de'"
        )
        assert "views_by_page has no dimension 'country'" in detail, detail
        assert _refused(client, "SELECT COUNT(*) FROM views_by_page").startswith("WHERE needs a ts")
        assert "read-only" in _refused(client, "DROP TABLE views_by_page")
        assert "read-only" in _refused(client, "INSERT INTO views_by_page VALUES (1)")
        assert "joins" in _refused(
            client, f"SELECT COUNT(*) FROM views_by_page a JOIN views_total b ON true WHERE {SPAN}"
        )
        assert _refused(client, "SELECT FROM WHERE").startswith("line 1, column")
        detail = _refused(
            client,
            "SELECT time_bucket('7m', ts), COUNT(*) FROM views_by_page WHERE "
            f"ts >= '{format_time(T0)}' AND ts < '{format_time(T0 + 10**9 * MINUTE)}' GROUP BY 1",
        )
        assert "LAMBDA_SERVING__MAX_CELLS" in detail, detail
        detail = _refused(client, f"SELECT page, COUNT(*) FROM views_by_page WHERE {SPAN}")
        assert "page is selected: group by it too" in detail, detail
        detail = _refused(
            client, f"SELECT COUNT(*) FROM views_by_page WHERE {SPAN} AND page = 'a\x00b'"
        )
        assert "NUL" in detail, detail
