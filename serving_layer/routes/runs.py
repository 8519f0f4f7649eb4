"""`/v1/batch/runs`: queue a batch run, list and inspect runs (with progress), cancel one."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated, Literal

from fastapi import APIRouter, Body, Path, Query

from serving_layer.auth import OperatorDep
from serving_layer.deps import DbDep, SettingsDep
from serving_layer.errors import bad_request, conflict, not_found, too_many_requests
from serving_layer.params import DeclaredParamsDep, time_of
from serving_layer.schemas import Problem, Run, RunCreate, RunList, RunQueued, problems
from serving_layer.timefmt import format_time
from shared.db.runs import (
    QueueFull,
    RangeRefused,
    RunRecord,
    RunRequest,
    cancel_run,
    get_run,
    list_runs,
    queue_run,
)

router = APIRouter(
    prefix="/v1/batch/runs",
    tags=["batch runs"],
    dependencies=[OperatorDep, DeclaredParamsDep],
    responses=problems(400, 401, 403, 503),
)

_MAX_RUN_ID = 2**63 - 1
RunId = Annotated[int, Path(ge=1, le=_MAX_RUN_ID, description="a run id")]

QUEUE_FULL_RETRY_AFTER_S = 60
"""`Retry-After` of a refused request: a slot frees when the runner starts the oldest queued
run, which waits for the running one, and runs take minutes."""


def _iso(moment: datetime | None) -> str | None:
    if moment is None:
        return None
    return moment.astimezone(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _ws(values: dict[str, int] | None) -> dict[str, str] | None:
    if values is None:
        return None
    return {m: format_time(int(w)) for m, w in values.items() if w is not None}


def run_out(record: RunRecord) -> Run:
    duration = None
    if record.started_at is not None:
        until = record.finished_at or datetime.now(UTC)
        duration = round((until - record.started_at).total_seconds(), 3)
    return Run(
        run_id=record.id,
        mode=record.mode,
        start=None if record.range_start_ms is None else format_time(record.range_start_ms),
        end=None if record.range_end_ms is None else format_time(record.range_end_ms),
        status=record.status,
        progress=float(record.progress),
        requested_at=_iso(record.requested_at) or "",
        started_at=_iso(record.started_at),
        finished_at=_iso(record.finished_at),
        heartbeat_at=_iso(record.heartbeat_at),
        duration_s=duration,
        rows_in=record.rows_in,
        rows_out=record.rows_out,
        malformed=record.malformed,
        skipped=record.skipped,
        w_before=_ws(record.w_before),
        w_after=_ws(record.w_after),
        generation=record.generation,
        error=record.error,
        executed_mode=getattr(record, "executed_mode", None),
        attempt=getattr(record, "attempt", 1),
        timings=getattr(record, "timings", None),
        reused_ids=getattr(record, "reused_ids", None),
    )


@router.post(
    "",
    status_code=202,
    response_model=RunQueued,
    responses={400: {"model": Problem}, **problems(409, 429)},
    description="Queue a run. `range` needs `start` and `end`, at most `batch.max_range_days` "
    "apart; the others take neither. A `range` is refused (409, naming them) while a session "
    "metric is configured: queue a full run. An identical request that is still queued (same "
    "mode, `start` and `end`) is coalesced: you get its id. With `batch.max_queued_runs` runs "
    "of the mode queued, any other request is refused (429, with `Retry-After`).",
)
def create_run(db: DbDep, settings: SettingsDep, body: Annotated[RunCreate, Body()]) -> RunQueued:
    start_ms = None if body.start is None else time_of("start", str(body.start))
    end_ms = None if body.end is None else time_of("end", str(body.end))
    try:
        request = RunRequest.operator(settings, body.mode, start_ms, end_ms)
    except ValueError as exc:
        raise bad_request(
            f"{exc}; send {{'mode': 'range', 'start': ..., 'end': ...}} or a mode without a range"
        ) from None
    with db.connection() as conn:
        try:
            run_id, coalesced = queue_run(conn, request)
        except RangeRefused as exc:
            raise conflict(str(exc)) from None
        except QueueFull as exc:
            raise too_many_requests(str(exc), QUEUE_FULL_RETRY_AFTER_S) from None
        record = get_run(conn, run_id)
    assert record is not None
    return RunQueued(**run_out(record).model_dump(), coalesced=coalesced)


@router.get("", response_model=RunList)
def runs(
    db: DbDep,
    status: Annotated[
        Literal["queued", "running", "succeeded", "failed", "cancelled"] | None,
        Query(description="only runs with this status"),
    ] = None,
    limit: Annotated[int, Query(ge=1, le=500)] = 50,
) -> RunList:
    with db.connection() as conn:
        records = list_runs(conn, limit=limit, status=status)
    return RunList(runs=[run_out(r) for r in records])


@router.get("/{run_id}", response_model=Run, responses={404: {"model": Problem}})
def run(db: DbDep, run_id: RunId) -> Run:
    with db.connection() as conn:
        record = get_run(conn, run_id)
    if record is None:
        raise not_found(f"no batch run {run_id}; list them with GET /v1/batch/runs")
    return run_out(record)


@router.post(
    "/{run_id}/cancel",
    response_model=Run,
    responses={404: {"model": Problem}, 409: {"model": Problem}},
    description="Cancel a queued run; 409 when it is already running or finished.",
)
def cancel(db: DbDep, run_id: RunId) -> Run:
    with db.connection() as conn:
        cancelled = cancel_run(conn, run_id)
        record = get_run(conn, run_id)
    if record is None:
        raise not_found(f"no batch run {run_id}; list them with GET /v1/batch/runs")
    if not cancelled:
        raise conflict(f"run {run_id} is {record.status}; only a queued run can be cancelled")
    return run_out(record)
