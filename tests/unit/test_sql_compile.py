"""The SQL dialect compiled without services: which query a statement becomes, the columns it
answers, its bound parameters, and where a refusal points."""

from __future__ import annotations

from decimal import Decimal

import pytest

from serving_layer.query import SeriesQuery, SessionsQuery, TopQuery, TotalQuery
from serving_layer.sql import SqlError, columns_of, compile_sql
from shared.config import Settings

SETTINGS = Settings(
    sources=[{"name": "pv", "topic": "pv", "time_field": "ts"}],
    metrics=[
        {
            "name": "views",
            "source": "pv",
            "key": ["country", "page"],
            "value": "latency_ms",
            "aggregations": ["count", "sum", "distinct(user_id)", "quantiles(latency_ms)"],
            "windows": ["1m", "1h"],
        },
        {
            "name": "visits",
            "source": "pv",
            "key": ["user_id"],
            "aggregations": ["count"],
            "session": {"gap": "30m", "max_duration": "4h"},
            "windows": ["1h"],
        },
    ],
)
DAY = "ts >= '2026-12-01' AND ts < '2026-12-02'"


def test_a_bucketed_statement_is_a_series_with_typed_columns() -> None:
    statement = compile_sql(
        SETTINGS,
        "SELECT time_bucket('15 minutes', ts, 'Europe/Berlin') AS t, page, COUNT(*), "
        "APPROX_PERCENTILE(latency_ms, 0.999) AS slow FROM views "
        f"WHERE {DAY} AND country IN ('de', 'fr') GROUP BY 1, page",
    )
    query = statement.query
    assert isinstance(query, SeriesQuery)
    assert (query.spec.size_ms, str(query.spec.tz)) == (15 * 60_000, "Europe/Berlin")
    assert query.selection.group_by == ("page",)
    assert query.selection.filters == (("country", frozenset({"de", "fr"})),)
    assert query.options.quantiles == (Decimal("0.999"),)
    assert [(c.name, c.type) for c in statement.columns] == [
        ("t", "timestamptz"),
        ("page", "text"),
        ("count", "bigint"),
        ("slow", "double precision"),
    ]


def test_no_bucket_is_a_total_and_a_descending_aggregate_a_ranking() -> None:
    total = compile_sql(SETTINGS, f"SELECT SUM(latency_ms) FROM views WHERE {DAY}").query
    assert isinstance(total, TotalQuery) and total.end_ms - total.start_ms == 86_400_000
    top = compile_sql(
        SETTINGS,
        "SELECT page, APPROX_COUNT_DISTINCT(user_id) AS users FROM views WHERE "
        "ts >= '2026-12-01T10:00:00Z' AND ts < '2026-12-01T11:00:00Z' GROUP BY page "
        "ORDER BY users DESC LIMIT 3",
    ).query
    assert isinstance(top, TopQuery) and (top.by, top.n) == ("distinct_user_id", 3)


def test_a_session_metric_is_a_table_of_its_sessions() -> None:
    listing = compile_sql(
        SETTINGS,
        f"SELECT ts, \"end\", events, duration_s FROM visits WHERE user_id = 'u1' AND {DAY}",
    )
    assert isinstance(listing.query, SessionsQuery) and listing.query.key == ("u1",)
    assert [c.type for c in listing.columns] == [
        "timestamptz",
        "timestamptz",
        "bigint",
        "double precision",
    ]
    hourly = compile_sql(
        SETTINGS,
        "SELECT time_bucket('1h', ts), COUNT(*), COUNT(*) FILTER (WHERE events = 1), "
        "SUM(events), MAX(duration_s), APPROX_PERCENTILE(duration_s, 0.5) FROM visits "
        f"WHERE {DAY} GROUP BY 1",
    )
    assert isinstance(hourly.query, SeriesQuery)
    assert [c.name for c in hourly.columns] == [
        "ts",
        "sessions",
        "bounces",
        "count",
        "duration_max_s",
        "duration_p50_s",
    ]
    with pytest.raises(SqlError, match="group by a time bucket"):
        compile_sql(SETTINGS, f"SELECT COUNT(*) FROM visits WHERE {DAY}")


def test_parameters_are_bound_and_describe_needs_none() -> None:
    text = (
        "SELECT time_bucket('1h', ts), COUNT(*) FROM views WHERE ts >= $1 AND ts < $2 "
        "AND page = $3 GROUP BY 1"
    )
    statement = compile_sql(SETTINGS, text, ["2026-12-01 00:00:00", "2026-12-02", "/a"])
    query = statement.query
    assert isinstance(query, SeriesQuery)
    assert query.selection.filters == (("page", frozenset({"/a"})),)
    assert (
        query.start_ms == 1_796_083_200_000
    )  # 2026-12-01T00:00:00Z: a time without an offset is UTC
    assert [c.name for c in columns_of(SETTINGS, text)] == ["ts", "count"]
    with pytest.raises(SqlError, match=r"\$3 is not bound"):
        compile_sql(SETTINGS, text, ["2026-12-01", "2026-12-02"])


@pytest.mark.parametrize(
    ("text", "position", "said"),
    [
        (f"SELECT COUNT(*) FROM nope WHERE {DAY}", 22, "unknown metric 'nope'"),
        (
            f"SELECT MIN(latency_ms) FROM views WHERE {DAY}",
            8,
            "it answers COUNT(*), SUM(latency_ms)",
        ),
        (f"SELECT COUNT(*) FROM views WHERE {DAY} AND city = 'x'", 79, "no dimension 'city'"),
        (
            "SELECT COUNT(*) FROM views WHERE ts > '2026-12-01' AND ts < '2026-12-02'",
            34,
            "half-open",
        ),
        ("SELECT COUNT(*) FROM views WHERE", None, "cannot parse"),
    ],
)
def test_a_refusal_points_at_the_statement(text: str, position: int | None, said: str) -> None:
    with pytest.raises(SqlError) as refused:
        compile_sql(SETTINGS, text)
    assert said in refused.value.message
    if position is not None:
        assert refused.value.position == position
        assert refused.value.message.startswith(f"line 1, column {position}: ")


def test_writes_are_refused_as_read_only() -> None:
    with pytest.raises(SqlError) as refused:
        compile_sql(SETTINGS, "DELETE FROM views")
    assert refused.value.sqlstate == "25006"
