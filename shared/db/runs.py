"""The batch run log and queue (rule 7), shared by the CLI, the operator API and the runner.

Requests are rows with status `queued`; one runner executes them one at a time. An identical
request that is still queued (same mode and range) is coalesced: the caller gets its id."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

import psycopg
from psycopg.rows import dict_row

from shared.config import RunMode

STATUSES = ("queued", "running", "succeeded", "failed", "cancelled")


@dataclass(frozen=True)
class RunRequest:
    mode: RunMode
    start_ms: int | None = None
    end_ms: int | None = None

    def __post_init__(self) -> None:
        if self.mode == "range":
            if self.start_ms is None or self.end_ms is None:
                raise ValueError("a range run needs both start and end")
            if self.start_ms >= self.end_ms:
                raise ValueError("a range run needs start < end")
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


_COLUMNS = ", ".join(RunRecord.__dataclass_fields__)


def queue_run(conn: psycopg.Connection[Any], request: RunRequest) -> tuple[int, bool]:
    """Queue a run; returns (run id, whether it was coalesced with an identical queued one)."""
    with conn.transaction():
        conn.execute("LOCK TABLE batch_runs IN SHARE ROW EXCLUSIVE MODE")
        existing = conn.execute(
            """
            SELECT id FROM batch_runs
            WHERE status = 'queued' AND mode = %s
              AND range_start_ms IS NOT DISTINCT FROM %s AND range_end_ms IS NOT DISTINCT FROM %s
            ORDER BY id LIMIT 1
            """,
            [request.mode, request.start_ms, request.end_ms],
        ).fetchone()
        if existing is not None:
            return int(existing[0]), True
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
