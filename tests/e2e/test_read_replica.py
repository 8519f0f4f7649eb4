"""The batch view read from a PostgreSQL streaming replica (`serving.batch_view_url`) while the
runner writes the primary: queries, `/v1/status` and the speed layer's reads of the served row
see the replica's copy; a replica that lags behind a published flip serves the older W with
every cell of it (never the new row with old cells, or the reverse), and the newer one once it
has replayed; the run routes keep writing the primary."""

from __future__ import annotations

import random
import threading
from collections import Counter
from typing import Any

import pytest
from fastapi.testclient import TestClient

from serving_layer import create_app
from serving_layer.timefmt import format_time, parse_time
from shared.db.connect import connect
from shared.db.migrate import upgrade
from shared.db.served import read_served
from speed_layer.served_state import ServedState
from tests.conftest import Platform, reconfigured
from tests.e2e.support import private_services
from tests.pg_replica import pause_replay, resume_replay, streaming_replica, wait_received
from tests.serving.views import Event, batch_rows, load_views, publish, random_events

pytestmark = [pytest.mark.services, pytest.mark.timeout(300)]

MINUTE, HOUR = 60_000, 3_600_000
T0 = 1_767_225_600_000  # 2026-01-01T00:00:00Z
W1, W2 = T0 - 20 * MINUTE, T0 + 25 * MINUTE
PAGE = "/a"


def _series(client: TestClient) -> dict[str, Any]:
    response = client.get(
        "/v1/metrics/views_by_page/series",
        params={
            "window": "1m",
            "page": PAGE,
            "start": format_time(T0 - HOUR),
            "end": format_time(T0 + HOUR),
        },
    )
    assert response.status_code == 200, response.text
    body: dict[str, Any] = response.json()
    return body


def _wrong_points(body: dict[str, Any], events: list[Event]) -> list[str]:
    """The points whose count differs from a brute-force count of the events, or whose
    `source` does not follow from the answer's own W (rule 8)."""
    want = Counter((e.time_ms - e.time_ms % MINUTE) for e in events if e.key == (PAGE,))
    w = parse_time(body["batch_watermark"])
    wrong = []
    for point in body["points"]:
        start = parse_time(point["start"])
        source = "batch" if start + MINUTE <= w else "speed"
        if point["count"] != want.get(start, 0) or point["source"] != source:
            wrong.append(f"{point} (want count {want.get(start, 0)}, source {source})")
    return wrong


def test_queries_read_a_streaming_replica_and_a_lagging_one_serves_its_older_w_whole(
    platform: Platform,
) -> None:
    events = random_events(random.Random(7), T0 - HOUR, T0 + HOUR, 3000, ["/", PAGE, "/b"])
    kafka = platform.settings.kafka.bootstrap_servers
    with private_services(("postgres",), kafka=kafka) as managed:
        primary_url = managed.postgres.url
        upgrade(primary_url)
        with streaming_replica(primary_url) as replica_url:
            world = reconfigured(
                platform, postgres={"url": primary_url}, serving={"batch_view_url": replica_url}
            )
            settings = world.settings
            load_views(settings, events, W1, seed=3)
            wait_received(primary_url, replica_url, replayed=True)
            with TestClient(create_app(settings)) as client:
                first = _series(client)
                assert first["batch_watermark"] == format_time(W1)
                assert not _wrong_points(first, events)
                assert sum(p["count"] for p in first["points"]) > 500

                served_generation = client.get("/v1/status").json()["generation"]
                pause_replay(replica_url)
                rows = [
                    r for m in settings.plans.values() for r in batch_rows(settings, m, events, W2)
                ]
                publish(settings, rows, dict.fromkeys(settings.plans, W2))  # a flip to W2
                wait_received(primary_url, replica_url, replayed=False)
                with connect(primary_url) as conn:
                    primary = read_served(conn)
                assert primary is not None and primary.watermarks["views_by_page"] == W2

                lagging = _series(client)
                assert lagging == first, "a lagging replica answers from the W it holds"
                speed_w = ServedState(settings)
                assert speed_w.refresh()
                assert speed_w.watermarks["views_by_page"] == W1, (
                    "the speed layer counts a W as served only once the API's copy holds it"
                )
                status = client.get("/v1/status").json()
                assert status["metrics"][0]["batch_watermark"] == format_time(W1)
                assert status["generation"] == served_generation < primary.generation
                assert status["replica_lag_s"] > 0, status
                assert client.get("/readyz").json()["checks"]["batch_view_replica"] == "ok"
                assert "batch_view_replay_lag_seconds" in client.get("/metrics").text
                queued = client.post("/v1/batch/runs", json={"mode": "incremental"})
                assert queued.status_code == 202, "runs are queued on the primary"

                answers: list[dict[str, Any]] = []
                resumed = threading.Timer(0.3, resume_replay, (replica_url,))
                resumed.start()
                try:
                    while not answers or answers[-1]["batch_watermark"] != format_time(W2):
                        answers.append(_series(client))
                        assert len(answers) < 2000, "the replica never served W2"
                finally:
                    resumed.join()
                seen = Counter(a["batch_watermark"] for a in answers)
                assert set(seen) == {format_time(W1), format_time(W2)}, seen
                for answer in answers:  # every answer whole for the W it reports
                    assert not _wrong_points(answer, events), answer["batch_watermark"]
                status = client.get("/v1/status").json()
                assert status["generation"] == primary.generation
                assert 0 <= status["replica_lag_s"] < 10, status
