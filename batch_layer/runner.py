"""The runner (rule 7): executes queued runs one at a time, queues the scheduled incremental
runs, retries failed runs with backoff and fails the runs of runners that died.

At most one run executes at a time across all runners: a runner executes only while it holds a
PostgreSQL session advisory lock. The lock dies with the runner's connection (a `kill -9`
included), so the runner that takes it next knows every run still marked `running` is an
orphan: it marks it failed and queues its retry."""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from datetime import UTC, datetime
from typing import Any

import psycopg

from batch_layer.errors import RunNotExecutable
from batch_layer.job import execute_run
from batch_layer.schedule import Schedule
from shared.config import Settings
from shared.db.connect import connect
from shared.db.runs import (
    RUNNER_LOCK,
    RunRecord,
    RunRequest,
    claim_next_run,
    fail_orphaned_runs,
    queue_retry,
    queue_run,
    release_runner_lock,
    try_runner_lock,
)
from shared.db.served import read_served
from shared.metric_plan import versions_of

log = logging.getLogger(__name__)


def runner_active(settings: Settings) -> bool:
    """Whether some runner currently holds the runner lock."""
    with connect(settings.postgres.url, autocommit=True) as conn:
        row = conn.execute(
            "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND granted "
            "AND classid::bigint = 0 AND objid::bigint = %s AND objsubid = 1",
            [RUNNER_LOCK],
        ).fetchone()
    return bool(row and row[0])


def _retry_delay(settings: Settings, attempt: int) -> float:
    return float(settings.batch.retry_backoff_s * 2 ** (attempt - 1))


def _maybe_retry(conn: psycopg.Connection[Any], settings: Settings, run: RunRecord) -> None:
    if run.attempt >= settings.batch.max_attempts:
        log.error("run %s failed on attempt %s; giving up", run.id, run.attempt)
        return
    delay = _retry_delay(settings, run.attempt)
    retry = queue_retry(conn, run, delay)
    log.warning("run %s failed; retry %s queued in %.0f s", run.id, retry, delay)


def _queue_full_on_new_versions(conn: psycopg.Connection[Any], settings: Settings) -> None:
    """Rule 7: a changed set of metric definitions queues a full run."""
    served = read_served(conn)
    if served is None:
        return
    if served.versions != versions_of(settings.plans.values()):
        busy = conn.execute(
            "SELECT 1 FROM batch_runs WHERE status IN ('queued', 'running') AND mode = 'full'"
        ).fetchone()
        if busy is None:
            run_id, _ = queue_run(conn, RunRequest("full"))
            log.info("metric definitions changed; queued full run %s", run_id)


def run_runner(
    settings: Settings,
    *,
    once: bool = False,
    spark: Any = None,
    schedule: bool = True,
    stop: threading.Event | None = None,
) -> int:
    """Execute queued runs one at a time (and queue scheduled incremental runs); returns the
    number of runs executed.

    `once`: execute the runs that are due now, then return (at once, with 0, when another
    runner holds the lock: it will execute them). Otherwise run until `stop` is set. The Spark
    session is created at the first run unless `spark` is given."""
    stop = stop or threading.Event()
    name = f"{socket.gethostname()}:{os.getpid()}"
    plan = Schedule(settings.batch.schedule)
    next_fire = plan.next_after(datetime.now(UTC))
    executed = 0
    with connect(settings.postgres.url, autocommit=True) as conn:
        while not try_runner_lock(conn):
            if once:
                return 0
            log.info("another runner holds the runner lock; waiting")
            if stop.wait(settings.batch.poll_s):
                return 0
        try:
            for orphan in fail_orphaned_runs(conn):
                log.warning("run %s was left running by a dead runner; marked failed", orphan.id)
                _maybe_retry(conn, settings, orphan)
            while not stop.is_set():
                _queue_full_on_new_versions(conn, settings)
                if schedule and datetime.now(UTC) >= next_fire:
                    run_id, _ = queue_run(conn, RunRequest("incremental"))
                    log.info("scheduled incremental run %s queued", run_id)
                    next_fire = plan.next_after(datetime.now(UTC))
                run = claim_next_run(conn, name)
                if run is None:
                    if once:
                        break
                    stop.wait(settings.batch.poll_s)
                    continue
                if spark is None:
                    from batch_layer.spark import spark_session

                    spark = spark_session(settings)
                executed += 1
                began = time.monotonic()
                try:
                    summary = execute_run(settings, spark, run.id, hold_lock=False)
                    log.info(
                        "run %s (%s) succeeded in %.1f s: %s events in, %s cells out",
                        run.id,
                        summary.mode,
                        time.monotonic() - began,
                        summary.rows_in,
                        summary.rows_out,
                    )
                except RunNotExecutable as exc:
                    log.warning("%s", exc)
                except Exception:
                    log.exception("run %s failed", run.id)
                    _maybe_retry(conn, settings, run)
        finally:
            release_runner_lock(conn)
    return executed
