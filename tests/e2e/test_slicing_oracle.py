"""Sliced, hopping and zoned queries through the whole stack, against the brute-force oracle.

One history is produced once for the module (Kafka, a speed worker into Redis, one full Spark
run into PostgreSQL): pageviews keyed `[country, page]` with out-of-order, late, duplicate,
re-sent, malformed and skipped events, around now and around four DST changes of 2026. Then
hypothesis draws `series` (filters, `group_by`, windows that are any multiple of the base,
`step`, `tz`), `top` and `keys` queries, and every answer must equal `tests/oracle.py`'s
recount from the events themselves (rule 8: a base cell ending at or before W holds every
valid event, any other the events rule 2 did not call late), in three states:

1. before any run — the speed view alone, W unknown;
2. after a full run and more events — W inside the queried ranges (batch, mixed, speed);
3. with Redis unreachable — batch-only answers, `speed_status: "unavailable"`.

Counts, sums, min/max and averages must agree exactly (sums to 1e-9); a distinct count within
the HLL sketch's bound and a quantile within the KLL sketch's rank bound of the exact answer
over the union of the group's events. A day window in Asia/Kolkata (+05:30) must be refused
with a 400 naming the 30m base window it needs by a metric whose base window is 1h.
"""

from __future__ import annotations

import math
import random
import socket
import time
from collections.abc import Iterable, Iterator
from contextlib import ExitStack
from dataclasses import dataclass, field, replace
from typing import Any

import orjson
import pytest
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from batch_layer import run_full
from lambdactl.generator import GeneratorSpec, SampleRecord, generate, produce
from serving_layer import create_app
from serving_layer.timefmt import format_time, parse_time
from shared.config import Settings
from shared.db.connect import connect
from shared.db.runs import RunRequest, queue_run
from shared.db.served import read_served
from shared.kafka import create_topics
from tests import oracle
from tests.conftest import Platform, own_platform, platform_config
from tests.speed.support import drain_with_worker

pytestmark = [pytest.mark.services, pytest.mark.long(80), pytest.mark.timeout(600)]

SECOND, MINUTE, HOUR, DAY = 1_000, 60_000, 3_600_000, 86_400_000

VIEWS: dict[str, Any] = {
    "name": "views",
    "source": "pageviews",
    "key": ["country", "page"],
    "value": "latency_ms",
    "aggregations": [
        *("count", "sum", "min", "max", "avg"),
        "distinct(user_id)",
        "quantiles(latency_ms)",
    ],
    "windows": ["1m", "1h", "1d"],
    "grace": "2m",
}
VIEWS_HOURLY: dict[str, Any] = {
    "name": "views_hourly",
    "source": "pageviews",
    "key": ["country", "page"],
    "value": "latency_ms",
    "aggregations": ["count", "max", "distinct(user_id)"],
    "windows": ["1h", "1d"],
    "grace": "2m",
}
"""A 1h base window: local midnight in Asia/Kolkata (18:30 UTC) is no boundary of its cells."""
SLOW_VIEWS: dict[str, Any] = {
    "name": "slow_views",
    "source": "pageviews",
    "fields": {
        "country": "COALESCE(lower(geo.country), CAST(geo.country AS STRING))",
        "page": "CASE WHEN latency_ms >= 80 THEN req.page ELSE 'fast' END",
        "latency_s": "latency_ms / 1000",
    },
    "where": "latency_ms >= 30 OR user_id LIKE 'u1%'",
    "key": ["country", "page"],
    "value": "latency_s",
    "aggregations": [
        *("count", "sum", "min", "max", "avg"),
        "distinct(user_id)",
        "quantiles(latency_s)",
    ],
    "windows": ["1m", "1h", "1d"],
    "grace": "2m",
}
"""Rule 10: a filter and computed key dimensions (from nested fields, through COALESCE, CASE
and a cast) and value, named like `views`' dimensions so every query applies to it; the oracle
evaluates the expressions with DuckDB, not with the project's code."""
METRICS: list[dict[str, Any]] = [
    VIEWS,
    VIEWS_HOURLY,
    {**VIEWS, "name": "views_rolled", "rollups": [[], ["country"]]},
    SLOW_VIEWS,
]
"""Every metric is checked by the same properties. `views_rolled` is `views` answered from its
rollups where they cover a query: a rollup must answer exactly what merging the full keys
answers, so it is checked against the same oracle (which ignores rollups)."""


def _outputs(definition: dict[str, Any]) -> list[str]:
    """What a point of the metric carries (default `q`): what `top` may rank by."""
    names: list[str] = []
    for aggregation in definition["aggregations"]:
        if aggregation.startswith("distinct("):
            names.append(f"distinct_{aggregation[len('distinct(') : -1]}")
        elif aggregation.startswith("quantiles("):
            names.extend(oracle.quantile_name(q) for q in oracle.DEFAULT_QUANTILES)
        else:
            names.append(aggregation)
    return names


def _twins(definition: dict[str, Any]) -> list[str]:
    """The metrics defined as `definition` up to their name and rollups."""

    def same(m: dict[str, Any]) -> dict[str, Any]:
        return {k: v for k, v in m.items() if k not in ("name", "rollups")}

    return [m["name"] for m in METRICS if same(m) == same(definition)]


EXACT_RANKS = {"count", "min", "max"}
"""`top` by these must rank exactly as the oracle (values are exact, ties by key)."""

COUNTRIES: list[str | int] = ["de", "fr", "us", "in", "br", 7, "7"]
COUNTRY_WEIGHTS = [30, 20, 20, 10, 10, 5, 5]
COUNTRY_VALUES = ["de", "fr", "us", "in", "br", "7", "zz"]  # "zz": no such country
PAGE_VALUES = ["/", "/search", "/cart", "/page/0", "/page/3", "/page/39", "404", "/nope", "fast"]
ZONES = [None, "UTC", "Europe/Berlin", "America/New_York", "Asia/Kolkata"]
DST_DAYS = [
    1_772_928_000_000,  # 2026-03-08: America/New_York's day of 23 hours
    1_774_742_400_000,  # 2026-03-29: Europe/Berlin's day of 23 hours
    1_792_886_400_000,  # 2026-10-25: Europe/Berlin's day of 25 hours
    1_793_491_200_000,  # 2026-11-01: America/New_York's day of 25 hours
]


def slicing_config(tag: str, metrics: list[dict[str, Any]]) -> dict[str, Any]:
    """The platform's source (this test's topic) with the given metric definitions."""
    config = platform_config(tag)
    config["metrics"] = [dict(m) for m in metrics]
    return config


# --------------------------------------------------------------------------- the events


def _with_country(records: Iterable[SampleRecord]) -> Iterator[SampleRecord]:
    """The generator's events with a `country` (an integer 7 and a string "7" are one value),
    a few integer pages and a few events each metric skips (country missing or null, latency
    not a number). Decided by the event id, so a copy stays identical to its original."""
    for record in records:
        try:
            payload = orjson.loads(record.value)
        except orjson.JSONDecodeError:
            payload = None
        if not isinstance(payload, dict) or "page" not in payload:
            yield record  # malformed: left as the generator made it
            continue
        rng = random.Random(record.key)
        roll = rng.random()
        if roll < 0.01:
            pass  # no country: key_missing
        elif roll < 0.02:
            payload["country"] = None  # key_invalid
        else:
            payload["country"] = rng.choices(COUNTRIES, COUNTRY_WEIGHTS)[0]
        if rng.random() < 0.02:
            payload["page"] = 404
        if rng.random() < 0.01:
            payload["latency_ms"] = "slow"  # value_invalid
        # `slow_views` reads nested copies (a missing country: no `geo.country` either).
        payload["geo"] = {"country": payload["country"]} if "country" in payload else {}
        payload["req"] = {"page": payload["page"]}
        yield SampleRecord(record.key, orjson.dumps(payload))


# --------------------------------------------------------------------------- the world


@dataclass
class Phase:
    """One state of the platform: an API over it and the oracle's view of each metric."""

    name: str
    client: TestClient
    views: dict[str, oracle.View]
    speed_status: str


@dataclass
class World:
    platform: Platform
    now: int
    history: list[oracle.Record] = field(default_factory=list)
    """The records the full run reads (its snapshot)."""
    stage: str = "before"
    stack: ExitStack = field(default_factory=ExitStack)
    phases: dict[str, Phase] = field(default_factory=dict)

    @property
    def config(self) -> dict[str, Any]:
        return self.platform.config

    def client(self, settings: Settings) -> TestClient:
        return self.stack.enter_context(TestClient(create_app(settings)))


def _closed_port() -> int:
    """A local TCP port nothing listens on (bound by the OS, then released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _history_spec(now: int) -> GeneratorSpec:
    return GeneratorSpec(
        now - 150 * MINUTE, now - 40 * MINUTE, 4000, malformed_fraction=0.01, seed=50
    )


@pytest.fixture(scope="module")
def world(stack: Settings, tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    """This module's own topic, database and (flushed) Redis database; the history produced
    and drained into the speed view, no run yet."""
    directory = tmp_path_factory.mktemp("slicing")
    with own_platform(stack, directory, lambda tag: slicing_config(tag, METRICS)) as platform:
        world = World(platform, int(time.time() * 1000) // MINUTE * MINUTE)
        with world.stack:
            _produce_history(world)
            yield world


def _produce_history(world: World) -> None:
    settings = world.platform.settings
    source = settings.sources[0]
    bootstrap = settings.kafka.bootstrap_servers
    create_topics(settings)
    # Three days around each DST change first (in time order, so the speed layer keeps them
    # too), then the recent history.
    specs = [
        GeneratorSpec(day - DAY, day + 2 * DAY, 300, malformed_fraction=0.01, seed=40 + i)
        for i, day in enumerate(DST_DAYS)
    ]
    specs.append(_history_spec(world.now))
    for spec in specs:
        produce(bootstrap, source.topic, _with_country(generate(spec)))
    drain_with_worker(world.platform, world.platform.config_path.with_name("speed.log"))
    world.history = oracle.read_topic(bootstrap, source.topic)
    views = {
        m["name"]: oracle.view(world.config, m["name"], speed_records=world.history)
        for m in METRICS
    }
    world.phases["before"] = Phase("before", world.client(settings), views, "ok")


@pytest.fixture(scope="module")
def after_run(world: World, spark: Any) -> World:
    """A full run over the history, then more events drained into the speed view: live ones
    after W, late ones (some in cells W already covers) and re-sent copies of history events
    (producer retries: same key, same payload)."""
    settings = world.platform.settings
    source = settings.sources[0]
    bootstrap = settings.kafka.bootstrap_servers
    world.stage = "after"
    with connect(settings.postgres.url, autocommit=True) as conn:
        run_id = queue_run(conn, RunRequest("full"))[0]
    run_full(settings, spark, run_id)
    with connect(settings.postgres.url, autocommit=True) as conn:
        served = read_served(conn)
    assert served is not None
    watermarks = {m["name"]: served.watermarks[m["name"]] for m in METRICS}
    for name, w in watermarks.items():
        assert w == oracle.batch_watermark(world.config, world.history, name), name
    counts = oracle.compute(world.config, world.history, late_rule=True)
    assert counts.malformed and counts.duplicates, "the history has malformed and copies"
    assert all(counts.late[m["name"]] and counts.skipped[m["name"]] for m in METRICS), counts

    now = world.now
    live_spec = GeneratorSpec(
        now - 35 * MINUTE, now, 2000, late_fraction=0.05, malformed_fraction=0.01, seed=60
    )
    live = list(_with_country(generate(live_spec)))
    history = list(_with_country(generate(_history_spec(now))))
    resent = history[-40:] + history[1000:1010]
    produce(bootstrap, source.topic, iter(live[:1000] + resent + live[1000:]))
    drain_with_worker(world.platform, world.platform.config_path.with_name("speed.log"))
    records = oracle.read_topic(bootstrap, source.topic)

    def views(speed: list[oracle.Record] | None) -> dict[str, oracle.View]:
        return {
            name: oracle.view(
                world.config, name, speed_records=speed, batch_records=world.history, watermark=w
            )
            for name, w in watermarks.items()
        }

    world.phases["after"] = Phase("after", world.client(settings), views(records), "ok")
    down = {**world.config, "redis": {"url": f"redis://127.0.0.1:{_closed_port()}/0"}}
    world.phases["redis_down"] = Phase(
        "redis_down", world.client(Settings(**down)), views(None), "unavailable"
    )
    return world


# --------------------------------------------------------------------------- queries

Filters = tuple[tuple[str, tuple[str, ...]], ...]


def _filter_params(filters: Filters) -> dict[str, list[str]]:
    return {dim: list(values) for dim, values in filters}


@dataclass(frozen=True)
class SeriesQuery:
    metric: str
    window: int
    start: int
    end: int
    step: int | None = None
    tz: str | None = None
    filters: Filters = ()
    group_by: tuple[str, ...] = ()
    limit: int | None = None

    def params(self) -> dict[str, Any]:
        params: dict[str, Any] = {
            "window": oracle.format_duration(self.window),
            "start": format_time(self.start),
            "end": format_time(self.end),
            **_filter_params(self.filters),
        }
        if self.step is not None:
            params["step"] = oracle.format_duration(self.step)
        if self.tz is not None:
            params["tz"] = self.tz
        if self.group_by:
            params["group_by"] = ",".join(self.group_by)
        if self.limit is not None:
            params["limit"] = self.limit
        return params


@dataclass(frozen=True)
class TopQuery:
    metric: str
    window: int
    at: int
    by: str
    n: int = 10
    filters: Filters = ()
    group_by: tuple[str, ...] | None = None

    def params(self) -> dict[str, Any]:
        params: dict[str, Any] = {
            "window": oracle.format_duration(self.window),
            "at": format_time(self.at),
            "by": self.by,
            "n": self.n,
            **_filter_params(self.filters),
        }
        if self.group_by is not None:
            params["group_by"] = ",".join(self.group_by)
        return params


@dataclass(frozen=True)
class KeysQuery:
    metric: str
    start: int
    end: int
    filters: Filters = ()
    prefix: str | None = None
    limit: int | None = None

    def params(self) -> dict[str, Any]:
        params: dict[str, Any] = {
            "start": format_time(self.start),
            "end": format_time(self.end),
            **_filter_params(self.filters),
        }
        if self.prefix is not None:
            params["prefix"] = self.prefix
        if self.limit is not None:
            params["limit"] = self.limit
        return params


@dataclass
class Seen:
    """What the checked answers covered (for the fixed queries' coverage asserts)."""

    sources: set[str] = field(default_factory=set)
    lengths: set[int] = field(default_factory=set)
    refused: int = 0
    points: int = 0
    items: int = 0
    keys: int = 0


def _definition(metric: str) -> dict[str, Any]:
    return next(m for m in METRICS if m["name"] == metric)


def _base(metric: str) -> int:
    return min(oracle.parse_duration(w) for w in _definition(metric)["windows"])


def _w(watermark: int | None) -> str | None:
    return None if watermark is None else format_time(watermark)


def check_series(phase: Phase, q: SeriesQuery, seen: Seen) -> None:
    response = phase.client.get(f"/v1/metrics/{q.metric}/series", params=q.params())
    v = phase.views[q.metric]
    windows = oracle.series_windows(q.start, q.end, q.window, q.step, q.tz)
    need = oracle.required_base(windows, v.metric.base_ms)
    if need is not None:
        assert response.status_code == 400, (q, response.text)
        assert oracle.format_duration(need) in response.json()["detail"], (q, response.text)
        seen.refused += 1
        return
    assert response.status_code == 200, (q, response.text)
    body = response.json()
    filters = {dim: values for dim, values in q.filters}
    want = oracle.sliced_series(v, windows, filters, q.group_by)
    assert body["metric"] == q.metric
    assert body["window"] == oracle.format_duration(q.window)
    assert body.get("step") == (
        None if q.step in (None, q.window) else oracle.format_duration(q.step)
    )
    assert body.get("tz") == q.tz
    assert body["batch_watermark"] == _w(v.watermark)
    assert body["speed_status"] == phase.speed_status
    if "filters" in body:
        assert body["filters"] == {d: sorted(vs) for d, vs in filters.items()}
    if q.group_by:
        limit = 100 if q.limit is None else q.limit
        assert body["group_by"] == list(q.group_by)
        assert body["truncated"] == (len(want) > limit)
        got = {tuple(g["key"][d] for d in q.group_by): g["points"] for g in body["groups"]}
        assert list(got) == list(want)[:limit], "groups ascending by key, at most limit"
        want = {g: want[g] for g in got}
    else:
        assert body["key"] == {d: vs[0] for d, vs in filters.items() if len(set(vs)) == 1}
        got = {(): body["points"]} if body["points"] else {}
    expected: dict[Any, dict[str, Any]] = {}
    actual: dict[Any, dict[str, Any]] = {}
    where_want: dict[Any, tuple[int, str]] = {}
    where_got: dict[Any, tuple[int, str]] = {}
    for group, points in want.items():
        for p in points:
            cell = (group, p["start"])
            expected[cell] = {k: x for k, x in p.items() if k not in ("start", "end", "source")}
            where_want[cell] = (p["end"], p["source"])
    for group, points in got.items():
        for p in points:
            cell = (group, parse_time(p["start"]))
            actual[cell] = {k: x for k, x in p.items() if k not in ("start", "end", "source")}
            where_got[cell] = (parse_time(p["end"]), p["source"])
            seen.sources.add(p["source"])
            seen.lengths.add(where_got[cell][0] - cell[1])
    assert oracle.compare(expected, actual) == [], q
    assert where_got == where_want, q
    seen.points += len(actual)


def _not_above(by: str, expected: Any, last_value: Any) -> bool:
    """Whether a group the API left out of `top` (ranked by a sketch or a float sum) may rank
    after its last item, whose value is `last_value`."""
    if by.startswith("distinct_"):
        return expected * 0.95 - 1 <= last_value
    if isinstance(expected, oracle.ExactQuantile):
        return expected.rank_bounds(last_value)[1] + oracle.KLL_RANK_EPS >= float(expected.q)
    return expected <= last_value or math.isclose(expected, last_value, rel_tol=1e-9)


def check_top(phase: Phase, q: TopQuery, seen: Seen) -> None:
    response = phase.client.get(f"/v1/metrics/{q.metric}/top", params=q.params())
    assert response.status_code == 200, (q, response.text)
    body = response.json()
    v = phase.views[q.metric]
    filters = {dim: values for dim, values in q.filters}
    start, end, ranked = oracle.sliced_top(v, q.window, q.at, q.by, filters, q.group_by)
    dims = v.metric.key if q.group_by is None else list(q.group_by)
    assert (body["start"], body["end"]) == (format_time(start), format_time(end)), q
    assert body["batch_watermark"] == _w(v.watermark)
    assert body["speed_status"] == phase.speed_status
    items = [(tuple(i["key"][d] for d in dims), i["value"]) for i in body["items"]]
    assert all(list(i["key"]) == dims for i in body["items"]), q
    source = oracle.point_source(start, end, v.watermark)
    assert all(i["source"] == source for i in body["items"]), q
    assert len(items) == min(q.n, len(ranked)), (q, items, ranked[: q.n])
    assert items == sorted(items, key=lambda i: (-i[1], i[0])), "largest first, ties by key"
    want = dict(ranked)
    assert {g for g, _ in items} <= want.keys(), q
    differences = oracle.compare(
        {g: {q.by: want[g]} for g, _ in items}, {g: {q.by: value} for g, value in items}
    )
    assert differences == [], q
    if q.by in EXACT_RANKS:
        assert [g for g, _ in items] == [g for g, _ in ranked[: q.n]], q
    elif items:
        last_value = items[-1][1]
        listed = {g for g, _ in items}
        left_out = [g for g, _ in ranked if g not in listed]
        assert all(_not_above(q.by, want[g], last_value) for g in left_out), (
            q,
            [(g, want[g]) for g in left_out[:5]],
        )
    seen.items += len(items)
    if items:
        seen.sources.add(source)


def check_keys(phase: Phase, q: KeysQuery, seen: Seen) -> None:
    response = phase.client.get(f"/v1/metrics/{q.metric}/keys", params=q.params())
    assert response.status_code == 200, (q, response.text)
    body = response.json()
    v = phase.views[q.metric]
    filters = {dim: values for dim, values in q.filters}
    want = oracle.sliced_keys(v, q.start, q.end, filters, q.prefix)
    limit = 100 if q.limit is None else q.limit
    assert body["batch_watermark"] == _w(v.watermark)
    assert body["speed_status"] == phase.speed_status
    got = [tuple(k[d] for d in v.metric.key) for k in body["keys"]]
    assert got == want[:limit], q
    assert body["truncated"] == (len(want) > limit), q
    seen.keys += len(got)


# --------------------------------------------------------------------------- strategies

VALUES = {"country": COUNTRY_VALUES, "page": PAGE_VALUES}
GROUPINGS: list[tuple[str, ...]] = [
    (),
    ("country",),
    ("page",),
    ("country", "page"),
    ("page", "country"),
]


@st.composite
def _filters(draw: st.DrawFn) -> Filters:
    dims = draw(st.lists(st.sampled_from(["country", "page"]), unique=True, max_size=2))
    return tuple(
        (d, tuple(draw(st.lists(st.sampled_from(VALUES[d]), min_size=1, max_size=2, unique=True))))
        for d in dims
    )


def _anchors(world: World, region: str) -> list[int]:
    if region == "dst":
        return [day + 12 * HOUR for day in DST_DAYS]
    now = world.now
    return [now - 150 * MINUTE, now - 42 * MINUTE, now - 10 * MINUTE]


@st.composite
def series_queries(draw: st.DrawFn, world: World) -> SeriesQuery:
    metric = draw(st.sampled_from([m["name"] for m in METRICS]))
    base = _base(metric)
    tz = draw(st.sampled_from(ZONES))
    size = draw(
        st.sampled_from(
            [
                s
                for s in (MINUTE, 5 * MINUTE, 15 * MINUTE, HOUR, 2 * HOUR, 3 * HOUR, DAY, 2 * DAY)
                if s % base == 0
            ]
        )
    )
    if tz is not None and size % DAY == 0:
        steps: list[int | None] = [None, DAY, 2 * DAY]
    else:
        candidates = [size // 2, size // 3, size // 4, 2 * size] + (
            [base] if size <= 2 * HOUR else []
        )
        steps = [None, *sorted({s for s in candidates if s > 0 and s % base == 0})]
    step = draw(st.sampled_from(steps))
    unit = DAY if size >= DAY and (tz is not None or step is None) else (step or size)
    most = 40 if unit < HOUR else 12 if unit < DAY else 3
    anchor = draw(
        st.sampled_from(_anchors(world, draw(st.sampled_from(["recent", "recent", "dst"]))))
    )
    back = draw(st.integers(0 if unit < DAY else 1, most)) * unit
    ahead = draw(st.integers(1, most)) * unit
    jitter = draw(st.sampled_from([0, 0, 17 * SECOND, base // 2]))
    return SeriesQuery(
        metric,
        size,
        anchor - back + jitter,
        anchor + ahead,
        step=step,
        tz=tz,
        filters=draw(_filters()),
        group_by=draw(st.sampled_from(GROUPINGS)),
        limit=draw(st.sampled_from([None, None, 3])),
    )


@st.composite
def top_queries(draw: st.DrawFn, world: World) -> TopQuery:
    metric = draw(st.sampled_from([m["name"] for m in METRICS]))
    base = _base(metric)
    size = draw(
        st.sampled_from([s for s in (MINUTE, 5 * MINUTE, HOUR, 2 * HOUR, DAY) if s % base == 0])
    )
    anchor = draw(
        st.sampled_from(_anchors(world, draw(st.sampled_from(["recent", "recent", "dst"]))))
    )
    grouping = draw(st.sampled_from([None, *GROUPINGS[1:]]))
    return TopQuery(
        metric,
        size,
        anchor + draw(st.integers(-2 * HOUR, 2 * HOUR)),
        draw(st.sampled_from(_outputs(_definition(metric)))),
        n=draw(st.sampled_from([1, 3, 10, 1000])),
        filters=draw(_filters()),
        group_by=grouping,
    )


@st.composite
def keys_queries(draw: st.DrawFn, world: World) -> KeysQuery:
    metric = draw(st.sampled_from([m["name"] for m in METRICS]))
    anchor = draw(
        st.sampled_from(_anchors(world, draw(st.sampled_from(["recent", "recent", "dst"]))))
    )
    start = anchor - draw(st.integers(0, 200)) * MINUTE + draw(st.sampled_from([0, 17 * SECOND]))
    return KeysQuery(
        metric,
        start,
        start + draw(st.integers(1, 300)) * MINUTE,
        filters=draw(_filters()),
        prefix=draw(st.sampled_from([None, None, "d", "7", "zz", "/"])),
        limit=draw(st.sampled_from([None, 5])),
    )


def _check_drawn(world: World, phase: Phase, data: st.DataObject) -> None:
    seen = Seen()
    check_series(phase, data.draw(series_queries(world), label="series"), seen)
    check_top(phase, data.draw(top_queries(world), label="top"), seen)
    check_keys(phase, data.draw(keys_queries(world), label="keys"), seen)


PROPERTY = settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)


# --------------------------------------------------------------------------- fixed queries


def fixed_queries(world: World) -> list[SeriesQuery | TopQuery | KeysQuery]:
    """Queries that must be covered whatever hypothesis draws: W inside the range (batch,
    mixed and speed windows), hopping, every grouping, DST days, Asia/Kolkata both ways."""
    now = world.now
    w_ish = now - 42 * MINUTE
    berlin_fall, ny_spring = DST_DAYS[2], DST_DAYS[0]
    return [
        SeriesQuery("views", HOUR, now - 4 * HOUR, now + HOUR),
        SeriesQuery("views", HOUR, now - 4 * HOUR, now + HOUR, filters=(("country", ("7",)),)),
        SeriesQuery(
            "views",
            5 * MINUTE,
            w_ish - 30 * MINUTE,
            w_ish + 30 * MINUTE,
            step=MINUTE,
            filters=(("country", ("de", "fr")),),
            group_by=("page",),
        ),
        SeriesQuery(
            "views",
            2 * HOUR,
            now - 5 * HOUR,
            now + HOUR,
            step=HOUR,
            group_by=("country", "page"),
            limit=3,
        ),
        SeriesQuery(
            "views",
            15 * MINUTE,
            now - 3 * HOUR,
            now,
            filters=(("country", ("us", "zz")), ("page", ("/", "404"))),
            group_by=("page", "country"),
        ),
        SeriesQuery("views", DAY, berlin_fall - 2 * DAY, berlin_fall + 3 * DAY, tz="Europe/Berlin"),
        SeriesQuery(
            "views",
            DAY,
            ny_spring - 2 * DAY,
            ny_spring + 3 * DAY,
            tz="America/New_York",
            group_by=("country",),
        ),
        SeriesQuery(
            "views",
            2 * DAY,
            DST_DAYS[3] - 2 * DAY,
            DST_DAYS[3] + 3 * DAY,
            step=DAY,
            tz="America/New_York",
            filters=(("page", ("/",)),),
        ),
        SeriesQuery("views", DAY, now - 3 * DAY, now + DAY, tz="Asia/Kolkata"),
        SeriesQuery("views_hourly", DAY, now - 3 * DAY, now + DAY, tz="Asia/Kolkata"),
        SeriesQuery("views_hourly", HOUR, now - 5 * HOUR, now + HOUR, tz="Asia/Kolkata"),
        SeriesQuery(
            "views_hourly",
            3 * HOUR,
            now - 6 * HOUR,
            now + HOUR,
            step=HOUR,
            filters=(("page", ("/", "404")),),
            group_by=("country",),
        ),
        TopQuery("views", HOUR, w_ish, "count", group_by=("country",)),
        TopQuery("views", HOUR, w_ish, "p99", n=5, group_by=("page",)),
        TopQuery("views", DAY, now, "distinct_user_id", n=1000, filters=(("country", ("de",)),)),
        TopQuery("views", 5 * MINUTE, now - 20 * MINUTE, "avg", n=3),
        TopQuery("views_hourly", DAY, berlin_fall, "max", group_by=("page", "country")),
        KeysQuery("views", now - 3 * HOUR, now + MINUTE, filters=(("country", ("7",)),)),
        KeysQuery("views", now - 3 * HOUR, now + MINUTE, prefix="d", limit=5),
        KeysQuery(
            "views_hourly", berlin_fall - DAY, berlin_fall + DAY, filters=(("page", ("/",)),)
        ),
        SeriesQuery("slow_views", HOUR, now - 4 * HOUR, now + HOUR, group_by=("country", "page")),
        SeriesQuery(
            "slow_views",
            5 * MINUTE,
            w_ish - 30 * MINUTE,
            w_ish + 30 * MINUTE,
            filters=(("page", ("fast",)),),
            group_by=("country",),
        ),
        TopQuery("slow_views", HOUR, w_ish, "sum", n=1000, group_by=("page",)),
        KeysQuery("slow_views", now - 3 * HOUR, now + MINUTE, filters=(("country", ("7",)),)),
    ]


def _check(phase: Phase, q: SeriesQuery | TopQuery | KeysQuery, seen: Seen) -> None:
    if isinstance(q, SeriesQuery):
        check_series(phase, q, seen)
    elif isinstance(q, TopQuery):
        check_top(phase, q, seen)
    else:
        check_keys(phase, q, seen)


def _check_fixed(world: World, phase: Phase) -> Seen:
    """The fixed queries, those of `views` asked of each of its twins too."""
    seen = Seen()
    for q in fixed_queries(world):
        for name in _twins(VIEWS) if q.metric == VIEWS["name"] else [q.metric]:
            _check(phase, replace(q, metric=name), seen)
    assert seen.refused == 1, "the Asia/Kolkata day window of the 1h-base metric"
    assert {23 * HOUR, 25 * HOUR} <= seen.lengths, "both kinds of DST day were answered"
    assert seen.points > 100 and seen.items > 10 and seen.keys > 5, seen
    return seen


# --------------------------------------------------------------------------- the tests


def test_the_listing_shows_a_metrics_filter_and_computed_fields(world: World) -> None:
    listed = world.phases["before"].client.get("/v1/metrics").json()["metrics"]
    slow = next(m for m in listed if m["name"] == SLOW_VIEWS["name"])
    assert slow["fields"] == SLOW_VIEWS["fields"] and slow["where"] == SLOW_VIEWS["where"]
    assert slow["key"] == ["country", "page"] and slow["value"] == "latency_s"


def test_fixed_queries_before_any_run(world: World) -> None:
    assert world.stage == "before", "run this module's tests in file order"
    seen = _check_fixed(world, world.phases["before"])
    assert seen.sources == {"speed"}


@PROPERTY
@given(data=st.data())
def test_before_any_run_the_speed_view_answers_as_the_oracle(
    world: World, data: st.DataObject
) -> None:
    assert world.stage == "before", "run this module's tests in file order"
    _check_drawn(world, world.phases["before"], data)


def test_fixed_queries_after_a_run_across_w(after_run: World) -> None:
    seen = _check_fixed(after_run, after_run.phases["after"])
    assert seen.sources == {"batch", "mixed", "speed"}


@PROPERTY
@given(data=st.data())
def test_after_a_run_merged_answers_equal_the_oracle(after_run: World, data: st.DataObject) -> None:
    _check_drawn(after_run, after_run.phases["after"], data)


def test_fixed_queries_with_redis_unreachable(after_run: World) -> None:
    seen = _check_fixed(after_run, after_run.phases["redis_down"])
    assert seen.sources == {"batch", "mixed"}, "no window after W has any event"


@PROPERTY
@given(data=st.data())
def test_with_redis_unreachable_answers_are_the_batch_side_alone(
    after_run: World, data: st.DataObject
) -> None:
    _check_drawn(after_run, after_run.phases["redis_down"], data)
