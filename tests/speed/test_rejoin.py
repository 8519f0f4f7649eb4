"""A late table version joined anew (`speed_layer.rejoin`, rule 11 in docs/semantics.md): which
metrics are recomputed, and the apply that swaps their recomputed sub-cells for the stored ones.
`tests/e2e/test_lookups.py` runs the whole path on real workers."""

from __future__ import annotations

import copy
from typing import Any

from shared.config import Settings
from speed_layer.processor import SourcePlan
from speed_layer.rejoin import MemoryView, accepting_from_w, rejoined_plan, replacement
from tests.batch.helpers import LOOKUP_METRICS, pages_table
from tests.conftest import platform_config
from tests.speed.support import USER_SESSIONS


def _plan(*extra: dict[str, Any], rollups: bool = False) -> SourcePlan:
    config = platform_config("rejoin", partitions=1)
    metrics = copy.deepcopy(LOOKUP_METRICS)
    if rollups:
        metrics[0]["key"] = ["section", "page"]
        metrics[0]["rollups"] = [["section"]]
    config["metrics"] += [*metrics, *extra]
    config["tables"] = [pages_table("rejoin")]
    settings = Settings(**config)
    return SourcePlan.of(settings, settings.sources[0])


def test_only_the_metrics_joining_the_table_and_their_rollups_are_recomputed() -> None:
    plan = rejoined_plan(_plan(rollups=True), {"pages"})
    assert [m.name for m in plan.metrics] == [
        "views_by_section",
        "views_by_section[section]",
        "views_by_owner",
    ]
    assert rejoined_plan(_plan(), {"another"}).metrics == ()


def test_a_session_metric_joining_the_table_is_recomputed_with_its_parts() -> None:
    sessions = {**USER_SESSIONS, "lookups": [{"table": "pages", "on": "page", "as": "p"}]}
    plan = rejoined_plan(_plan(sessions), {"pages"})
    assert [m.name for m in plan.metrics] == [
        "views_by_section",
        "views_by_owner",
        "user_sessions",
        "user_sessions[]",
        "user_sessions(sessions)",
        "user_sessions(sessions)[]",
        "user_sessions(bounces)",
        "user_sessions(bounces)[]",
    ], "with their totals"
    assert "user_sessions" not in {
        m.name for m in rejoined_plan(_plan(USER_SESSIONS), {"pages"}).metrics
    }


def test_a_session_metric_is_recomputed_under_a_w_moved_back_by_its_max_duration() -> None:
    sessions = {**USER_SESSIONS, "lookups": [{"table": "pages", "on": "page", "as": "p"}]}
    plan = rejoined_plan(_plan(sessions), {"pages"})
    moved = accepting_from_w(plan, dict.fromkeys((m.name for m in plan.metrics), 600_000))
    max_ms = plan.metrics[2].sessions.rule.max_duration_ms  # type: ignore[union-attr]
    assert moved["views_by_owner"] == 600_000
    assert moved["user_sessions"] == moved["user_sessions(bounces)"] == 600_000 - max_ms


def test_the_replacement_swaps_cells_from_w_on_and_keeps_the_older_ones() -> None:
    recomputed = MemoryView()
    recomputed.hashes["cell:w"] = {b"a": b"new-a", b"c": b"new-c"}
    recomputed.hashes["cell:new"] = {b"x": b"x"}
    stored = {
        "cell:before-w": (50, {b"a"}),
        "cell:w": (100, {b"a", b"b"}),
        "cell:gone": (160, {b"z"}),
    }
    watermark = dict.fromkeys(stored, 100)
    batch = replacement(recomputed, stored, watermark)
    assert batch.cells == {"cell:w": {b"a": b"new-a", b"c": b"new-c"}, "cell:new": {b"x": b"x"}}
    assert batch.deleted == {"cell:w": [b"b"]}
    assert batch.dropped == ["cell:gone"]  # "cell:before-w" stays until cleanup (rule 8)
    assert batch.ids == {}
    everything = replacement(recomputed, stored, {})  # no W yet: every stored cell is replaced
    assert sorted(everything.dropped) == ["cell:before-w", "cell:gone"]
