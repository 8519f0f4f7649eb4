"""Rollups through both layers and the API: a metric declaring `rollups: [[], [page]]` answers
its totals and per-page slices from the rollups' own cells, exactly as the same metric without
rollups answers them by merging its full keys at query time — before any run (the speed view
only), then across W after a full run with live events beyond it. Counts, sums, min, max and
avg must be equal; distinct counts and quantiles are sketches (a rollup's sketch is built from
the items, the query-time one by unions), so they must agree within the sketches' bounds."""

from __future__ import annotations

import math
import time
from typing import Any

import pytest
from fastapi.testclient import TestClient

from batch_layer import run_full
from lambdactl.generator import GeneratorSpec, generate, produce
from serving_layer import create_app
from serving_layer.timefmt import format_time
from shared.db.connect import connect
from shared.db.runs import RunRequest, queue_run
from shared.db.served import read_served
from shared.kafka import create_topics
from tests.conftest import Platform, reconfigured
from tests.speed.support import drain_with_worker

pytestmark = [pytest.mark.services, pytest.mark.timeout(600)]

MINUTE, HOUR, DAY = 60_000, 3_600_000, 86_400_000
DEFINITION = {
    "source": "pageviews",
    "key": ["page", "user_id"],
    "value": "latency_ms",
    "aggregations": [
        "count",
        "sum",
        "min",
        "max",
        "avg",
        "distinct(user_id)",
        "quantiles(latency_ms)",
    ],
    "windows": ["1m", "1h", "1d"],
    "grace": "2m",
}
PLAIN, ROLLED = "by_page_user", "by_page_user_rolled"
HLL_BOUND = (
    0.05  # 3 standard errors of lg_k = 12 (~1.6%), as a relative difference of two estimates
)


def _queries(now: int) -> list[tuple[str, dict[str, Any]]]:
    day = {"start": format_time(now - 4 * HOUR), "end": format_time(now + MINUTE)}
    at = {"at": format_time(now - 2 * HOUR)}
    return [
        ("series", {"window": "1m", **day}),  # the total, from rollup []
        ("series", {"window": "1h", **day}),
        (
            "series",
            {
                "window": "1d",
                "start": format_time(now - 5 * HOUR - (now - 5 * HOUR) % DAY),
                "end": day["end"],
            },
        ),
        ("series", {"window": "1h", **day, "page": "/"}),  # one page, from rollup [page]
        ("series", {"window": "1h", **day, "page": ["/", "/cart"]}),  # any of two pages
        ("series", {"window": "1h", **day, "group_by": "page"}),  # per page
        ("series", {"window": "2h", "step": "1h", **day}),  # hopping total, sliced on []
        ("top", {"window": "1h", **at, "group_by": "page", "by": "count", "n": 50}),
        ("top", {"window": "1h", **at, "group_by": "page", "by": "sum", "n": 50}),
    ]


def _points(body: dict[str, Any]) -> dict[tuple[str, ...], list[dict[str, Any]]]:
    if "groups" in body:
        return {tuple(g["key"].values()): g["points"] for g in body["groups"]}
    if "items" in body:
        return {tuple(i["key"].values()): [i] for i in body["items"]}
    return {(): body["points"]}


def _agrees(name: str, a: Any, b: Any) -> bool:
    """Whether two renderings of one output agree: exactly, to 1e-9 relative (float sums merged
    in another order), within the HLL bound, or — quantiles — not compared here (their exact
    values are test_quantiles' subject)."""
    if name in ("count", "min", "max", "start", "end", "source", "key"):
        return bool(a == b)
    if name in ("sum", "avg", "value"):
        return math.isclose(a, b, rel_tol=1e-9)
    if name.startswith("distinct_"):
        return abs(a - b) <= HLL_BOUND * max(a, b)
    return name.startswith("p")


def _compare(
    kind: str, query: dict[str, Any], plain: dict[str, Any], rolled: dict[str, Any]
) -> list[str]:
    """What differs between the two answers beyond the sketches' bounds."""
    where = f"{kind} {query}"
    if set(plain) != set(rolled):
        return [f"{where}: fields {sorted(plain)} vs {sorted(rolled)}"]
    ours, theirs = _points(plain), _points(rolled)
    if ours.keys() != theirs.keys():
        return [f"{where}: groups {sorted(ours)} vs {sorted(theirs)}"]
    differences = []
    for group, points in ours.items():
        others = theirs[group]
        if len(points) != len(others):
            differences.append(f"{where} {group}: {len(points)} vs {len(others)} points")
            continue
        for p, r in zip(points, others, strict=True):
            differences += [
                f"{where} {group} {p.get('start')} {name}: {p[name]} vs {r.get(name)}"
                for name in p
                if name not in r or not _agrees(name, p[name], r[name])
            ]
    return differences


def test_rollups_answer_what_merging_the_full_keys_answers(platform: Platform, spark: Any) -> None:
    world = reconfigured(
        platform,
        metrics=[
            {"name": PLAIN, **DEFINITION},
            {"name": ROLLED, **DEFINITION, "rollups": [[], ["page"]]},
        ],
    )
    settings = world.settings
    assert settings.plan(ROLLED).version != settings.plan(PLAIN).version
    source = settings.sources[0]
    bootstrap = settings.kafka.bootstrap_servers
    create_topics(settings)
    now = int(time.time() * 1000) // MINUTE * MINUTE
    produce(
        bootstrap,
        source.topic,
        generate(GeneratorSpec(now - 4 * HOUR, now - 90 * MINUTE, 4000, seed=41)),
    )
    drain_with_worker(world, world.config_path.with_name("speed-1.log"))

    def differences() -> tuple[int, list[str]]:
        found: list[str] = []
        compared = 0
        with TestClient(create_app(settings)) as client:
            for kind, query in _queries(now):
                answers = []
                for metric in (PLAIN, ROLLED):
                    response = client.get(f"/v1/metrics/{metric}/{kind}", params=query)
                    assert response.status_code == 200, (metric, kind, query, response.text)
                    answers.append(response.json())
                assert any(_points(answers[0]).values()), (
                    f"{kind} {query}: an empty answer proves nothing"
                )
                found += _compare(kind, query, *answers)
                compared += sum(map(len, _points(answers[0]).values()))
        return compared, found

    compared, found = differences()  # speed view only: no run yet
    assert not found, found
    assert compared > 100

    with connect(settings.postgres.url, autocommit=True) as conn:
        run_id = queue_run(conn, RunRequest("full"))[0]
    run_full(settings, spark, run_id)
    produce(bootstrap, source.topic, generate(GeneratorSpec(now - 80 * MINUTE, now, 2500, seed=42)))
    drain_with_worker(world, world.config_path.with_name("speed-2.log"))
    with connect(settings.postgres.url, autocommit=True) as conn:
        served = read_served(conn)
        assert served is not None and served.watermarks[ROLLED] == served.watermarks[PLAIN]
        stored = dict(
            conn.execute(
                "SELECT metric, count(*) FROM batch_cells WHERE metric LIKE %s GROUP BY metric",
                [f"{ROLLED}%"],
            ).fetchall()
        )
    # The rollups' cells are stored beside the full key's, fewer of them.
    assert set(stored) == {ROLLED, f"{ROLLED}[]", f"{ROLLED}[page]"}
    assert stored[f"{ROLLED}[]"] < stored[f"{ROLLED}[page]"] < stored[ROLLED]
    compared, found = differences()  # across W: batch cells, the straddling hour, speed cells
    assert not found, found
    assert compared > 100
