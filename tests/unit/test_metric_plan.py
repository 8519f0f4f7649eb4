"""The metric plan: one compiled definition per metric, its version pinned so stored cells stay
valid across code changes."""

from __future__ import annotations

import copy
import dataclasses
import os
from pathlib import Path
from typing import Any

import pytest

from shared.aggregations import HLL
from shared.config import MetricConfig, SessionConfig, Settings, SourceConfig
from shared.metric_plan import (
    MetricPlan,
    Rollup,
    SketchInput,
    compile_plan,
    compile_plans,
    read_plans,
    versions_digest,
    versions_of,
)
from shared.sessions import SessionRule
from shared.window_kind import SessionWindows

MIN = 60_000
HOUR = 60 * MIN
DAY = 24 * HOUR

CONFIG: dict[str, Any] = {
    "sources": [
        {
            "name": "pageviews",
            "topic": "pageviews",
            "time_field": "ts",
            "id_field": "event_id",
            "partitions": 4,
        }
    ],
    "metrics": [
        {
            "name": "views_by_page",
            "source": "pageviews",
            "key": ["page"],
            "value": "latency_ms",
            "aggregations": ["count", "sum", "min", "max", "avg", "distinct(user_id)"],
            "windows": ["1d", "1m", "1h"],
            "grace": "2m",
        },
        {
            "name": "views_total",
            "source": "pageviews",
            "aggregations": ["count", "distinct(user_id)"],
            "windows": ["1m", "1h"],
            "grace": "2m",
        },
    ],
}

GOLDEN = {"views_by_page": "db9ec8105e06", "views_total": "5c79ec23a5a9"}
"""Pinned: cells stored under these names (Redis keys, `batch_cells.version`, the served row)
must stay readable. They last changed with `VALIDITY_REVISION` 3 (an id reused at another
event time became another event, rule 4), which recomputes every metric once."""


def config() -> dict[str, Any]:
    return copy.deepcopy(CONFIG)


def plan_of(config: dict[str, Any], name: str = "views_by_page") -> MetricPlan:
    found = Settings(**config).plan(name)
    assert found is not None
    return found


@pytest.fixture(autouse=True)
def _no_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """No `LAMBDA_*` variable and no `lambda.yaml` leak into the settings."""
    for name in list(os.environ):
        if name.startswith("LAMBDA_"):
            monkeypatch.delenv(name)
    monkeypatch.chdir(tmp_path)


def test_versions_equal_the_golden_hashes() -> None:
    settings = Settings(**config())
    assert versions_of(settings.plans.values()) == GOLDEN


def test_the_plan_holds_the_compiled_definition() -> None:
    plan = plan_of(config())
    assert plan.name == "views_by_page"
    assert plan.source.name == "pageviews"
    assert plan.config.name == "views_by_page"
    assert plan.key == ("page",)
    assert plan.value == "latency_ms"
    assert [a.spec for a in plan.aggregations.aggregations] == [
        "count",
        "sum",
        "min",
        "max",
        "avg",
        "distinct(user_id)",
    ]
    assert plan.kinds == (HLL,)
    assert plan.sketch_inputs == (
        SketchInput(
            "user_id", False, "distinct_missing", "distinct_invalid", "distinct_out_of_range"
        ),
    )
    assert plan.output_names == ("count", "sum", "min", "max", "avg", "distinct_user_id")
    assert (plan.text_fields, plan.number_fields) == (("page", "user_id"), ("latency_ms",))
    assert plan.base_window_ms == MIN
    assert plan.grace_ms == 2 * MIN


def test_windows_are_ascending_and_the_smallest_is_the_base() -> None:
    plan = plan_of(config())
    assert plan.windows_ms == (MIN, HOUR, DAY)
    assert plan.base_window_ms == plan.windows_ms[0]


def test_fields_read() -> None:
    assert plan_of(config()).fields_read == ("page", "latency_ms", "user_id")
    assert plan_of(config(), "views_total").fields_read == ("user_id",)
    changed = config()
    changed["metrics"][0]["key"] = ["page", "user_id"]
    changed["metrics"][0]["aggregations"] = ["count", "distinct(session)", "distinct(user_id)"]
    changed["metrics"][0]["value"] = None
    plan = plan_of(changed)
    assert plan.fields_read == ("page", "user_id", "session")
    assert plan.text_fields == ("page", "user_id", "session")


def test_a_plan_is_immutable() -> None:
    plan = plan_of(config())
    with pytest.raises(dataclasses.FrozenInstanceError):
        plan.version = "x"  # type: ignore[misc]
    assert not hasattr(plan, "__dict__")


def test_plans_are_compiled_once_per_definition() -> None:
    settings = Settings(**config())
    assert settings.plans is settings.plans
    assert list(settings.plans) == ["views_by_page", "views_total"]
    assert settings.plan("no_such_metric") is None
    assert settings.plans_of(settings.sources[0]) == tuple(settings.plans.values())
    again = Settings(**config())
    assert again.plans is settings.plans
    assert compile_plans.cache_info().hits > 0


def test_a_copy_with_other_metrics_gets_their_plans() -> None:
    settings = Settings(**config())
    assert settings.plans
    copied = settings.model_copy(update={"metrics": settings.metrics[1:]})
    assert list(copied.plans) == ["views_total"]


def test_version_ignores_the_partition_count_and_other_settings() -> None:
    changed = config()
    changed["sources"][0]["partitions"] = 12
    changed["kafka"] = {"bootstrap_servers": "elsewhere:9092"}
    changed["metrics"].append({"name": "other", "source": "pageviews", "windows": ["1m"]})
    assert plan_of(changed).version == GOLDEN["views_by_page"]
    assert plan_of(changed).source.partitions == 12


@pytest.mark.parametrize(
    ("where", "field", "value"),
    [
        ("metric", "key", ["page", "country"]),
        ("metric", "key", []),
        ("metric", "value", "bytes"),
        ("metric", "aggregations", ["count", "sum", "min", "max", "avg"]),
        ("metric", "aggregations", ["sum", "count", "min", "max", "avg", "distinct(user_id)"]),
        ("metric", "windows", ["1m", "1h"]),
        ("metric", "windows", ["5m", "1h", "1d"]),
        ("metric", "grace", "3m"),
        ("metric", "grace", 0),
        ("source", "topic", "pageviews2"),
        ("source", "time_field", "event_time"),
        ("source", "id_field", None),
        ("source", "max_future", "10m"),
    ],
)
def test_version_changes_with_any_definition_field(where: str, field: str, value: object) -> None:
    changed = config()
    target = changed["metrics"][0] if where == "metric" else changed["sources"][0]
    target[field] = value
    assert plan_of(changed).version != GOLDEN["views_by_page"]


def test_version_changes_with_the_names() -> None:
    changed = config()
    changed["metrics"][0]["name"] = "views_by_page2"
    assert plan_of(changed, "views_by_page2").version != GOLDEN["views_by_page"]
    changed = config()
    changed["sources"][0]["name"] = "pv"
    for metric in changed["metrics"]:
        metric["source"] = "pv"
    assert plan_of(changed).version != GOLDEN["views_by_page"]


def test_compile_plan_refuses_another_source() -> None:
    metric = MetricConfig(name="m", source="a", windows=("1m",))
    with pytest.raises(ValueError, match="reads source 'a'"):
        compile_plan(metric, SourceConfig(name="b", topic="b", time_field="ts"))


def test_the_fence_digest_of_versions_is_pinned() -> None:
    """The digest a speed fence records (a worker compares it on assignment, rule 3)."""
    plans = Settings(**config()).plans.values()
    assert versions_digest(plans) == "beeafea4d805"
    assert versions_digest(reversed(list(plans))) == "beeafea4d805"


def test_rollups_compile_into_plans_of_their_own_after_their_metric() -> None:
    with_rollups = config()
    with_rollups["metrics"][0]["key"] = ["country", "page"]
    with_rollups["metrics"][0]["rollups"] = [["page", "country"][1:], []]
    settings = Settings(**with_rollups)
    assert list(settings.plans) == [
        "views_by_page",
        "views_by_page[country]",
        "views_by_page[]",
        "views_total",
    ]
    parent = settings.plans["views_by_page"]
    by_country = settings.plans["views_by_page[country]"]
    assert parent.rollups == (("country",), ())
    assert (by_country.key, by_country.rollup) == (
        ("country",),
        Rollup("views_by_page", ("country",), (0,)),
    )
    assert by_country.rollup.project(("de", "/home")) == ("de",)
    assert (by_country.aggregations, by_country.windows_ms) == (
        parent.aggregations,
        parent.windows_ms,
    )
    assert len({p.version for p in settings.plans.values()}) == 4
    assert [p.name for p in read_plans(settings.plans.values())] == [
        "views_by_page",
        "views_total",
    ]


def test_adding_a_rollup_is_a_new_version_of_the_metric() -> None:
    rolled = config()
    rolled["metrics"][0]["rollups"] = [[]]
    assert plan_of(rolled).version != GOLDEN["views_by_page"]
    assert plan_of(rolled, "views_total").version == GOLDEN["views_total"]


@pytest.mark.parametrize(
    ("rollups", "message"),
    [
        ([["user"]], "must list distinct dimensions of the key"),
        ([["page", "page"]], "must list distinct dimensions of the key"),
        ([["page"]], "is the whole key"),
        ([[], []], "is listed twice"),
    ],
)
def test_a_bad_rollup_is_refused_with_what_to_send(rollups: list[Any], message: str) -> None:
    bad = config()
    bad["metrics"][0]["rollups"] = rollups
    with pytest.raises(ValueError, match=message):
        Settings(**bad)


def test_a_session_metric_plans_its_rule_and_buckets_and_has_a_version_of_its_own() -> None:
    source = SourceConfig(name="clicks", topic="clicks", time_field="ts", id_field="id")
    plain = MetricConfig(name="visits", source="clicks", key=("user",), windows=(HOUR, DAY))
    sessions = plain.model_copy(
        update={"session": SessionConfig(gap=30 * MIN, max_duration=12 * HOUR)}
    )
    plan = compile_plan(sessions, source)
    assert plan.sessions == SessionWindows(SessionRule(30 * MIN, 12 * HOUR), plan.windows)
    assert plan.windows.sizes_ms == (HOUR, DAY)
    assert compile_plan(plain, source).sessions is None
    assert plan.version != compile_plan(plain, source).version


def test_a_session_metric_has_two_parts_of_their_own_built_from_its_sessions() -> None:
    source = SourceConfig(name="clicks", topic="clicks", time_field="ts", id_field="id")
    session = SessionConfig(gap=30 * MIN, max_duration=12 * HOUR)
    visits = MetricConfig(
        name="visits",
        source="clicks",
        key=("user",),
        value="ms",
        windows=(HOUR,),
        aggregations=("count", "sum", "distinct(page)"),
        session=session,
    )
    plans = compile_plans((source,), (visits,))
    assert list(plans) == [
        "visits",
        "visits[]",
        "visits(sessions)",
        "visits(sessions)[]",
        "visits(bounces)",
        "visits(bounces)[]",
    ], "each with its total per bucket"
    totals = [plans[n] for n in plans if n.endswith("[]")]
    assert all(t.key == () and not t.holds_sessions and t.rollup for t in totals)
    assert all(t.sessions == plans["visits"].sessions for t in totals), "its window kind"
    assert all(t.rollup is not None and t.rollup.of_sessions for t in totals)
    assert len({t.version for t in totals}) == 3
    assert [p.name for p in read_plans(plans.values())] == ["visits"], "parts are not read"
    parts = [plans["visits(sessions)"], plans["visits(bounces)"]]
    assert parts[0].output_names == ("count", "sum", "max", "p50", "p90", "p99")
    assert parts[1].output_names == ("count",)
    assert all(p.sessions == plans["visits"].sessions and p.key == ("user",) for p in parts)
    assert len({plans["visits"].version, *(p.version for p in parts)}) == 3
    longer = visits.model_copy(update={"session": session.model_copy(update={"gap": HOUR})})
    again = compile_plans((source,), (longer,))
    assert all(again[p.name].version != p.version for p in parts), "the gap is in the version"


def test_a_dedup_horizon_changes_the_version_of_its_sources_metrics() -> None:
    changed = config()
    changed["sources"][0]["dedup_horizon"] = "7d"
    assert plan_of(changed).version != GOLDEN["views_by_page"]
