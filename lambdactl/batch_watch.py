"""`lambdactl batch run`: queue a run, then follow it in the run log with a progress bar.

With no runner active, a one-shot runner executes the queue in this process, so the command
also works on a laptop with nothing else running."""

from __future__ import annotations

import threading
import time

from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from rich.text import Text

from shared.config import Settings
from shared.db.connect import connect
from shared.db.runs import RunRecord, RunRequest, get_run, queue_run

FINISHED = ("succeeded", "failed", "cancelled")


def _local_runner(settings: Settings, errors: list[BaseException]) -> threading.Thread:
    from batch_layer import run_runner

    def execute() -> None:
        try:
            run_runner(settings, once=True, schedule=False)
        except BaseException as exc:  # reported by the watcher, which owns the terminal
            errors.append(exc)

    thread = threading.Thread(target=execute, name="local-batch-runner", daemon=True)
    thread.start()
    return thread


def _marks(watermarks: dict[str, int] | None) -> str:
    from serving_layer.timefmt import format_time

    return ", ".join(f"{m}={format_time(w)}" for m, w in sorted((watermarks or {}).items()))


def watch_run(
    settings: Settings, request: RunRequest, console: Console, *, execute_here: bool = True
) -> bool:
    """Queue `request` and show its progress; True when the run succeeded. With
    `execute_here`, a one-shot runner in this process executes the queue when no runner is
    active."""
    from batch_layer import runner_active

    with connect(settings.postgres.url, autocommit=True) as conn:
        run_id, coalesced = queue_run(conn, request)
    console.print(f"coalesced with queued run {run_id}" if coalesced else f"queued run {run_id}")
    errors: list[BaseException] = []
    if execute_here and not runner_active(settings):
        console.print("no runner is active: executing the queue here")
        _local_runner(settings, errors)
    record: RunRecord | None = None
    columns = (
        TextColumn("run {task.fields[run]} {task.description}"),
        BarColumn(),
        TextColumn("{task.percentage:>3.0f}%"),
        TimeElapsedColumn(),
    )
    with (
        Progress(*columns, console=console) as progress,
        connect(settings.postgres.url, autocommit=True) as conn,
    ):
        task = progress.add_task("queued", total=1.0, run=run_id)
        while True:
            record = get_run(conn, run_id)
            if record is None:
                raise RuntimeError(f"run {run_id} vanished from the run log")
            progress.update(task, completed=record.progress, description=record.status)
            if record.status in FINISHED or errors:
                break
            time.sleep(1.0)
    if errors:
        raise errors[0]
    assert record is not None
    console.print(outcome(record))
    return record.status == "succeeded"


def outcome(record: RunRecord) -> Text:
    """The line a finished run ends with, as text rather than console markup: its labels hold
    brackets (a rollup's `views[page]`, an error's `[Errno 111]`), which markup would read as
    tags and drop."""
    if record.status != "succeeded":
        return Text.assemble((f"run {record.id} {record.status}", "red"), f": {record.error or ''}")
    return Text(
        f"run {record.id} succeeded ({record.executed_mode or record.mode}): "
        f"{record.rows_in} records in, {record.rows_out} cells out, {record.malformed} "
        f"malformed, skipped {record.skipped or {}}"
        f"{f', {record.reused_ids} ids reused at another time' if record.reused_ids else ''}; "
        f"W {_marks(record.w_before) or 'none'} -> {_marks(record.w_after) or 'none'}"
    )
