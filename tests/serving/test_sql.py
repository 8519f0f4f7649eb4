"""`POST /v1/sql` against the real stores: each statement's answer equals the HTTP API's
answer to the same question and the oracle's counts over the same events, across W; a
statement the dialect cannot answer is a 400 saying where and what to send."""

from __future__ import annotations

import os
import random
import socket
import struct
import subprocess
import time
from datetime import datetime
from typing import Any

import pandas as pd
import psycopg
import pytest
import sqlalchemy
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import SecretStr

from serving_layer import create_app
from serving_layer.timefmt import format_time
from shared.speed_view import redis_client
from tests.conftest import Platform
from tests.serving.api_process import free_port
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


def test_the_wire_protocol_answers_psql_psycopg_and_sqlalchemy(platform: Platform) -> None:
    settings = platform.settings
    port = free_port()
    serving = settings.serving.model_copy(update={"pg_port": port, "max_pg_connections": 2})
    wired = settings.model_copy(update={"serving": serving})
    events = random_events(random.Random(43), T0 - HOUR, T0 + HOUR, 900, PAGES)
    load_views(settings, events, W, 43)
    series = (
        "SELECT time_bucket('5m', ts) AS t, page, COUNT(*) AS views, AVG(latency_ms) AS avg "
        f"FROM views_by_page WHERE {SPAN} GROUP BY 1, 2"
    )
    dsn = f"host=127.0.0.1 port={port} user=reader dbname=lambda"
    with TestClient(create_app(wired)) as client:
        http = _sql(client, series, "arrays")["rows"]
        expected = [(datetime.fromisoformat(t), page, n, avg) for t, page, n, avg in http]
        assert len(expected) > 20

        # psycopg: the simple protocol, a prepared statement with parameters, binary results
        with psycopg.connect(dsn, autocommit=True) as conn:
            assert conn.execute(series).fetchall() == expected
            prepared = (
                "SELECT time_bucket('5m', ts) AS t, page, COUNT(*) AS views, AVG(latency_ms) "
                "AS avg FROM views_by_page WHERE ts >= %s AND ts < %s AND page = %s GROUP BY 1, 2"
            )
            bounds = (
                datetime.fromisoformat(format_time(T0 - HOUR)),
                datetime.fromisoformat(format_time(T0 + HOUR)),
            )
            for _ in range(3):  # the third execution runs the server-side prepared statement
                rows = conn.execute(prepared, (*bounds, "/a"), prepare=True).fetchall()
                assert rows == [row for row in expected if row[1] == "/a"]
            with conn.cursor(binary=True) as cursor:
                assert cursor.execute(series).fetchall() == expected
            with pytest.raises(psycopg.errors.SyntaxError) as refused:
                conn.execute(f"SELECT STDDEV(latency_ms) FROM views_by_page WHERE {SPAN}")
            assert refused.value.diag.statement_position == "8"
            assert "it answers COUNT(*)" in str(refused.value)
            with pytest.raises(psycopg.errors.ReadOnlySqlTransaction, match="read-only"):
                conn.execute("DELETE FROM views_by_page")

        # SQLAlchemy's inspector and pandas.read_sql
        engine = sqlalchemy.create_engine(
            f"postgresql+psycopg://reader@127.0.0.1:{port}/lambda",
            connect_args={"cursor_factory": psycopg.ClientCursor},
        )
        try:
            inspector = sqlalchemy.inspect(engine)
            assert set(inspector.get_table_names()) == {"views_by_page", "views_total"}
            columns = {c["name"]: str(c["type"]) for c in inspector.get_columns("views_by_page")}
            assert columns == {"ts": "TIMESTAMP", "page": "TEXT", "source": "TEXT"}
            with engine.connect() as conn:
                frame = pd.read_sql(sqlalchemy.text(series), conn)
            assert list(frame.columns) == ["t", "page", "views", "avg"]
            assert frame["views"].sum() == len(events)
        finally:
            engine.dispose()

        # psql, as a person would use it
        psql = ["psql", "-X", "-h", "127.0.0.1", "-p", str(port), "-U", "reader", "-d", "lambda"]
        env = {**os.environ, "PGCONNECT_TIMEOUT": "5"}

        def run(*args: str) -> str:
            done = subprocess.run(
                [*psql, *args], capture_output=True, text=True, timeout=30, env=env, check=False
            )
            assert done.returncode == 0, done.stderr
            return done.stdout

        listed = run("-c", "\\dt")
        assert "views_by_page" in listed and "views_total" in listed, listed
        described = run("-c", "\\d views_by_page")
        assert "timestamptz" in described and "page" in described, described
        answered = run("-A", "-t", "-F", ",", "-c", series)
        assert len(answered.splitlines()) == len(expected)
        total = sum(int(line.split(",")[2]) for line in answered.splitlines())
        assert total == len(events)

        # Grafana's PostgreSQL data source, as its macro engine expands a time-series panel
        # (pkg/tsdb/grafana-postgresql-datasource/macros.go: $__timeFilter is BETWEEN two
        # RFC 3339 UTC times, $__timeGroup floor(extract(epoch ...)/s)*s, or time_bucket with
        # the TimescaleDB option), sent as one simple query, as pgx's Exec sends it
        assert (
            run(
                "-A", "-t", "-c", "SELECT current_setting('server_version_num')::int/100 as version"
            )
            == "1600\n"
        )
        per_5m: dict[str, int] = {}
        for t, _, n, _ in http:
            per_5m[t] = per_5m.get(t, 0) + n
        last = format_time(T0 + HOUR - 5 * MINUTE)  # BETWEEN holds the window starting there
        window = f"ts BETWEEN '{format_time(T0 - HOUR)}' AND '{last}'"
        for bucket, as_epoch in (
            ("floor(extract(epoch from ts)/300)*300", True),
            ("time_bucket('300.000s',ts)", False),
        ):
            panel = (
                f'SELECT {bucket} AS "time", count(*) AS "views" FROM views_by_page '
                f"WHERE {window} GROUP BY 1 ORDER BY 1"
            )
            lines = run("-A", "-t", "-F", ",", "-c", panel).splitlines()
            starts = [
                str(int(datetime.fromisoformat(t).timestamp())) if as_epoch else t for t in per_5m
            ]
            shown = [line.split(",") for line in lines]
            assert [n for _, n in shown] == [str(n) for n in per_5m.values()], panel
            if as_epoch:
                assert [t for t, _ in shown] == starts, panel

        # hostile clients are dropped without harming the others: garbage, a 1 GB length, a
        # client that never finishes its startup; past max_pg_connections a client is refused
        client.app.state.wire.startup_timeout_s = 0.5  # type: ignore[attr-defined]

        def answer_to(data: bytes, closes: bool = True) -> bytes:
            """What the server sends back, until it closes the connection (or, with `closes`
            false, until it has been quiet for a second)."""
            with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
                sock.sendall(data)
                sock.settimeout(10 if closes else 1)
                chunks = []
                try:
                    while chunk := sock.recv(65536):
                        chunks.append(chunk)
                except TimeoutError:
                    assert not closes, "the server kept the connection open"
                return b"".join(chunks)

        startup = struct.pack("!ii", 8, 196608)  # protocol 3.0, no parameters
        with psycopg.connect(dsn, autocommit=True) as kept:
            assert answer_to(struct.pack("!ii", 1 << 30, 196608)) == b""  # a 1 GB startup packet
            assert answer_to(b"") == b""  # silent: dropped at the startup timeout
            garbage = answer_to(startup + b"\xff" * 64, closes=False)
            assert garbage.startswith(b"R") and b"E" in garbage  # answered with errors
            assert b"unsupported message type" in garbage
            huge = answer_to(startup + b"Q" + struct.pack("!i", 1 << 30))  # a 1 GB query
            assert huge.startswith(b"R") and b"Z" in huge  # it got as far as the query: dropped
            with (
                psycopg.connect(dsn, autocommit=True),
                pytest.raises(psycopg.OperationalError, match="too many connections"),
            ):
                psycopg.connect(dsn, connect_timeout=5)
            assert kept.execute(series).fetchall() == expected

    # with tokens configured, a reader token is the password (any user name)
    port = free_port()
    serving = settings.serving.model_copy(update={"pg_port": port})
    auth = settings.auth.model_copy(update={"reader_tokens": (SecretStr("reader-secret"),)})
    guarded = settings.model_copy(update={"serving": serving, "auth": auth})
    dsn = f"host=127.0.0.1 port={port} user=anyone dbname=lambda"
    with TestClient(create_app(guarded)):
        with psycopg.connect(f"{dsn} password=reader-secret", autocommit=True) as conn:
            assert conn.execute(series).fetchall() == expected
        for wrong in ("password=nope", "password=reader-secre"):
            with pytest.raises(psycopg.OperationalError, match="password"):
                psycopg.connect(f"{dsn} {wrong}", connect_timeout=5)


QUESTION_WINDOWS = {"1m": MINUTE, "5m": 5 * MINUTE, "1h": HOUR, "20m": 20 * MINUTE}


@st.composite
def questions(draw: st.DrawFn) -> dict[str, Any]:
    """A question asked both ways: its shape, window, range (across W), filters, grouping,
    aggregates and quantile."""
    window = draw(st.sampled_from(sorted(QUESTION_WINDOWS)))
    size = QUESTION_WINDOWS[window]
    first = draw(st.integers(-3, 2))
    count = draw(st.integers(1, 4))
    start = T0 + first * size
    shape = draw(st.sampled_from(["series", "total", "top"]))
    if shape == "total":  # one window the HTTP API can ask for too: aligned to its length
        start = start // (count * size) * (count * size)
    pages = draw(
        st.one_of(st.none(), st.lists(st.sampled_from(PAGES), min_size=1, max_size=2, unique=True))
    )
    return {
        "shape": shape,
        "window": window,
        "start": start,
        "end": start + count * size,
        "pages": pages,
        "group": draw(st.booleans()),
        "q": draw(st.sampled_from(["0.5", "0.9", "0.99"])),
    }


def _ask(client: TestClient, question: dict[str, Any]) -> tuple[list[Any], list[Any]]:
    """The question's rows as POST /v1/sql answers it and as the HTTP API does, alike."""
    shape, window, q = question["shape"], question["window"], question["q"]
    start, end = question["start"], question["end"]
    where = f"ts >= '{format_time(start)}' AND ts < '{format_time(end)}'"
    params: dict[str, Any] = {"start": format_time(start), "end": format_time(end)}
    if question["pages"]:
        listed = ", ".join(f"'{p}'" for p in question["pages"])
        where += f" AND page IN ({listed})"
        params["page"] = question["pages"]
    if shape == "top":
        end = start + QUESTION_WINDOWS[window]
        where = where.replace(format_time(question["end"]), format_time(end))
        body = _sql(
            client,
            f"SELECT page, APPROX_PERCENTILE(latency_ms, {q}) AS p FROM views_by_page "
            f"WHERE {where} GROUP BY page ORDER BY p DESC LIMIT 2",
            "arrays",
        )
        top = client.get(
            "/v1/metrics/views_by_page/top",
            params={
                **({"page": question["pages"]} if question["pages"] else {}),
                "window": window,
                "at": format_time(start),
                "by": f"p{float(q) * 100:g}",
                "n": "2",
                "q": q,
                "group_by": "page",
            },
        )
        assert top.status_code == 200, top.text
        return body["rows"], [[i["key"]["page"], i["value"]] for i in top.json()["items"]]
    group = ", page" if question["group"] else ""
    head = f"time_bucket('{window}', ts) AS t, " if shape == "series" else ""
    body = _sql(
        client,
        f"SELECT {head}COUNT(*) AS n, MIN(latency_ms), APPROX_COUNT_DISTINCT(user_id), "
        f"APPROX_PERCENTILE(latency_ms, {q}) AS p{group} FROM views_by_page WHERE {where} "
        f"GROUP BY {'1' if head else ''}{group.lstrip(', ') if not head else group}",
        "arrays",
    )
    size = window if shape == "series" else f"{(end - start) // MINUTE}m"
    api = {**params, "window": size, "q": q}
    if question["group"]:
        api["group_by"] = "page"
    answer = client.get("/v1/metrics/views_by_page/series", params=api)
    assert answer.status_code == 200, answer.text
    shown = answer.json()
    groups = shown["groups"] if question["group"] else [{"key": {}, "points": shown["points"]}]
    pname = f"p{float(q) * 100:g}"
    rows = sorted(
        [
            *([p["start"]] if head else []),
            p["count"],
            p["min"],
            p["distinct_user_id"],
            p[pname],
            *([g["key"]["page"]] if question["group"] else []),
        ]
        for g in groups
        for p in g["points"]
        if shape == "series" or p["start"] == format_time(start)
    )
    return sorted(body["rows"], key=lambda r: [str(v) for v in r]), sorted(
        rows, key=lambda r: [str(v) for v in r]
    )


def test_random_questions_answer_alike_in_sql_and_http_and_count_as_the_oracle(
    platform: Platform,
) -> None:
    events = random_events(random.Random(47), T0 - 3 * HOUR, T0 + 2 * HOUR, 2000, PAGES)
    load_views(platform.settings, events, W, 47)
    with TestClient(create_app(platform.settings)) as client:

        @settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
        @given(questions())
        def alike(question: dict[str, Any]) -> None:
            in_sql, in_http = _ask(client, question)
            assert in_sql == in_http, question
            if question["shape"] != "top":
                pages = set(question["pages"] or PAGES)
                span = (
                    question["end"] - question["start"]
                    if question["shape"] == "total"
                    else QUESTION_WINDOWS[question["window"]]
                )
                counted = sum(r[1 if question["shape"] == "series" else 0] for r in in_sql)
                starts = range(question["start"], question["end"], span)
                assert counted == sum(
                    1
                    for e in events
                    if e.key[0] in pages and any(s <= e.time_ms < s + span for s in starts)
                ), question

        alike()
        # after a run: another generation published, W later; the same questions again
        later = W + HOUR
        redis_client(platform.settings.redis).flushdb()  # the speed view rebuilt past it
        load_views(platform.settings, events, later, 47)
        deadline = time.monotonic() + 10  # the process learns the publication by notification
        while _sql(client, f"EXPLAIN SELECT COUNT(*) FROM views_by_page WHERE {SPAN}")[
            "batch_watermark"
        ] != format_time(later):
            assert time.monotonic() < deadline, "the publication was not seen"
            time.sleep(0.05)
        alike()
