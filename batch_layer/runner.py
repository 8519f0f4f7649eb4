"""The runner (rule 7): executes queued runs one at a time, queues the scheduled incremental
runs, retries failed runs with backoff (except those whose error is `NotRetriable`) and fails
the runs of runners that died.

At most one run executes at a time across all runners: a runner executes only while it holds a
PostgreSQL session advisory lock. The lock dies with the runner's connection (a `kill -9`
included), so the runner that takes it next knows every run still marked `running` is an
orphan: it marks it failed and queues its retry.

PostgreSQL going away does not end the runner: it reconnects with a capped backoff
(`batch.outage_backoff_s` up to `batch.outage_backoff_max_s`, logged once when PostgreSQL goes
down and once when it is back), takes the lock again, records the run the outage interrupted
as failed with its error (it could not be recorded while PostgreSQL was down) and retries it
per `batch.max_attempts`, then executes the queued runs as before."""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import threading
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import psycopg

from batch_layer.errors import NotRetriable, RunNotExecutable
from batch_layer.job import execute_run
from batch_layer.schedule import Schedule
from shared.backoff import Backoff
from shared.config import Settings
from shared.db.connect import connect
from shared.db.runs import (
    RUNNER_LOCK,
    RunRecord,
    RunRequest,
    claim_next_run,
    fail_orphaned_runs,
    mark_failed,
    queue_retry,
    queue_run,
    release_runner_lock,
    try_runner_lock,
)
from shared.db.served import read_served
from shared.metric_plan import versions_of

log = logging.getLogger(__name__)


def runner_active(settings: Settings) -> bool:
    """Whether some runner of this database currently holds the runner lock (`pg_locks` shows
    every database's locks: platforms sharing a PostgreSQL server each have their own)."""
    with connect(settings.postgres.url, autocommit=True) as conn:
        row = conn.execute(
            "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND granted "
            "AND database = (SELECT oid FROM pg_database WHERE datname = current_database()) "
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
    if retry is not None:
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
    runner holds the lock: it will execute them); PostgreSQL failing then raises. Otherwise
    run until `stop` is set, riding out PostgreSQL outages (module doc). The Spark session is
    created at the first run unless `spark` is given."""
    runner = _Runner(settings, spark, once=once, schedule=schedule, stop=stop or threading.Event())
    while True:
        try:
            runner.serve()
            return runner.executed
        except psycopg.OperationalError as exc:
            if once:
                raise
            if runner.stop.wait(runner.backoff.failed(exc)):
                return runner.executed


@dataclass
class _Runner:
    """One runner's state across its PostgreSQL sessions (a session ends with an outage)."""

    settings: Settings
    spark: Any
    once: bool
    schedule: bool
    stop: threading.Event
    name: str = field(default_factory=lambda: f"{socket.gethostname()}:{os.getpid()}")
    executed: int = 0
    interrupted: tuple[RunRecord, BaseException] | None = None
    """A run that failed (its error) and whose failure is not fully recorded yet: PostgreSQL
    went away before its retry was queued, or before it was even marked failed."""
    backoff: Backoff = field(init=False)
    plan: Schedule = field(init=False)
    next_fire: datetime = field(init=False)

    def __post_init__(self) -> None:
        batch = self.settings.batch
        self.backoff = Backoff("postgres", batch.outage_backoff_s, batch.outage_backoff_max_s, log)
        self.plan = Schedule(batch.schedule)
        self.next_fire = self.plan.next_after(datetime.now(UTC))

    def serve(self) -> None:
        """One session: take the runner lock, settle what an outage or a dead runner left,
        then execute runs until stopped (or, `once`, until none is due). Raises
        `psycopg.OperationalError` when PostgreSQL goes away."""
        settings = self.settings
        with connect(settings.postgres.url, autocommit=True) as conn:
            self.backoff.recovered()
            while not try_runner_lock(conn):
                if self.once:
                    return
                log.info("another runner holds the runner lock; waiting")
                if self.stop.wait(settings.batch.poll_s):
                    return
            try:
                self._settle_interrupted(conn)
                for orphan in fail_orphaned_runs(conn):
                    log.warning(
                        "run %s was left running by a dead runner; marked failed", orphan.id
                    )
                    _maybe_retry(conn, settings, orphan)
                self._execute_queued(conn)
            finally:
                with contextlib.suppress(psycopg.Error):  # a lost session has no lock anyway
                    release_runner_lock(conn)

    def _execute_queued(self, conn: psycopg.Connection[Any]) -> None:
        settings = self.settings
        while not self.stop.is_set():
            _queue_full_on_new_versions(conn, settings)
            if self.schedule and datetime.now(UTC) >= self.next_fire:
                run_id, _ = queue_run(conn, RunRequest("incremental"))
                log.info("scheduled incremental run %s queued", run_id)
                self.next_fire = self.plan.next_after(datetime.now(UTC))
            run = claim_next_run(conn, self.name)
            if run is None:
                if self.once:
                    return
                self.stop.wait(settings.batch.poll_s)
                continue
            if self.spark is None:
                from batch_layer.spark import spark_session

                self.spark = spark_session(settings)
            self.executed += 1
            began = time.monotonic()
            try:
                summary = execute_run(settings, self.spark, run.id, hold_lock=False)
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
            except Exception as exc:
                log.exception("run %s failed", run.id)
                self.interrupted = (run, exc)
                self._settle_interrupted(conn)

    def _settle_interrupted(self, conn: psycopg.Connection[Any]) -> None:
        """Record the failed run's outcome: marked failed (when PostgreSQL was down as it
        failed, only now, with its error) and retried per `batch.max_attempts`, unless what
        made it fail is `NotRetriable`."""
        if self.interrupted is None:
            return
        run, error = self.interrupted
        cause = _cause(error)
        if mark_failed(
            conn,
            run.id,
            f"{type(cause).__name__}: {cause} "
            "(PostgreSQL was unreachable as the run failed; recorded later)",
        ):
            log.warning("run %s failed while PostgreSQL was unreachable; marked failed", run.id)
        if isinstance(cause, NotRetriable):
            log.error("run %s is not retried: another attempt would fail the same way", run.id)
        else:
            _maybe_retry(conn, self.settings, run)
        self.interrupted = None


def _cause(error: BaseException) -> BaseException:
    """What made a run fail, not the failure to record that (when PostgreSQL went away,
    marking the run failed raises too, with the first error as its context)."""
    if isinstance(error, psycopg.OperationalError) and error.__context__ is not None:
        return error.__context__
    return error
