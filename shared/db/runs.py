"""The batch run log and queue (rule 7), shared by the CLI, the operator API and the runner.

Requests are rows with status `queued`; one runner executes them one at a time. An identical
request that is still queued (same mode and range) is coalesced: the caller gets its id. An
operator's request is bounded (`batch.max_queued_runs` queued per mode, ranges of at most
`batch.max_range_days`), and a range is refused while the configuration holds a session metric
(`RangeRefused`); the runner's own runs are not bounded, so that none is lost."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import psycopg
from psycopg.rows import dict_row

from shared.config import BatchConfig, RunMode, Settings
from shared.errors import LambdaError
from shared.events import MAX_EVENT_MS, MIN_EVENT_MS

STATUSES = ("queued", "running", "succeeded", "failed", "cancelled")
DAY_MS = 86_400_000


@dataclass(frozen=True)
class RunRequest:
    mode: RunMode
    start_ms: int | None = None
    end_ms: int | None = None
    limits: BatchConfig | None = field(default=None, compare=False, repr=False)
    """The bounds of an operator's request (the API, `lambdactl batch run`): its range's width
    here, the queue's length in `queue_run`. None: a run the runner queues itself."""
    session_metrics: tuple[str, ...] = field(default=(), compare=False, repr=False)
    """An operator's request: the configuration's session metrics, for which `queue_run`
    refuses a range (`RangeRefused`)."""

    @classmethod
    def operator(
        cls, settings: Settings, mode: RunMode, start_ms: int | None, end_ms: int | None
    ) -> RunRequest:
        """An operator's request (the API, `lambdactl batch run`) under `settings`: bounded by
        `settings.batch`, and refused as a range while `settings` holds a session metric."""
        return cls(
            mode, start_ms, end_ms, limits=settings.batch, session_metrics=session_metrics(settings)
        )

    def __post_init__(self) -> None:
        if self.mode == "range":
            if self.start_ms is None or self.end_ms is None:
                raise ValueError("a range run needs both start and end")
            if self.start_ms >= self.end_ms:
                raise ValueError("a range run needs start < end")
            if self.start_ms < MIN_EVENT_MS or self.end_ms > MAX_EVENT_MS:
                raise ValueError(
                    "a range run needs start and end within event times, "
                    "0001-01-01T00:00:00Z to 9999-12-31T23:59:59.999Z"
                )
            days = None if self.limits is None else self.limits.max_range_days
            if days is not None and self.end_ms - self.start_ms > days * DAY_MS:
                raise ValueError(
                    f"a range run spans at most {days} days (LAMBDA_BATCH__MAX_RANGE_DAYS), "
                    f"not {(self.end_ms - self.start_ms) / DAY_MS:.1f}; split it into narrower "
                    "range runs, or queue a full run to recompute everything"
                )
        elif self.start_ms is not None or self.end_ms is not None:
            raise ValueError(f"start/end apply to range runs only, not to {self.mode!r}")


@dataclass(frozen=True)
class RunRecord:
    id: int
    mode: str
    range_start_ms: int | None
    range_end_ms: int | None
    status: str
    progress: float
    requested_at: datetime
    started_at: datetime | None
    finished_at: datetime | None
    heartbeat_at: datetime | None
    rows_in: int | None
    rows_out: int | None
    malformed: int | None
    skipped: dict[str, int] | None
    snapshot: dict[str, Any] | None
    w_before: dict[str, int] | None
    w_after: dict[str, int] | None
    generation: int | None
    error: str | None
    attempt: int = 1
    retry_of: int | None = None
    not_before: datetime | None = None
    runner: str | None = None
    executed_mode: str | None = None
    """The mode the run executed: an incremental or range run runs as `full` when nothing is
    served yet or the served cells were computed with other metric versions (rule 7)."""
    timings: dict[str, float] | None = None
    """Seconds per phase (snapshot, read, aggregate, publish, total)."""
    reused_ids: int | None = None
    """Ids the run read at more than one event time: each such copy is another event (rule 4)."""

    @property
    def request(self) -> RunRequest:
        return RunRequest(self.mode, self.range_start_ms, self.range_end_ms)  # type: ignore[arg-type]


_COLUMNS = ", ".join(RunRecord.__dataclass_fields__)


class QueueFull(LambdaError):
    """An operator's request found `batch.max_queued_runs` runs of its mode queued."""

    def __init__(self, mode: str, queued: int) -> None:
        super().__init__(
            f"{queued} {mode} run{'' if queued == 1 else 's'} queued already, as many as "
            "batch.max_queued_runs (LAMBDA_BATCH__MAX_QUEUED_RUNS) allows; wait until the "
            "runner starts one, or cancel queued runs: GET /v1/batch/runs?status=queued lists "
            "them, POST /v1/batch/runs/{id}/cancel cancels one"
        )


def session_metrics(settings: Settings) -> tuple[str, ...]:
    """The configured session metrics (rule 13), which no range run can recompute."""
    return tuple(m.name for m in settings.metrics if m.session is not None)


class RangeRefused(LambdaError):
    """A range run while the configuration holds a session metric (rule 7). A range run reads
    only the events of its range, so it would cut each session crossing a bound in two; only
    full and incremental runs recompute a session metric (rule 13)."""

    def __init__(self, metrics: Sequence[str]) -> None:
        self.metrics = tuple(metrics)
        named = ", ".join(f"'{m}'" for m in self.metrics)
        plural = "s" if len(self.metrics) > 1 else ""
        super().__init__(
            f"a range run cannot recompute session metric{plural} {named}: its sessions may "
            "cross the range's bounds (rule 13 in docs/semantics.md); queue a full run "
            '({"mode": "full"}, `lambdactl batch run --mode full`) instead'
        )


def _lock_and_find_queued(
    conn: psycopg.Connection[Any], mode: str, start_ms: int | None, end_ms: int | None
) -> int | None:
    """The oldest queued run with this exact request, under a lock that keeps a concurrent
    caller from queueing its twin until our transaction ends (what makes coalescing exact)."""
    conn.execute("LOCK TABLE batch_runs IN SHARE ROW EXCLUSIVE MODE")
    row = conn.execute(
        """
        SELECT id FROM batch_runs
        WHERE status = 'queued' AND mode = %s
          AND range_start_ms IS NOT DISTINCT FROM %s AND range_end_ms IS NOT DISTINCT FROM %s
        ORDER BY id LIMIT 1
        """,
        [mode, start_ms, end_ms],
    ).fetchone()
    return None if row is None else int(row[0])


def queue_run(conn: psycopg.Connection[Any], request: RunRequest) -> tuple[int, bool]:
    """Queue a run; returns (run id, whether it was coalesced with an identical queued one).

    An operator's range request raises `RangeRefused` when the configuration holds a session
    metric (before coalescing: a twin queued earlier fails when the runner meets it). An
    operator's request (with `limits`) that would not coalesce raises `QueueFull` when
    `max_queued_runs` runs of its mode are queued: counted under the coalescing lock, so
    concurrent requests cannot queue past the bound."""
    if request.mode == "range" and request.session_metrics:
        raise RangeRefused(request.session_metrics)
    with conn.transaction():
        existing = _lock_and_find_queued(conn, request.mode, request.start_ms, request.end_ms)
        if existing is not None:
            return existing, True
        if request.limits is not None:
            row = conn.execute(
                "SELECT count(*) FROM batch_runs WHERE status = 'queued' AND mode = %s",
                [request.mode],
            ).fetchone()
            queued = int(row[0]) if row else 0
            if queued >= request.limits.max_queued_runs:
                raise QueueFull(request.mode, queued)
        row = conn.execute(
            """
            INSERT INTO batch_runs (mode, range_start_ms, range_end_ms, status)
            VALUES (%s, %s, %s, 'queued') RETURNING id
            """,
            [request.mode, request.start_ms, request.end_ms],
        ).fetchone()
        assert row is not None
        return int(row[0]), False


def get_run(conn: psycopg.Connection[Any], run_id: int) -> RunRecord | None:
    with conn.cursor(row_factory=dict_row) as cur:
        row = cur.execute(f"SELECT {_COLUMNS} FROM batch_runs WHERE id = %s", [run_id]).fetchone()
    return None if row is None else RunRecord(**row)


def list_runs(
    conn: psycopg.Connection[Any], limit: int = 50, status: str | None = None
) -> list[RunRecord]:
    with conn.cursor(row_factory=dict_row) as cur:
        rows = cur.execute(
            f"SELECT {_COLUMNS} FROM batch_runs WHERE %s::text IS NULL OR status = %s "
            "ORDER BY id DESC LIMIT %s",
            [status, status, limit],
        ).fetchall()
    return [RunRecord(**row) for row in rows]


def cancel_run(conn: psycopg.Connection[Any], run_id: int) -> bool:
    """Cancel a queued run; False when it is not queued (running, finished or unknown)."""
    row = conn.execute(
        "UPDATE batch_runs SET status = 'cancelled', finished_at = now() "
        "WHERE id = %s AND status = 'queued' RETURNING id",
        [run_id],
    ).fetchone()
    return row is not None


RUNNER_LOCK = 0x6C616D62
"""The advisory lock a runner holds while it may execute runs: at most one run at a time."""


def try_runner_lock(conn: psycopg.Connection[Any]) -> bool:
    """Take the runner lock for `conn`'s session (released by `release_runner_lock` or when
    the session ends, a crash included); False when another session holds it."""
    row = conn.execute("SELECT pg_try_advisory_lock(%s)", [RUNNER_LOCK]).fetchone()
    return bool(row and row[0])


def release_runner_lock(conn: psycopg.Connection[Any]) -> None:
    conn.execute("SELECT pg_advisory_unlock(%s)", [RUNNER_LOCK])


def claim_next_run(conn: psycopg.Connection[Any], runner: str) -> RunRecord | None:
    """Mark the oldest due queued run `running` for `runner` and return it (None: nothing due).

    `FOR UPDATE SKIP LOCKED` keeps two claimers off one row; the runner lock keeps them off
    two rows."""
    with conn.transaction(), conn.cursor(row_factory=dict_row) as cur:
        row = cur.execute(
            f"""
            UPDATE batch_runs SET status = 'running', started_at = now(), heartbeat_at = now(),
                runner = %s, progress = 0
            WHERE id = (
                SELECT id FROM batch_runs
                WHERE status = 'queued' AND (not_before IS NULL OR not_before <= now())
                ORDER BY id LIMIT 1 FOR UPDATE SKIP LOCKED
            )
            RETURNING {_COLUMNS}
            """,
            [runner],
        ).fetchone()
    return None if row is None else RunRecord(**row)


def heartbeat(conn: psycopg.Connection[Any], run_id: int, progress: float | None = None) -> None:
    """Record that the run is alive (and its progress, which only ever grows)."""
    conn.execute(
        "UPDATE batch_runs SET heartbeat_at = now(), "
        "progress = GREATEST(progress, COALESCE(%s, progress)) "
        "WHERE id = %s AND status = 'running'",
        [progress, run_id],
    )


def mark_failed(conn: psycopg.Connection[Any], run_id: int, error: str) -> bool:
    """A running run failed (or its runner died); False when it was not running."""
    row = conn.execute(
        "UPDATE batch_runs SET status = 'failed', finished_at = now(), error = %s "
        "WHERE id = %s AND status = 'running' RETURNING id",
        [error, run_id],
    ).fetchone()
    return row is not None


def fail_orphaned_runs(conn: psycopg.Connection[Any]) -> list[RunRecord]:
    """Runs left `running` by a runner that died. Call only while holding the runner lock:
    a live runner holds it for as long as its run is running, so every other `running` run is
    an orphan (its heartbeat has stopped too)."""
    with conn.transaction(), conn.cursor(row_factory=dict_row) as cur:
        rows = cur.execute(
            f"""
            UPDATE batch_runs SET status = 'failed', finished_at = now(),
                error = 'the runner executing this run died (last heartbeat at '
                        || COALESCE(heartbeat_at::text, 'never') || ')'
            WHERE status = 'running'
            RETURNING {_COLUMNS}
            """
        ).fetchall()
    return [RunRecord(**row) for row in rows]


def queue_retry(conn: psycopg.Connection[Any], failed: RunRecord, delay_s: float) -> int | None:
    """Queue the next attempt of a failed run after `delay_s`; None when an identical request
    is already queued (it will do the work) or the run was retried already (a runner that
    lost its session in an outage may settle a run another runner settled meanwhile)."""
    with conn.transaction():
        if (
            _lock_and_find_queued(conn, failed.mode, failed.range_start_ms, failed.range_end_ms)
            is not None
        ):
            return None
        if conn.execute("SELECT 1 FROM batch_runs WHERE retry_of = %s", [failed.id]).fetchone():
            return None
        row = conn.execute(
            """
            INSERT INTO batch_runs (mode, range_start_ms, range_end_ms, status, attempt,
                                    retry_of, not_before)
            VALUES (%s, %s, %s, 'queued', %s, %s, now() + make_interval(secs => %s))
            RETURNING id
            """,
            [
                failed.mode,
                failed.range_start_ms,
                failed.range_end_ms,
                failed.attempt + 1,
                failed.id,
                delay_s,
            ],
        ).fetchone()
        assert row is not None
        return int(row[0])
