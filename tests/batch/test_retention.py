"""Retention (rule 14 in docs/semantics.md) with a real Spark run: a publication removes the
cells each retained window no longer keeps, counted back from the W it publishes, and every
other cell equals the oracle; an incremental run that moves W removes more, and one that
recomputes an old cell for a late event removes it again in the same publication (a full run
does not load what it would remove); a session
metric's stored sessions go with its base cells. The API answers what is kept, a coarser
window over what is not, and 400 naming what is kept for anything needing a removed cell."""

from __future__ import annotations

from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient

from batch_layer import execute_run
from lambdactl.generator import GeneratorSpec
from serving_layer import create_app
from shared.db.runs import RunRequest
from tests import oracle
from tests.batch.helpers import (
    HOUR,
    MINUTE,
    full_run_of,
    oracle_mismatches,
    produce_spec,
    queue,
    run_record,
    served_view,
    snapshot_records,
)
from tests.conftest import Platform

pytestmark = [pytest.mark.services, pytest.mark.timeout(600)]

METRICS: list[dict[str, Any]] = [
    {
        "name": "views",
        "source": "pageviews",
        "key": ["page"],
        "value": "latency_ms",
        "aggregations": ["count", "sum", "max"],
        "windows": ["1m", "5m", "1h"],
        "retention": {"1m": "30m", "5m": "90m"},
        "grace": "2m",
    },
    {
        "name": "visits",
        "source": "pageviews",
        "key": ["user_id"],
        "aggregations": ["count"],
        "session": {"gap": "5m", "max_duration": "20m"},
        "windows": ["5m", "15m"],
        "retention": {"5m": "85m"},
        "grace": "2m",
    },
]


def _removed_and_kept(settings: Any, config: dict[str, Any]) -> tuple[int, int]:
    """How many of the oracle's cells retention removes from the served view, and keeps."""
    served, _ = served_view(settings)
    assert served is not None
    every = oracle.compute_cells(config, snapshot_records(settings, served))
    kept = oracle.retained(config, every, served.watermarks)
    return len(every) - len(kept), len(kept)


def _late(at: int, seed: int) -> GeneratorSpec:
    """Three events in the minute from `at` (each of its own id)."""
    return GeneratorSpec(at, at + MINUTE, 3, late_fraction=0.0, duplicate_fraction=0.0, seed=seed)


def test_a_publication_removes_what_retention_no_longer_keeps(
    platform: Platform, spark: Any
) -> None:
    world, record, now = full_run_of(platform, spark, METRICS, lambda now: [], seed=41)
    settings, config = world.settings, world.config
    assert oracle_mismatches(settings, config) == []
    removed, kept = _removed_and_kept(settings, config)
    assert removed > 100 and kept > 100, "the history reaches past every retention"
    served, cells = served_view(settings)
    assert served is not None
    assert record.rows_out == len(cells), "a full run loads no cell its publication removes"
    w = served.watermarks["views"]
    minutes = [start for name, size, start, _ in cells if name == "views" and size == MINUTE]
    assert min(minutes) + MINUTE > w - 30 * MINUTE, "no 1m cell ended by W - 30m"
    hours = [start for name, size, start, _ in cells if name == "views" and size == HOUR]
    assert min(hours) < now - 2 * HOUR, "1h has no retention: kept back to the first event"
    sessions = [s for name, size, s, _ in cells if name.startswith("visits") and size == 0]
    base_w = served.watermarks["visits"]
    assert (
        sessions
        and min(sessions) - min(sessions) % (5 * MINUTE) + 5 * MINUTE > base_w - 85 * MINUTE
    )

    # An incremental run: new events move W on (more is removed), and a late event 100 min
    # back recomputes its 1m and 5m cells, which the same publication removes again. (visits
    # continues each key from its sessions starting 20 min before the 15-min boundary before
    # that event, about 140-155 min back: stored still, as its 5m cells are kept from about
    # 170 min back under the served W.)
    produce_spec(
        settings,
        GeneratorSpec(now - HOUR, now, 600, late_fraction=0.0, duplicate_fraction=0.0, seed=42),
    )
    produce_spec(settings, _late(now - 100 * MINUTE, seed=43))
    run_id = queue(settings, RunRequest("incremental"))
    summary = execute_run(settings, spark, run_id)
    assert run_record(settings, run_id).executed_mode == "incremental"
    assert summary.expired.deleted > 0
    assert oracle_mismatches(settings, config) == []

    # A late event 170 min back: visits would continue from sessions retention removed (its
    # 5m cells are now kept from about 110 min back), so the run recomputes from the log.
    produce_spec(settings, _late(now - 170 * MINUTE, seed=44))
    run_id = queue(settings, RunRequest("incremental"))
    execute_run(settings, spark, run_id)
    assert run_record(settings, run_id).executed_mode == "full"
    assert oracle_mismatches(settings, config) == []
    after, _ = served_view(settings)
    assert after is not None and after.watermarks["views"] > w
    _the_api_answers_what_is_kept(settings, after.watermarks["views"], now)


def _the_api_answers_what_is_kept(settings: Any, w: int, now: int) -> None:
    def get(path: str, **params: Any) -> httpx.Response:
        return client.get(f"/v1/metrics/{path}", params=params)

    with TestClient(create_app(settings)) as client:
        recent = get("views/series", window="1m", start=w - 20 * MINUTE, end=w, page="/")
        assert recent.status_code == 200, recent.text
        refused = get("views/series", window="1m", start=w - 2 * HOUR, end=w, page="/")
        assert refused.status_code == 400
        detail = refused.json()["detail"]
        assert "views keeps its 1m cells back to" in detail
        assert "1h always" in detail and "coarser window" in detail
        hourly = get("views/series", window="1h", start=now - 4 * HOUR, end=now, page="/")
        assert hourly.status_code == 200, hourly.text
        assert sum(p["count"] for p in hourly.json()["points"]) > 0
        # hopping hours starting on the half hour compose of 5m cells, gone 90m before W
        hopping = get("views/series", window="1h", step="30m", start=now - 4 * HOUR, end=now)
        assert hopping.status_code == 400 and "5m cells" in hopping.json()["detail"]
        old_top = get("views/top", window="1m", at=w - 2 * HOUR, by="count")
        assert old_top.status_code == 400
        assert get("views/top", window="1h", at=w - 2 * HOUR, by="count").status_code == 200
        old_sessions = get("visits/sessions", start=now - 3 * HOUR, end=now, user_id="u1")
        assert old_sessions.status_code == 400 and "visits keeps its 5m" in old_sessions.text
        keys = get("views/keys", start=now - 3 * HOUR, end=now).json()
        assert keys["keys"]
        assert oracle.parse_rfc3339_ms(keys["start"]) == w - 30 * MINUTE, "from what is kept"
        listing = get("").json()["metrics"]
        assert {m["name"]: m["retention"] for m in listing} == {
            "views": {"1m": "30m", "5m": "90m"},
            "visits": {"5m": "85m"},
        }
