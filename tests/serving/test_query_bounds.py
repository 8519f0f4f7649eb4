"""Issue #26's reproductions against the real API: every query is bounded before it allocates
(windows counted, and windows x cells limited, by arithmetic; `q`'s fractions and digits;
NUL in key values; `tz` names; times within years 1-9999), each refusal a 400 saying what to
send; past `serving.max_inflight_requests` or `serving.request_timeout_s` a 503 with
`Retry-After`; and an API capped at 2 GiB of address space survives the whole corpus plus a
batch of generated queries with no 5xx but those 503s."""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import httpx
import psycopg
import pytest
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from serving_layer import create_app
from tests.broker._kafka import eventually
from tests.conftest import Platform
from tests.serving.api_process import running_api
from tests.serving.views import load_views, random_events

pytestmark = [pytest.mark.services, pytest.mark.timeout(600)]

T0 = 1_767_225_600_000  # 2026-01-01T00:00:00Z
EVENTS = random_events(random.Random(7), T0, T0 + 2 * 3_600_000, 400, ["/", "/a", "/b"])
M = "/v1/metrics/views_by_page"
DAY = "start=2026-01-01T00:00:00Z&end=2026-01-02T00:00:00Z"
BUDGET_503 = ("LAMBDA_SERVING__REQUEST_TIMEOUT_S", "LAMBDA_SERVING__MAX_INFLIGHT_REQUESTS")
"""The only 5xx a query may get: the time budget and load shedding."""

REPRODUCTIONS: list[tuple[str, int, list[str]]] = [
    # (the exact URL, its status, words its detail must hold: what went wrong, what to send)
    (
        f"{M}/series?window=1m&start=0001-01-01T00:00:00Z&end=2026-01-01T00:00:00Z",
        400,
        ["1065047040 windows of 1m", "LAMBDA_SERVING__MAX_CELLS", "end=0001-02-04T17:20:00Z"],
    ),
    (
        f"{M}/series?window=1m&start=2016-01-01T00:00:00Z&end=2026-01-01T00:00:00Z",
        400,
        ["5260320 windows of 1m", "narrow [start, end) to at most 50000 windows"],
    ),
    (
        f"{M}/series?window=1d&step=1m&start=2026-01-01T00:00:00Z&end=2026-02-01T00:00:00Z",
        400,
        [
            "64281600 cells",
            "44640 windows of 1d, 1440 x 1m cells each",
            "at most 34 windows (end=2026-01-01T00:34:00Z)",
            "larger step (step=1d reads each cell once)",
        ],
    ),
    (
        f"{M}/series?window=1h&{DAY}&q=1e-1000000",
        400,
        ["q='1e-1000000'", "more than 6 digits after the point", "send at most 6"],
    ),
    (
        f"{M}/series?window=1h&{DAY}&q=" + ",".join(["0.5"] * 11),
        400,
        ["11 quantiles", "send at most 10"],
    ),
    (
        f"{M}/series?window=1h&{DAY}&page=a%00b",
        400,
        ["page='a\\x00b'", "NUL", "send the value without it"],
    ),
    (f"{M}/keys?{DAY}&prefix=a%00b", 400, ["prefix='a\\x00b'", "send the value without it"]),
    (
        f"{M}/series?window=1d&{DAY}&tz=" + "A" * 1000,
        400,
        ["is not an IANA time zone name", "send e.g. tz=Europe/Berlin"],
    ),
    (f"{M}/series?window=1d&{DAY}&tz=../../etc/passwd", 400, ["IANA time zone name"]),
    (
        f"{M}/series?window=1d&tz=Asia/Tokyo&start=9999-12-25T00:00:00Z&end=9999-12-31T23:59:59Z",
        400,
        [
            "[9999-12-25T15:00:00Z, 10000-01-01T15:00:00Z)",
            "supported times [0001-01-01T00:00:00Z, 10000-01-01T00:00:00Z)",
            "send an earlier end",
        ],
    ),
    (
        f"{M}/series?window=1d&tz=Asia/Tokyo&start=9999-12-25T00:00:00Z&end=9999-12-31T15:00:00Z",
        200,
        [],
    ),
    (
        f"{M}/series?window=1d&tz=America/New_York&start=0001-01-01T00:00:00Z"
        "&end=0001-01-05T00:00:00Z",
        400,
        ["local midnight at 17762s past UTC midnight", "base window dividing 2s"],
    ),
    (
        f"{M}/series?window=1d&tz=Etc/GMT-14&start=0001-01-01T00:00:00Z&end=0001-01-05T00:00:00Z",
        200,
        [],
    ),
    (
        f"{M}/series?window=1d&tz=Etc/GMT%2B12&start=9999-12-25T00:00:00Z&end=9999-12-30T12:00:00Z",
        200,
        [],
    ),
    (f"{M}/top?window=1m&at=9999-12-31T23:59:59Z", 200, []),
    (f"{M}/top?window=1h&at=9999-12-31T23:59:59Z", 200, []),
    (f"{M}/top?window=1d&at=9999-12-31T23:59:59Z", 200, []),
    (
        f"{M}/top?window=7d&at=9999-12-31T23:59:59Z",
        400,
        ["the window holding `at`", "10000-01-01T00:00:00Z)", "send a smaller window"],
    ),
    (f"{M}/top?window=7d&at=0001-01-01T00:00:00Z", 400, ["0000-12-28T00:00:00Z", "smaller"]),
    (f"{M}/top?window=1d&at=0001-01-01T00:00:00Z", 200, []),
    (f"{M}/keys?start=0001-01-01T00:00:00Z&end=0001-01-01T01:00:00Z", 200, []),
    (f"{M}/top?window=1h&at=10000-01-01T00:00:00Z", 400, ["not a time", "years 1 to 9999"]),
    (f"{M}/top?window=1h&at=253402300800000", 400, ["not a time", "years 1 to 9999"]),
    (
        f"{M}/series?window=1h&start=2026-01-01 00:00:00Z&end=2026-01-02T00:00:00Z",
        400,
        ["start='2026-01-01 00:00:00Z' is not a time"],
    ),
    (f"{M}/series?window=1h&start=2026-01-01T01:00:00 01:00&end=2026-01-02T00:00:00Z", 200, []),
    (
        f"{M}/series?window=1h&start=%D9%A1%D9%A7%D9%A0%D9%A0&end=2026-01-02T00:00:00Z",
        400,
        ["start='\u0661\u0667\u0660\u0660' holds characters other than ASCII"],
    ),
    (
        "/v1/metrics/views_total/series?window=1m&start=2026-01-01T00:00:00Z"
        "&end=2026-02-05T00:00:00Z",
        400,
        ["50400 windows of 1m", "end=2026-02-04T17:20:00Z"],
    ),
    (
        f"{M}/series?window=60d&start=0&end=1",
        400,
        ["1 windows of 60d, 86400 x 1m cells each", "send a window of at most 50000m"],
    ),
]

HEADER_CASES: list[tuple[dict[str, str], list[str]]] = [
    ({f"x-h{n}": "v" for n in range(2000)}, ["header fields", "LAMBDA_SERVING__MAX_HEADERS"]),
    (
        {"x-big": "a" * (1 << 20)},
        ["bytes, more than the limit of 16384", "LAMBDA_SERVING__MAX_HEADER_BYTES"],
    ),
]


def check_corpus(get: Callable[..., httpx.Response]) -> None:
    for url, status, words in REPRODUCTIONS:
        answer = get(url)
        assert answer.status_code == status, (url, answer.text[:300])
        if status != 200:
            detail = answer.json()["detail"]
            for word in words:
                assert word in detail, (url, detail)
    for headers, words in HEADER_CASES:
        answer = get(f"{M}/series?window=1h&{DAY}", headers=headers)
        assert answer.status_code == 431, answer.text
        for word in words:
            assert word in answer.json()["detail"]


def test_every_reproduction_is_answered_with_what_to_send(platform: Platform) -> None:
    load_views(platform.settings, EVENTS, T0 + 3_600_000, seed=1)
    with TestClient(create_app(platform.settings)) as client:
        check_corpus(client.get)
        top = client.get(f"{M}/top?window=1h&at=9999-12-31T23:59:59Z").json()
        assert (top["start"], top["end"]) == ("9999-12-31T23:00:00Z", "10000-01-01T00:00:00Z")
        points = client.get(f"{M}/series?window=1h&{DAY}&q=0.000001,0.999999").json()["points"]
        assert points and {"p0.0001", "p99.9999"} <= set(points[0])


@pytest.fixture
def locked_batch_view(platform: Platform) -> Iterator[psycopg.Connection[Any]]:
    """A session holding the served row locked (as a long publication would): every query
    waits in PostgreSQL until it rolls back."""
    conn = psycopg.connect(platform.settings.postgres.url)
    conn.execute("LOCK TABLE served_view IN ACCESS EXCLUSIVE MODE")
    try:
        yield conn
    finally:
        conn.close()


def test_past_the_in_flight_limit_and_the_time_budget_the_api_answers_503(
    platform: Platform, tmp_path: Path, locked_batch_view: psycopg.Connection[Any]
) -> None:
    env = {
        **platform.env,
        "LAMBDA_SERVING__MAX_INFLIGHT_REQUESTS": "2",
        "LAMBDA_SERVING__REQUEST_TIMEOUT_S": "3",
    }
    query = f"{M}/series?window=1h&{DAY}"
    with (
        running_api(env, tmp_path / "serve.log") as (base, _),
        httpx.Client(base_url=base, timeout=30) as client,
        ThreadPoolExecutor(2) as pool,
    ):
        started = time.monotonic()
        held = [pool.submit(client.get, query) for _ in range(2)]
        time.sleep(1)  # both wait in PostgreSQL, in flight
        shed = client.get(query)
        assert shed.status_code == 503 and shed.headers["retry-after"] == "1", shed.text
        assert "limit of 2 requests in flight" in shed.json()["detail"]
        assert time.monotonic() - started < 3
        assert client.get("/healthz").status_code == 200  # exempt
        for answer in (h.result() for h in held):
            assert answer.status_code == 503 and answer.headers["retry-after"] == "3"
            assert "time budget of 3 s" in answer.json()["detail"]
        assert 3 <= time.monotonic() - started < 10
        with psycopg.connect(platform.settings.postgres.url, autocommit=True) as watch:
            eventually(  # the timed-out reads' statements are cancelled on the server
                lambda: watch.execute(
                    "SELECT count(*) FROM pg_stat_activity "
                    "WHERE datname = current_database() AND wait_event_type = 'Lock'"
                ).fetchone(),
                lambda waiting: waiting == (0,),
                timeout=5,
                what="the timed-out reads no longer waiting for the lock",
            )
        locked_batch_view.rollback()
        assert client.get(query).status_code == 200  # the cancelled reads left the pool sound
        exposed = client.get("/metrics").text
        assert "lambda_serving_shed_requests_total 1.0" in exposed
        route = 'route="/v1/metrics/{metric_name}/series"'
        assert f"lambda_serving_timed_out_requests_total{{{route}}} 2.0" in exposed


NAMES = [
    "window",
    "step",
    "start",
    "end",
    "at",
    "tz",
    "q",
    "prefix",
    "limit",
    "n",
    "by",
    "group_by",
    "page",
]
ODD_VALUES = [
    "1m",
    "1h",
    "1d",
    "7d",
    "36500d",
    "0",
    "-1",
    "1e-1000000",
    "0.5,0.9,0.99",
    "0.999999",
    "2026-01-01T00:00:00Z",
    "2026-01-01T01:30:00+01:00",
    "1767225600000",
    "0001-01-01T00:00:00Z",
    "9999-12-31T23:59:59.999Z",
    "10000-01-01T00:00:00Z",
    "253402300799999",
    "-62135596800000",
    "99999999999999999999999999999",
    "a\x00b",
    "\x00",
    "Europe/Berlin",
    "Pacific/Apia",
    "Asia/Tokyo",
    "America/New_York",
    "Etc/GMT-14",
    "A" * 1000,
    "9" * 1000,
    "p99",
    "count",
    "page",
    "/",
    "/a",
    "\u0661\u0662\u0663",
    "\u00b2",
    "NaN",
    "inf",
]
QUERY_VALUES = st.one_of(
    st.sampled_from(ODD_VALUES),
    st.text(max_size=40),
    st.integers(-(10**30), 10**30).map(str),
    st.integers(T0 - 2 * 86_400_000, T0 + 2 * 86_400_000).map(str),
    st.datetimes().map(lambda moment: moment.isoformat() + "Z"),
)
VALID = {
    "series": {"window": "1h", "start": "2026-01-01T00:00:00Z", "end": "2026-01-02T00:00:00Z"},
    "top": {"window": "1h", "at": "2026-01-01T00:30:00Z"},
    "keys": {"start": "2026-01-01T00:00:00Z", "end": "2026-01-02T00:00:00Z"},
}
KNOWN_NAMES = st.sampled_from(NAMES)
QUERIES = st.tuples(
    st.sampled_from(["views_by_page", "views_total"]),
    st.sampled_from(sorted(VALID)),
    st.lists(
        st.tuples(st.one_of(KNOWN_NAMES, KNOWN_NAMES, st.text(max_size=8)), QUERY_VALUES),
        max_size=4,
    ),
    st.tuples(KNOWN_NAMES, QUERY_VALUES, st.one_of(st.integers(0, 2), st.integers(0, 1500))),
)
"""A metric, a route, parameters changed or added to a valid query of it, and one more
repeated up to past the URL limit."""


def generated_query(query: tuple[str, str, list[tuple[str, str]], Any]) -> tuple[str, Any]:
    """The path and parameters of a generated query; the repeats are cut to reach just past
    `serving.max_url_bytes` (8 KiB), within what the client sends (64 KiB)."""
    metric, route, changes, (name, value, times) = query
    params = {**VALID[route], **dict(changes)}
    once = len(urlencode([(name, value)])) + 1
    repeated = [(name, value)] * min(times, 9 * 1024 // once + 1)
    return f"/v1/metrics/{metric}/{route}", [*params.items(), *repeated]


def test_a_memory_capped_api_survives_the_corpus_and_generated_queries(
    platform: Platform, tmp_path: Path
) -> None:
    load_views(platform.settings, EVENTS, T0 + 3_600_000, seed=2)
    log = tmp_path / "serve.log"
    with (
        running_api(platform.env, log, capped=True) as (base, process),
        httpx.Client(base_url=base, timeout=60) as client,
    ):
        # Every query runs under the cap, which the windows list of `start=0001-...` once
        # took whole (a MemoryError 500).
        check_corpus(client.get)

        @given(query=QUERIES)
        @settings(
            max_examples=200,
            derandomize=True,
            deadline=None,
            database=None,
            suppress_health_check=list(HealthCheck),
        )
        def no_server_error(query: tuple[str, str, list[tuple[str, str]], Any]) -> None:
            path, params = generated_query(query)
            answer = client.get(path, params=params)
            if answer.status_code >= 500:
                assert answer.status_code == 503 and "retry-after" in answer.headers, answer.text
                assert any(s in answer.json()["detail"] for s in BUDGET_503), answer.text
            assert answer.status_code == 200 or answer.json()["detail"], answer.text

        no_server_error()
        assert process.poll() is None, log.read_text()[-3000:]
        assert client.get("/healthz").status_code == 200
        assert "Traceback" not in log.read_text(), log.read_text()[-3000:]
