"""The run queue (rule 7): identical queued requests coalesce; an operator's request is bounded
(`batch.max_queued_runs` queued runs per mode, ranges within event times and at most
`batch.max_range_days` wide), and a range is refused while a session metric is configured."""

from __future__ import annotations

import subprocess
import sys
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import pytest
from fastapi.testclient import TestClient

from serving_layer import create_app
from shared.config import BatchConfig
from shared.db.connect import connect
from shared.db.runs import DAY_MS, QueueFull, RunRequest, queue_run
from shared.events import MAX_EVENT_MS, MIN_EVENT_MS
from tests.conftest import Platform, reconfigured

pytestmark = [pytest.mark.services, pytest.mark.timeout(300)]

BOUND = 3
HOUR_MS = 3_600_000
T0 = 1_767_225_600_000  # 2026-01-01T00:00:00Z


SESSION_METRIC = {
    "name": "route_sessions",
    "source": "pageviews",
    "key": ["user_id"],
    "aggregations": ["count"],
    "session": {"gap": "5m", "max_duration": "30m"},
    "windows": ["5m", "1h"],
}
REFUSAL = (
    "a range run cannot recompute session metric 'route_sessions'",
    "rule 13 in docs/semantics.md",
    'queue a full run ({"mode": "full"}',
)


def _range(i: int) -> dict[str, int | str]:
    return {"mode": "range", "start": T0 + i * HOUR_MS, "end": T0 + (i + 1) * HOUR_MS}


def _runs(platform: Platform) -> int:
    """Every run in the log, whatever its status."""
    with connect(platform.settings.postgres.url, autocommit=True) as conn:
        row = conn.execute("SELECT count(*) FROM batch_runs").fetchone()
    assert row is not None
    return int(row[0])


def _queued(platform: Platform, mode: str) -> int:
    with connect(platform.settings.postgres.url, autocommit=True) as conn:
        row = conn.execute(
            "SELECT count(*) FROM batch_runs WHERE status = 'queued' AND mode = %s", [mode]
        ).fetchone()
    assert row is not None
    return int(row[0])


@pytest.fixture
def limits(platform: Platform) -> BatchConfig:
    return platform.settings.batch.model_copy(update={"max_queued_runs": BOUND})


@pytest.fixture
def with_sessions(platform: Platform) -> Platform:
    """The platform with a session metric beside its own metrics."""
    return reconfigured(platform, metrics=[*platform.config["metrics"], SESSION_METRIC])


@pytest.fixture
def client(platform: Platform, limits: BatchConfig) -> Iterator[TestClient]:
    with TestClient(create_app(platform.settings.model_copy(update={"batch": limits}))) as c:
        yield c


def test_a_full_queue_refuses_other_requests_of_the_mode(
    platform: Platform, limits: BatchConfig, client: TestClient
) -> None:
    accepted = [client.post("/v1/batch/runs", json=_range(i)) for i in range(BOUND)]
    assert [r.status_code for r in accepted] == [202] * BOUND
    refused = client.post("/v1/batch/runs", json=_range(BOUND))
    assert refused.status_code == 429, refused.text
    assert refused.headers["Retry-After"] == "60"
    detail = refused.json()["detail"]
    for words in (f"{BOUND} range runs queued", "LAMBDA_BATCH__MAX_QUEUED_RUNS", "wait"):
        assert words in detail, detail
    assert "POST /v1/batch/runs/{id}/cancel" in detail

    again = client.post("/v1/batch/runs", json=_range(1))
    assert again.status_code == 202 and again.json()["coalesced"] is True
    assert again.json()["run_id"] == accepted[1].json()["run_id"]
    for mode in ("full", "incremental"):
        other = client.post("/v1/batch/runs", json={"mode": mode})
        assert other.status_code == 202 and other.json()["coalesced"] is False, other.text

    first = accepted[0].json()["run_id"]
    assert client.post(f"/v1/batch/runs/{first}/cancel").status_code == 200
    assert client.post("/v1/batch/runs", json=_range(BOUND)).status_code == 202
    assert client.post("/v1/batch/runs", json=_range(BOUND + 1)).status_code == 429
    assert _queued(platform, "range") == BOUND

    with connect(platform.settings.postgres.url, autocommit=True) as conn:
        with pytest.raises(QueueFull):
            queue_run(conn, RunRequest("range", T0 - HOUR_MS, T0, limits=limits))
        _run_id, coalesced = queue_run(conn, RunRequest("range", T0 - HOUR_MS, T0))
    assert not coalesced, "the runner's own runs (retries) are never refused"
    assert _queued(platform, "range") == BOUND + 1


def test_concurrent_requests_never_queue_past_the_bound(
    platform: Platform, client: TestClient
) -> None:
    requests = 30
    barrier = threading.Barrier(requests)

    def post(i: int) -> int:
        barrier.wait()
        return client.post("/v1/batch/runs", json=_range(i)).status_code

    with ThreadPoolExecutor(requests) as pool:
        statuses = list(pool.map(post, range(requests)))
    assert sorted(statuses) == [202] * BOUND + [429] * (requests - BOUND)
    assert _queued(platform, "range") == BOUND


def test_ranges_lie_within_event_times_and_the_widest_range(
    limits: BatchConfig, client: TestClient
) -> None:
    widest = limits.max_range_days
    assert widest == 366
    cases: list[tuple[dict[str, int | str], list[str]]] = [
        (
            {"mode": "range", "start": "0001-01-01T00:00:00Z", "end": "9999-12-31T00:00:00Z"},
            ["at most 366 days", "LAMBDA_BATCH__MAX_RANGE_DAYS", "queue a full run"],
        ),
        (
            {"mode": "range", "start": T0, "end": T0 + (widest + 1) * DAY_MS},
            ["at most 366 days", "not 367.0"],
        ),
        ({"mode": "range", "start": MIN_EVENT_MS - 1, "end": T0}, ["not a time"]),
        ({"mode": "range", "start": T0, "end": MAX_EVENT_MS + 1}, ["not a time"]),
    ]
    for body, words in cases:
        r = client.post("/v1/batch/runs", json=body)
        assert r.status_code == 400, (body, r.text)
        for word in words:
            assert word in r.json()["detail"], (body, r.json())
    widest_ok = client.post("/v1/batch/runs", json={**_range(0), "end": T0 + widest * DAY_MS})
    assert widest_ok.status_code == 202, widest_ok.text
    for start, end in ((MIN_EVENT_MS - 1, T0), (T0, MAX_EVENT_MS + 1)):
        with pytest.raises(ValueError, match="within event times"):
            RunRequest("range", start, end)


def test_lambdactl_batch_run_refused_prints_why_and_exits_1(platform: Platform) -> None:
    with connect(platform.settings.postgres.url, autocommit=True) as conn:
        queue_run(conn, RunRequest("range", T0, T0 + HOUR_MS))
    command = ["batch", "run", "--mode", "range", "--start", str(T0 + HOUR_MS)]
    done = subprocess.run(
        [sys.executable, "-m", "lambdactl", *command, "--end", str(T0 + 2 * HOUR_MS)],
        env={**platform.env, "LAMBDA_BATCH__MAX_QUEUED_RUNS": "1", "COLUMNS": "400"},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 1, (done.stdout, done.stderr)
    assert "1 range run queued" in done.stdout, done.stdout
    assert "LAMBDA_BATCH__MAX_QUEUED_RUNS" in done.stdout
    assert "Traceback" not in done.stdout + done.stderr
    assert _queued(platform, "range") == 1


def test_identical_queued_ranges_coalesce_and_different_ones_do_not(client: TestClient) -> None:
    """Coalescing compares the requested mode and instants (before a range is widened to
    window boundaries), and only with a run still queued."""
    first = client.post("/v1/batch/runs", json=_range(0)).json()
    assert first["coalesced"] is False
    twin = client.post("/v1/batch/runs", json={**_range(0), "start": "2026-01-01T00:00:00Z"})
    assert twin.status_code == 202 and twin.json()["coalesced"] is True, twin.text
    assert twin.json()["run_id"] == first["run_id"]
    others = [
        {**_range(0), "end": T0 + 2 * HOUR_MS},  # same start, another end
        {**_range(0), "start": T0 + 1},  # widened to the same windows, still another range
    ]
    ids = {first["run_id"]}
    for body in others:
        other = client.post("/v1/batch/runs", json=body)
        assert other.status_code == 202 and other.json()["coalesced"] is False, (body, other.text)
        ids.add(other.json()["run_id"])
    assert len(ids) == 1 + len(others)
    assert client.post(f"/v1/batch/runs/{first['run_id']}/cancel").status_code == 200
    again = client.post("/v1/batch/runs", json=_range(0)).json()
    assert again["coalesced"] is False and again["run_id"] not in ids, "only queued runs"


def test_a_range_is_refused_while_a_session_metric_is_configured(
    with_sessions: Platform,
) -> None:
    with connect(with_sessions.settings.postgres.url, autocommit=True) as conn:
        queued, _ = queue_run(conn, RunRequest("range", T0, T0 + HOUR_MS))  # from before
    with TestClient(create_app(with_sessions.settings)) as client:
        for body in (_range(0), _range(1)):
            refused = client.post("/v1/batch/runs", json=body)
            assert refused.status_code == 409, refused.text
            for words in REFUSAL:
                assert words in refused.json()["detail"], refused.json()
        assert client.get("/v1/batch/runs").json()["runs"][0]["run_id"] == queued
        for mode in ("full", "incremental"):
            other = client.post("/v1/batch/runs", json={"mode": mode})
            assert other.status_code == 202, other.text
    assert _queued(with_sessions, "range") == 1, "the refused requests queued nothing"


def test_lambdactl_batch_run_refuses_a_range_while_a_session_metric_is_configured(
    with_sessions: Platform,
) -> None:
    command = ["batch", "run", "--mode", "range", "--start", str(T0), "--end", str(T0 + HOUR_MS)]
    done = subprocess.run(
        [sys.executable, "-m", "lambdactl", *command],
        env={**with_sessions.env, "COLUMNS": "400"},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 1, (done.stdout, done.stderr)
    for words in REFUSAL:
        assert words in done.stdout, done.stdout
    assert "Traceback" not in done.stdout + done.stderr
    assert _runs(with_sessions) == 0, "nothing was queued, so nothing ran"
