"""Query-time slicing against brute force: filters (`dim=value`, repeated for any of several),
`group_by` a subset of the key, and totals (every other dimension merged: states merged,
sketches unioned) on `series`, `top` and `keys`, across W (batch, mixed and speed windows).
The views are written straight in the stores' formats from one list of events, so the
expected answer of any slice is the aggregate over the events it covers."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import httpx
import pytest
from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families

from serving_layer import create_app
from serving_layer.timefmt import format_time, parse_time
from shared.config import Settings
from shared.metric_plan import MetricPlan
from shared.windows import point_source, window_starts
from tests.conftest import Platform, reconfigured
from tests.oracle import compare
from tests.serving.api_process import running_api
from tests.serving.views import Event, batch_rows, expected, publish, write_speed

pytestmark = [pytest.mark.services, pytest.mark.timeout(300)]

MINUTE, HOUR, DAY = 60_000, 3_600_000, 86_400_000
T0 = 1_767_225_600_000  # 2026-01-01T00:00:00Z
W = T0 + 7 * HOUR + 13 * MINUTE
COUNTRIES = ["de", "fr", "nl"]
PAGES = ["/", "/a", "/b", "/c"]
SERIES = "/v1/metrics/by_country_page/series"
TOP = "/v1/metrics/by_country_page/top"


def _settings(
    platform: Platform, max_cells: int = 50_000, windows: tuple[str, ...] = ("1m", "1h", "1d")
) -> Settings:
    return reconfigured(platform, **_sections(max_cells, windows)).settings


def _sections(max_cells: int, windows: tuple[str, ...]) -> dict[str, Any]:
    """The config sections of these tests: one metric keyed by country and page."""
    config: dict[str, Any] = {}
    config["metrics"] = [
        {
            "name": "by_country_page",
            "source": "pageviews",
            "key": ["country", "page"],
            "value": "latency_ms",
            "aggregations": [
                *("count", "sum", "min", "max", "avg"),
                "distinct(user_id)",
                "quantiles(latency_ms)",
            ],
            "windows": list(windows),
            "grace": "2m",
        }
    ]
    config["serving"] = {"max_cells": max_cells}
    return config


def _events(seed: int = 3) -> list[Event]:
    rng = random.Random(seed)
    return [
        Event(
            rng.randrange(T0 - DAY, T0 + DAY),
            (rng.choice(COUNTRIES), rng.choice(PAGES)),
            round(rng.uniform(-50, 500), 3),
            f"u{rng.randrange(300)}",
        )
        for _ in range(4000)
    ]


@pytest.fixture
def sliced(platform: Platform) -> Iterator[tuple[TestClient, MetricPlan, list[Event]]]:
    settings = _settings(platform)
    metric = settings.plan("by_country_page")
    assert metric is not None
    events = _events()
    publish(settings, batch_rows(settings, metric, events, W), {metric.name: W})
    write_speed(settings, metric, events, W)
    with TestClient(create_app(settings)) as client:
        yield client, metric, events


def _brute_series(
    metric: MetricPlan,
    events: list[Event],
    window_ms: int,
    span: tuple[int, int],
    keep: Callable[[Event], bool],
    group_of: Callable[[Event], tuple[str, ...]],
) -> tuple[dict[Any, dict[str, Any]], dict[Any, str]]:
    cells: dict[Any, list[Event]] = {}
    for start in window_starts(span[0], span[1], window_ms):
        for e in events:
            if start <= e.time_ms < start + window_ms and keep(e):
                cells.setdefault((group_of(e), start), []).append(e)
    want = {cell: expected(metric, es) for cell, es in cells.items()}
    sources = {cell: point_source(cell[1], cell[1] + window_ms, W) for cell in cells}
    return want, sources


def _got(groups: list[tuple[tuple[str, ...], list[dict[str, Any]]]]) -> tuple[dict, dict]:
    got, sources = {}, {}
    for group, points in groups:
        for p in points:
            cell = (group, parse_time(p["start"]))
            got[cell] = {k: v for k, v in p.items() if k not in ("start", "end", "source")}
            sources[cell] = p["source"]
    return got, sources


@pytest.mark.parametrize(
    ("window", "window_ms", "span"),
    [
        ("1h", HOUR, (T0, T0 + 12 * HOUR)),
        ("1d", DAY, (T0 - DAY, T0 + DAY)),
        ("1m", MINUTE, (W - 20 * MINUTE, W + 20 * MINUTE)),
    ],
)
def test_totals_filters_and_group_by_equal_brute_force(
    sliced: tuple[TestClient, MetricPlan, list[Event]],
    window: str,
    window_ms: int,
    span: tuple[int, int],
) -> None:
    client, metric, events = sliced
    base = {"window": window, "start": format_time(span[0]), "end": format_time(span[1])}
    cases: list[
        tuple[dict[str, Any], Callable[[Event], bool], Callable[[Event], tuple[str, ...]]]
    ] = [
        ({}, lambda e: True, lambda e: ()),
        ({"country": "de"}, lambda e: e.key[0] == "de", lambda e: ()),
        (
            {"country": ["de", "fr"], "group_by": "page"},
            lambda e: e.key[0] in ("de", "fr"),
            lambda e: (e.key[1],),
        ),
        ({"group_by": "country,page"}, lambda e: True, lambda e: e.key),
        (
            {"group_by": "page,country", "page": "/a"},
            lambda e: e.key[1] == "/a",
            lambda e: (e.key[1], e.key[0]),
        ),
    ]
    for params, keep, group_of in cases:
        response = client.get(SERIES, params={**base, **params})
        assert response.status_code == 200, (params, response.text)
        body = response.json()
        assert body["batch_watermark"] == format_time(W) and body["speed_status"] == "ok"
        if "group_by" in params:
            group_by = params["group_by"].split(",")
            assert body["group_by"] == group_by and body["truncated"] is False
            keys = [tuple(g["key"][d] for d in group_by) for g in body["groups"]]
            assert keys == sorted(keys), "groups ascend by key"
            got, got_sources = _got(
                [(k, g["points"]) for k, g in zip(keys, body["groups"], strict=True)]
            )
        else:
            fixed = {d: v for d, v in params.items() if isinstance(v, str)}
            assert body["key"] == fixed
            got, got_sources = _got([((), body["points"])])
        want, want_sources = _brute_series(metric, events, window_ms, span, keep, group_of)
        assert compare(want, got) == [], params
        assert got_sources == want_sources, params
    want_kinds = {"1m": {"batch", "speed"}, "1h": {"batch", "mixed", "speed"}}
    assert set(got_sources.values()) == want_kinds.get(window, {"batch", "mixed"})


def test_every_dimension_fixed_answers_one_key_as_before(
    sliced: tuple[TestClient, MetricPlan, list[Event]],
) -> None:
    client, _metric, _events = sliced
    params = {"window": "1h", "start": format_time(T0), "end": format_time(T0 + DAY)}
    one = client.get(SERIES, params={**params, "country": "nl", "page": "/b"}).json()
    assert one["key"] == {"country": "nl", "page": "/b"} and "filters" not in one
    grouped = client.get(SERIES, params={**params, "group_by": "country,page"}).json()
    (same,) = [g for g in grouped["groups"] if g["key"] == {"country": "nl", "page": "/b"}]
    assert same["points"] == one["points"]


def test_top_ranks_groups_after_filters(sliced: tuple[TestClient, MetricPlan, list[Event]]) -> None:
    client, metric, events = sliced
    for at, by in ((T0 + 2 * HOUR, "count"), (W, "p99"), (T0 + 10 * HOUR, "sum")):
        start = at - at % HOUR
        response = client.get(
            TOP,
            params={
                "window": "1h",
                "at": format_time(at),
                "by": by,
                "group_by": "country",
                "page": ["/", "/a"],
            },
        )
        assert response.status_code == 200, response.text
        inside: dict[str, list[Event]] = {}
        for e in events:
            if start <= e.time_ms < start + HOUR and e.key[1] in ("/", "/a"):
                inside.setdefault(e.key[0], []).append(e)
        want = {(c,): expected(metric, es)[by] for c, es in inside.items()}
        items = response.json()["items"]
        assert [i["key"] for i in items] == [
            {"country": c} for (c,), _ in sorted(want.items(), key=lambda kv: (-kv[1], kv[0]))
        ]
        assert (
            compare(
                {k: {by: v} for k, v in want.items()},
                {(i["key"]["country"],): {by: i["value"]} for i in items},
            )
            == []
        )


def test_keys_after_filters(sliced: tuple[TestClient, MetricPlan, list[Event]]) -> None:
    client, _metric, events = sliced
    span = {"start": format_time(T0), "end": format_time(T0 + 12 * HOUR)}
    body = client.get("/v1/metrics/by_country_page/keys", params={**span, "country": "fr"}).json()
    want = sorted({e.key for e in events if T0 <= e.time_ms < T0 + 12 * HOUR and e.key[0] == "fr"})
    assert [(k["country"], k["page"]) for k in body["keys"]] == want


@pytest.mark.parametrize(
    ("params", "words"),
    [
        ({"window": "1h", "nope": "x"}, ["unknown parameter 'nope'", "country, page"]),
        ({"window": "1h", "group_by": "city"}, ["group_by='city'", "country, page"]),
        ({"window": "1h", "group_by": "page,page"}, ["group_by="]),
        ({"window": "1h", "group_by": "page", "limit": "0"}, ["limit must be between 1 and"]),
        ({"window": "1m", "group_by": "country,page"}, ["reads more than 400 cells", "MAX_CELLS"]),
        (
            {"window": "1m", "end": format_time(T0 + 8 * HOUR)},
            ["spans 480 cells", "limit of 400", "narrow"],
        ),
    ],
)
def test_bad_slices_are_400_saying_what_to_send(
    platform: Platform, params: dict[str, str], words: list[str]
) -> None:
    settings = _settings(platform, max_cells=400)
    metric = settings.plan("by_country_page")
    assert metric is not None
    events = _events()
    publish(settings, batch_rows(settings, metric, events, W), {metric.name: W})
    span = {"start": format_time(T0), "end": format_time(T0 + 6 * HOUR)}
    with TestClient(create_app(settings)) as client:
        response = client.get(SERIES, params={**span, **params})
    assert response.status_code == 400, response.text
    for word in words:
        assert word in response.json()["detail"]


def _windows_of(
    metric: MetricPlan,
    events: list[Event],
    bounds: list[tuple[int, int]],
    keep: Callable[[Event], bool],
) -> dict[Any, dict[str, Any]]:
    out = {}
    for start, end in bounds:
        inside = [e for e in events if start <= e.time_ms < end and keep(e)]
        if inside:
            out[((), start, end)] = expected(metric, inside)
    return out


def _points(body: dict[str, Any]) -> dict[Any, dict[str, Any]]:
    return {
        ((), parse_time(p["start"]), parse_time(p["end"])): {
            k: v for k, v in p.items() if k not in ("start", "end", "source")
        }
        for p in body["points"]
    }


def test_any_multiple_of_the_base_cell_and_hopping_windows(
    sliced: tuple[TestClient, MetricPlan, list[Event]],
) -> None:
    client, metric, events = sliced
    span = (W - 3 * HOUR, W + 3 * HOUR)
    base = {"start": format_time(span[0]), "end": format_time(span[1])}
    for params, size, step in (
        ({"window": "15m", "country": "de", "page": "/a"}, 15 * MINUTE, 15 * MINUTE),
        ({"window": "2h", "step": "1h"}, 2 * HOUR, HOUR),
        ({"window": "1h", "step": "20m", "page": "/"}, HOUR, 20 * MINUTE),
    ):
        response = client.get(SERIES, params={**base, **params})
        assert response.status_code == 200, (params, response.text)
        body = response.json()
        assert body["window"] == params["window"] and body.get("step") == params.get("step")
        first = -(-span[0] // step) * step
        bounds = [(s, s + size) for s in range(first, span[1], step)]
        fixed = {d: v for d, v in params.items() if d in ("country", "page")}

        def keep(e: Event, fixed: dict[str, str] = fixed) -> bool:
            return all(e.key[("country", "page").index(d)] == v for d, v in fixed.items())

        assert compare(_windows_of(metric, events, bounds, keep), _points(body)) == [], params
        sources = {p["source"] for p in body["points"]}
        assert sources == {"batch", "mixed", "speed"}, params


DST = 1_774_742_400_000  # 2026-03-29T00:00:00Z: Europe/Berlin moves to summer time at 01:00Z


def test_days_in_a_time_zone_across_a_dst_change(platform: Platform) -> None:
    settings = _settings(platform)
    metric = settings.plan("by_country_page")
    assert metric is not None
    rng = random.Random(8)
    events = [
        Event(rng.randrange(DST - 3 * DAY, DST + 3 * DAY), ("de", "/"), rng.uniform(0, 99), "u1")
        for _ in range(3000)
    ]
    watermark = DST + 5 * HOUR
    publish(settings, batch_rows(settings, metric, events, watermark), {metric.name: watermark})
    write_speed(settings, metric, events, watermark)
    span = {"start": format_time(DST - 2 * DAY), "end": format_time(DST + 2 * DAY)}
    with TestClient(create_app(settings)) as client:
        body = client.get(SERIES, params={**span, "window": "1d", "tz": "Europe/Berlin"}).json()
    assert body["tz"] == "Europe/Berlin"
    hours = [(parse_time(p["end"]) - parse_time(p["start"])) // HOUR for p in body["points"]]
    starts = [p["start"] for p in body["points"]]
    assert starts == [
        "2026-03-27T23:00:00Z",  # local midnights: CET (+1) before, CEST (+2) after
        "2026-03-28T23:00:00Z",
        "2026-03-29T22:00:00Z",
        "2026-03-30T22:00:00Z",
    ]
    assert hours == [24, 23, 24, 24]
    bounds = [(parse_time(p["start"]), parse_time(p["end"])) for p in body["points"]]
    assert compare(_windows_of(metric, events, bounds, lambda e: True), _points(body)) == []


def test_a_zone_off_the_base_cell_is_a_400_naming_the_cell_it_needs(platform: Platform) -> None:
    settings = _settings(platform, windows=("1h", "1d"))
    span = {"start": format_time(T0), "end": format_time(T0 + 3 * DAY)}
    with TestClient(create_app(settings)) as client:
        response = client.get(SERIES, params={**span, "window": "1d", "tz": "Asia/Kolkata"})
    assert response.status_code == 400, response.text
    detail = response.json()["detail"]
    assert "tz=Asia/Kolkata" in detail and "1h cell" in detail and "dividing 30m" in detail


def test_sliced_batch_windows_are_cached_for_one_publication_only(
    platform: Platform, sliced: tuple[TestClient, MetricPlan, list[Event]]
) -> None:
    """A repeated slice is answered from the cache of its batch-only windows; a publication
    (a new served row) makes it read the new cells."""
    client, metric, events = sliced
    settings = _settings(platform)
    span = (T0 - 12 * HOUR, T0 + 12 * HOUR)
    params = {
        "window": "1h",
        "start": format_time(span[0]),
        "end": format_time(span[1]),
        "group_by": "country",
    }

    def batch_only(body: dict[str, Any]) -> tuple[dict, dict]:
        got, sources = _got([((g["key"]["country"],), g["points"]) for g in body["groups"]])
        return {c: v for c, v in got.items() if sources[c] == "batch"}, sources

    first = client.get(SERIES, params=params).json()
    read = _batch_rows_read(client.get("/metrics").text)
    assert read > 0
    assert client.get(SERIES, params=params).json() == first
    # Only the window straddling W is read again: its batch cells (a few keys' minutes).
    assert _batch_rows_read(client.get("/metrics").text) - read < read / 10
    more = events + _events(seed=4)
    publish(settings, batch_rows(settings, metric, more, W), {metric.name: W})
    after = client.get(SERIES, params=params).json()
    got, sources = batch_only(after)
    assert got and set(sources.values()) == {"batch", "mixed", "speed"}
    want, _ = _brute_series(metric, more, HOUR, span, lambda e: True, lambda e: (e.key[0],))
    assert compare({c: v for c, v in want.items() if c[1] + HOUR <= W}, got) == []
    assert got != batch_only(first)[0]


def _batch_rows_read(exposition: str) -> float:
    """The batch rows the API's series answers read so far, from its Prometheus metrics."""
    for family in text_string_to_metric_families(exposition):
        for sample in family.samples:
            if sample.name == "lambda_serving_merge_cells_sum" and sample.labels == {
                "endpoint": "series",
                "layer": "batch",
            }:
                return sample.value
    return 0.0


def test_identical_cold_slices_read_the_batch_view_once(platform: Platform, tmp_path: Path) -> None:
    """After a publication every cached batch point is stale; the dashboards polling one
    query then miss together. The first request reads and merges the cells, the identical
    ones arriving meanwhile wait for it and answer from its points."""
    served = reconfigured(platform, **_sections(50_000, ("1m", "1h", "1d")))
    metric = served.settings.plan("by_country_page")
    assert metric is not None
    events = _events()
    rows = batch_rows(served.settings, metric, events, W)
    publish(served.settings, rows, {metric.name: W})
    url = (
        SERIES
        + "?"
        + urlencode({"window": "1m", "start": format_time(T0 - DAY), "end": format_time(T0)})
    )

    async def requests(base: str, n: int) -> tuple[list[bytes], float]:
        async with httpx.AsyncClient(base_url=base, timeout=60) as http:
            before = _batch_rows_read((await http.get("/metrics")).text)
            answers = await asyncio.gather(*(http.get(url) for _ in range(n)))
            after = _batch_rows_read((await http.get("/metrics")).text)
        assert all(a.status_code == 200 for a in answers), answers[0].text
        return [a.content for a in answers], after - before

    with running_api(served.env, tmp_path / "api.log") as (base, _):
        (alone,), read_alone = asyncio.run(requests(base, 1))
        publish(served.settings, rows, {metric.name: W})  # the same cells, a new served row
        answers, read_together = asyncio.run(requests(base, 8))
    assert read_alone > 1000
    assert answers == [alone] * 8
    # Without waiting, each of the 8 would read them all (8 x read_alone).
    assert read_together < 2 * read_alone, (read_alone, read_together)
