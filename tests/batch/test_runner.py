"""The runner: queued runs one at a time, coalescing, cancel, dead runners' runs, retries."""

from __future__ import annotations

import itertools
import time
from pathlib import Path
from typing import Any

import psutil
import pytest

from batch_layer import run_runner, runner_active
from batch_layer.job import nice_local_backend
from lambdactl.generator import GeneratorSpec
from shared.config import BatchConfig, Settings
from shared.db.connect import connect
from shared.db.runs import RUNNER_LOCK, RunRequest, cancel_run, list_runs, queue_run
from shared.kafka import create_topics
from tests.batch.helpers import HOUR, MINUTE, oracle_mismatches, produce_spec, queue, run_record
from tests.conftest import Platform, own_platform

pytestmark = [pytest.mark.services, pytest.mark.timeout(300)]


def test_the_local_postgres_backend_of_a_run_takes_the_runners_niceness(
    platform: Platform,
) -> None:
    """`ps -o ni` of the backend serving a run's connection shows `batch.nice`: publication's
    `COPY` and index work yields to the speed and serving layers as the run itself does."""
    with connect(platform.settings.postgres.url) as conn:
        backend = psutil.Process(conn.info.backend_pid)
        assert backend.nice() == 0
        nice_local_backend(conn, platform.settings.batch.nice)
        assert backend.nice() == BatchConfig().nice == 10


def test_a_runner_of_another_database_on_the_server_is_not_this_platforms(
    platform: Platform, stack: Settings, tmp_path: Path
) -> None:
    """Two platforms sharing a PostgreSQL server: the runner lock one holds (an advisory lock,
    listed in `pg_locks` with every database's) does not make the other's runner active."""
    (tmp_path / "other").mkdir()
    with (
        own_platform(stack, tmp_path / "other") as other,
        connect(other.settings.postgres.url, autocommit=True) as holder,
    ):
        holder.execute("SELECT pg_advisory_lock(%s)", [RUNNER_LOCK])
        assert runner_active(other.settings)
        assert not runner_active(platform.settings)


def test_queued_runs_execute_one_at_a_time(platform: Platform, spark: Any) -> None:
    settings = platform.settings
    create_topics(settings)
    now = int(time.time() * 1000) // MINUTE * MINUTE
    produce_spec(settings, GeneratorSpec(now - 2 * HOUR, now, 600, seed=41))
    with connect(settings.postgres.url, autocommit=True) as conn:
        full, _ = queue_run(conn, RunRequest("full"))
        incr, coalesced = queue_run(conn, RunRequest("incremental"))
        assert not coalesced
        assert queue_run(conn, RunRequest("incremental")) == (incr, True)
        ranged, _ = queue_run(conn, RunRequest("range", now - HOUR, now))
        dropped, _ = queue_run(conn, RunRequest("range", now - 2 * HOUR, now))
        assert cancel_run(conn, dropped)
        assert not cancel_run(conn, dropped), "only queued runs can be cancelled"

    with connect(settings.postgres.url, autocommit=True) as holder:
        holder.execute("SELECT pg_advisory_lock(%s)", [RUNNER_LOCK])
        assert runner_active(settings)
        assert run_runner(settings, once=True, spark=spark, schedule=False) == 0
        assert run_record(settings, full).status == "queued"
    assert not runner_active(settings)

    assert run_runner(settings, once=True, spark=spark, schedule=False) == 3
    records = [run_record(settings, run_id) for run_id in (full, incr, ranged)]
    for record in records:
        assert record.status == "succeeded", record.error
        assert record.progress == 1 and record.heartbeat_at is not None
        assert record.timings and record.timings["total_s"] > 0
        assert record.rows_in is not None and record.snapshot
    assert [r.executed_mode for r in records] == ["full", "incremental", "range"]
    for before, after in itertools.pairwise(records):
        assert before.finished_at is not None and after.started_at is not None
        assert before.finished_at <= after.started_at
    assert run_record(settings, dropped).status == "cancelled"
    assert oracle_mismatches(settings, platform.config) == []


def test_dead_runners_run_is_failed_and_retried(platform: Platform, spark: Any) -> None:
    settings = platform.settings.model_copy(update={"batch": BatchConfig(retry_backoff_s=0)})
    create_topics(settings)
    now = int(time.time() * 1000) // MINUTE * MINUTE
    produce_spec(settings, GeneratorSpec(now - HOUR, now, 300, seed=42))
    run_id = queue(settings, RunRequest("full"))
    with connect(settings.postgres.url, autocommit=True) as conn:
        conn.execute(
            "UPDATE batch_runs SET status = 'running', runner = 'gone:1', started_at = now(), "
            "heartbeat_at = now() - interval '5 minutes' WHERE id = %s",
            [run_id],
        )
    assert run_runner(settings, once=True, spark=spark, schedule=False) == 1
    dead = run_record(settings, run_id)
    assert dead.status == "failed" and dead.error and "runner" in dead.error
    with connect(settings.postgres.url, autocommit=True) as conn:
        retry = next(r for r in list_runs(conn) if r.retry_of == run_id)
    assert retry.status == "succeeded" and retry.attempt == 2
    assert oracle_mismatches(settings, platform.config) == []
