"""Every bad input is a 4xx whose message says what to send; never a 5xx."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import redis
from fastapi.testclient import TestClient

from serving_layer import create_app
from shared.kafka import create_topics
from shared.speed_view import (
    PartitionStall,
    SpeedViewWriter,
    fence_key,
    rebuild_member,
    redis_client,
)
from tests.broker._kafka import eventually
from tests.conftest import Platform

pytestmark = [pytest.mark.services, pytest.mark.timeout(120)]

S, E = "2026-01-01T00:00:00Z", "2026-01-02T00:00:00Z"
SERIES = "/v1/metrics/views_by_page/series"
CASES = [
    # (method, path, params or json, status, words the message must contain)
    (
        "GET",
        "/v1/metrics/nope/series",
        {"window": "1m", "start": S, "end": E},
        404,
        ["unknown metric", "views_by_page"],
    ),
    (
        "GET",
        SERIES,
        {"window": "90s", "start": S, "end": E, "page": "/"},
        400,
        ["not a positive multiple", "base window 1m", "1m, 1h, 1d"],
    ),
    (
        "GET",
        SERIES,
        {"window": "1h", "step": "30s", "start": S, "end": E, "page": "/"},
        400,
        ["step='30s'", "base window 1m"],
    ),
    (
        "GET",
        SERIES,
        {"window": "1d", "tz": "Mars/Olympus", "start": S, "end": E, "page": "/"},
        400,
        ["tz='Mars/Olympus'", "IANA"],
    ),
    ("GET", SERIES, {"window": "soon", "start": S, "end": E, "page": "/"}, 400, ["not a duration"]),
    ("GET", SERIES, {"window": "1m", "start": S, "end": E, "pge": "/"}, 400, ["'pge'", "page"]),
    (
        "GET",
        SERIES,
        {"window": "1m", "start": "yesterday", "end": E, "page": "/"},
        400,
        ["not a time", "RFC 3339"],
    ),
    (
        "GET",
        SERIES,
        {"window": "1m", "start": E, "end": S, "page": "/"},
        400,
        ["start must be before end"],
    ),
    (
        "GET",
        SERIES,
        {"window": "1m", "start": S, "end": E, "page": "/"},
        400,
        ["cells", "LAMBDA_SERVING__MAX_CELLS", "narrow"],
    ),
    ("GET", SERIES, {"start": S, "end": E, "page": "/"}, 400, ["window", "missing"]),
    (
        "GET",
        "/v1/metrics/views_by_page/top",
        {"window": "1h", "at": S, "by": "p75"},
        400,
        ["by=", "count", "p99"],
    ),
    (
        "GET",
        "/v1/metrics/views_by_page/top",
        {"window": "1h", "at": S, "by": "median"},
        400,
        ["by=", "count"],
    ),
    (
        "GET",
        SERIES,
        {"window": "1h", "start": S, "end": E, "page": "/", "q": "0.5,1"},
        400,
        ["q=", "between 0 and 1"],
    ),
    ("GET", "/v1/metrics/views_by_page/top", {"window": "1h", "at": S, "n": "0"}, 400, ["n must"]),
    ("GET", "/v1/metrics/views_by_page/top", {"window": "1h", "at": S, "n": "x"}, 400, ["n"]),
    (
        "GET",
        "/v1/metrics/views_by_page/top",
        {"window": "1h", "at": "99999999999999999999"},
        400,
        ["not a time"],
    ),
    (
        "GET",
        "/v1/metrics/views_by_page/keys",
        {"start": S, "end": E, "limit": "0"},
        400,
        ["limit must"],
    ),
    ("POST", "/v1/batch/runs", {"mode": "sideways"}, 400, ["mode"]),
    ("POST", "/v1/batch/runs", {"mode": "range", "start": S}, 400, ["range run needs"]),
    ("POST", "/v1/batch/runs", {"mode": "range", "start": E, "end": S}, 400, ["start < end"]),
    ("POST", "/v1/batch/runs", {"mode": "full", "start": S, "end": E}, 400, ["range runs only"]),
    ("POST", "/v1/batch/runs", {"mode": "range", "start": "x", "end": E}, 400, ["not a time"]),
    ("GET", "/v1/batch/runs/12345", None, 404, ["no batch run"]),
    ("GET", "/v1/batch/runs/abc", None, 400, ["run_id"]),
    ("POST", "/v1/batch/runs/12345/cancel", None, 404, ["no batch run"]),
]


@pytest.fixture
def small_client(platform: Platform) -> TestClient:
    settings = platform.settings.model_copy(
        update={"serving": platform.settings.serving.model_copy(update={"max_cells": 1000})}
    )
    return TestClient(create_app(settings))


def test_bad_input_is_4xx_with_a_message(small_client: TestClient) -> None:
    with small_client as client:
        for method, path, data, status, words in CASES:
            call = client.get if method == "GET" else client.post
            r = call(path, params=data) if method == "GET" else call(path, json=data)
            assert r.status_code == status, (path, data, r.text)
            detail = r.json()["detail"]
            for word in words:
                assert word in detail, (path, data, detail)
        r = client.post(
            "/v1/batch/runs", content=b"{not json", headers={"content-type": "application/json"}
        )
        assert r.status_code == 400
        queued = client.post("/v1/batch/runs", json={"mode": "full"}).json()
        client.post(f"/v1/batch/runs/{queued['run_id']}/cancel")
        r = client.post(f"/v1/batch/runs/{queued['run_id']}/cancel")
        assert r.status_code == 409 and "only a queued run" in r.json()["detail"]


@pytest.fixture
def patient_client(platform: Platform) -> Iterator[TestClient]:
    """The API waiting 5 s for Kafka (default 2 s): the shared broker answers slowly while
    other tests load the 2 cores, and this test asserts `kafka: ok`."""
    serving = platform.settings.serving.model_copy(update={"kafka_timeout_s": 5.0})
    with TestClient(create_app(platform.settings.model_copy(update={"serving": serving}))) as c:
        yield c


def test_runs_queue_coalesce_list_cancel(platform: Platform, patient_client: TestClient) -> None:
    client = patient_client
    first = client.post("/v1/batch/runs", json={"mode": "incremental"})
    assert first.status_code == 202, first.text
    body = first.json()
    assert body["status"] == "queued" and body["coalesced"] is False and body["progress"] == 0
    again = client.post("/v1/batch/runs", json={})
    assert again.json()["run_id"] == body["run_id"] and again.json()["coalesced"] is True
    ranged = client.post(
        "/v1/batch/runs",
        json={"mode": "range", "start": "2026-01-01T00:00:00Z", "end": 1767229200000},
    ).json()
    assert ranged["start"] == "2026-01-01T00:00:00Z" and ranged["end"] == "2026-01-01T01:00:00Z"
    listed = client.get("/v1/batch/runs").json()["runs"]
    assert [r["run_id"] for r in listed] == [ranged["run_id"], body["run_id"]]
    one = client.get(f"/v1/batch/runs/{body['run_id']}").json()
    assert one["mode"] == "incremental" and one["status"] == "queued"
    cancelled = client.post(f"/v1/batch/runs/{body['run_id']}/cancel")
    assert cancelled.status_code == 200 and cancelled.json()["status"] == "cancelled"
    assert (
        client.get("/v1/batch/runs", params={"status": "queued"}).json()["runs"][0]["run_id"]
        == ranged["run_id"]
    )
    status = client.get("/v1/status").json()
    assert [r["run_id"] for r in status["runs"]][:2] == [ranged["run_id"], body["run_id"]]
    assert len(status["partitions"]) == 4 and status["kafka"] == "ok"
    create_topics(platform.settings)
    redis.Redis.from_url(platform.settings.redis.url).hset(
        fence_key(platform.settings.sources[0].topic, 1), mapping={"offset": 4, "stream_time": 0}
    )
    # A topic just created reaches the probe's metadata a moment later; until then the end
    # offset is reported unknown (null), never a wrong number.
    partitions, _ = eventually(
        lambda: client.get("/v1/status").json()["partitions"],
        lambda parts: parts[0]["end_offset"] is not None,
        timeout=15,
        what="/v1/status reporting the new topic's end offsets",
    )
    assert partitions[0]["end_offset"] == 0 and partitions[0]["lag"] == 0
    assert partitions[1]["applied_offset"] == 4 and partitions[1]["stream_time"] == (
        "1970-01-01T00:00:00Z"
    )
    assert client.get("/readyz").json() == {
        "ready": True,
        "checks": {"postgres": "ok", "redis": "ok", "kafka": "ok", "speed": "ok"},
    }


def test_a_stalled_speed_partition_is_reported(platform: Platform, client: TestClient) -> None:
    """Issue #26: a partition whose batches keep failing is visible (which, since when, why)
    in /v1/status and /readyz, until a worker applies it again (`SpeedWorker.note_stall`)."""
    topic = platform.settings.sources[0].topic
    writer = SpeedViewWriter(redis_client(platform.settings.redis), 3600)
    stall = PartitionStall("error", "OverflowError: intermediate overflow", 1767225600000, "h:1")
    writer.report_stall(rebuild_member(topic, 2), stall)
    parts = client.get("/v1/status").json()["partitions"]
    assert [p["stalled"] for p in parts if p["partition"] != 2] == [None] * 3
    assert parts[2]["stalled"] == {
        "cause": "error",
        "error": "OverflowError: intermediate overflow",
        "since": "2026-01-01T00:00:00Z",
        "worker": "h:1",
    }
    ready = client.get("/readyz")
    assert ready.status_code == 503
    assert ready.json()["checks"]["speed"] == (
        f"stalled: {topic}:2 since 2026-01-01T00:00:00Z (error: OverflowError: intermediate "
        "overflow)"
    )
    writer.clear_stall(rebuild_member(topic, 2))
    assert client.get("/readyz").json()["checks"]["speed"] == "ok"
    assert all(p["stalled"] is None for p in client.get("/v1/status").json()["partitions"])


def test_metrics_listing_and_prometheus(client: TestClient) -> None:
    body = client.get("/v1/metrics").json()
    views = next(m for m in body["metrics"] if m["name"] == "views_by_page")
    assert views["key"] == ["page"] and views["windows"] == ["1m", "1h", "1d"]
    assert views["aggregations"] == [
        "count",
        "sum",
        "min",
        "max",
        "avg",
        "distinct_user_id",
        "p50",
        "p90",
        "p99",
    ]
    assert views["grace"] == "2m" and len(views["version"]) == 12
    assert views["fields"] == {} and views["where"] is None
    client.get("/v1/metrics/nope/series")
    text = client.get("/metrics").text
    assert (
        'lambda_serving_request_seconds_bucket{le="0.001",method="GET",route="/v1/metrics"}' in text
    )
    assert (
        'lambda_serving_errors_total{kind="4xx",route="/v1/metrics/{metric_name}/series"}' in text
    )
    assert "batch_watermark_age_seconds" in text
