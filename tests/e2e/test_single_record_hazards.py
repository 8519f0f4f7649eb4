"""Single valid records that used to make an answer wrong (issue #49's probe), against the real
stack and the oracle: an event minutes ahead of the clock (rules 1, 2 and 5 in
docs/semantics.md) and an id reused at another event time (rule 4)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import orjson
import pytest

from batch_layer import execute_run
from lambdactl.generator import GeneratorSpec, SampleRecord, generate, produce
from shared.db.connect import connect
from shared.db.runs import RunRequest
from shared.kafka import create_topics
from tests import oracle
from tests.batch.helpers import oracle_mismatches, queue, run_record, served_view
from tests.conftest import Platform
from tests.e2e.support import speed_mismatches_after_w
from tests.speed.support import drain_with_worker, expected_base_cells, late_counts, speed_cells
from tests.views import batch_view_cells

pytestmark = [pytest.mark.services, pytest.mark.timeout(600)]

MINUTE = 60_000
GRACE = 2 * MINUTE  # the test platform's metrics'


def _event(event_id: str, ts: int, page: str = "/live") -> bytes:
    return orjson.dumps(
        {"ts": ts, "event_id": event_id, "page": page, "user_id": "u", "latency_ms": 5}
    )


def _minutes_of(cells: dict[oracle.Cell, Any], page: str) -> dict[int, int]:
    """A page's count per minute in `cells`."""
    return {
        c[2]: v["count"]
        for c, v in cells.items()
        if c[:2] == ("views_by_page", MINUTE) and c[3] == (page,)
    }


def test_a_future_event_and_a_reused_id_change_no_answer(
    platform: Platform, spark: Any, tmp_path: Path
) -> None:
    settings = platform.settings
    source = settings.sources[0]
    bootstrap = settings.kafka.bootstrap_servers
    create_topics(settings)
    wall = int(time.time() * 1000)
    now = wall // MINUTE * MINUTE
    produce(
        bootstrap, source.topic, generate(GeneratorSpec(now - 30 * MINUTE, now - 3 * MINUTE, 900))
    )
    # One device four minutes ahead (inside max_future, so valid), keyed like the live events
    # below so that they share its partition; then live events of the last minute.
    ahead = SampleRecord(b"one-partition", _event("ahead", wall + 4 * MINUTE))
    live_start = now - MINUTE
    live = [
        SampleRecord(b"one-partition", _event(f"live-{i}", live_start + i * 500))
        for i in range(100)
    ]
    # One id at two times on one partition (two events), and again at the second time (a
    # producer retry of the second); all in cells still open for the speed layer.
    reused = [
        SampleRecord(b"reused", _event("reused", live_start + 10_000, page="/reused")),
        SampleRecord(b"reused", _event("reused", now + 10_000, page="/reused")),
        SampleRecord(b"reused", _event("reused", now + 10_000, page="/reused")),
    ]
    produce(bootstrap, source.topic, iter([ahead, *live, *reused]))
    records = oracle.read_topic(bootstrap, source.topic)

    drain_with_worker(platform, tmp_path / "speed.log")
    cells = speed_cells(platform)
    # every live event is in its minute: the event ahead did not make them late
    assert cells[("views_total", MINUTE, live_start, ())]["count"] == len(live) + 1  # + reused
    assert cells[("views_total", MINUTE, wall // MINUTE * MINUTE + 4 * MINUTE, ())]["count"] == 1
    expected, result = expected_base_cells(platform, records)
    assert late_counts(platform) == {m: n for m, n in result.late.items() if n}
    assert oracle.compare(expected, cells) == []
    reused_cells = _minutes_of(cells, "/reused")
    assert reused_cells == {live_start: 1, now: 1}

    run_id = queue(settings, RunRequest("full"))
    execute_run(settings, spark, run_id)
    finished = int(time.time() * 1000)
    run = run_record(settings, run_id)
    assert run.status == "succeeded", run.error
    served, _ = served_view(settings)
    assert served is not None
    for metric in ("views_by_page", "views_total"):
        # W stays behind the broker's clock by the grace: no partial window published
        assert served.watermarks[metric] <= finished - GRACE, (metric, served.watermarks)
    assert oracle_mismatches(settings, platform.config) == []
    assert speed_mismatches_after_w(platform, records) == []
    with connect(settings.postgres.url, autocommit=True) as conn:
        batch = batch_view_cells(settings, conn)
    # both layers count the reused id's two events, and the retry once; the run says so
    assert _minutes_of(batch, "/reused") == reused_cells
    assert run.reused_ids is not None and run.reused_ids >= 1
