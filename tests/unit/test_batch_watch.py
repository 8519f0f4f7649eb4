"""`lambdactl batch run`'s last line (`lambdactl/batch_watch.py`): every label as it is, the
brackets of a rollup's (`views[page]`) included, which console markup used to drop."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from io import StringIO
from typing import Any

import pytest
from rich.console import Console

from lambdactl import batch_watch
from shared.config import Settings
from shared.db.runs import RunRecord, RunRequest

T0 = 1_767_225_600_000  # 2026-01-01T00:00:00Z


def record(**changes: Any) -> RunRecord:
    fields: dict[str, Any] = {
        "id": 7,
        "mode": "full",
        "range_start_ms": None,
        "range_end_ms": None,
        "status": "succeeded",
        "progress": 1.0,
        "requested_at": datetime(2026, 1, 1, tzinfo=UTC),
        "started_at": None,
        "finished_at": None,
        "heartbeat_at": None,
        "rows_in": 10,
        "rows_out": 4,
        "malformed": 0,
        "skipped": {"slow_views[bucket]": 1},
        "snapshot": None,
        "w_before": None,
        "w_after": {"slow_views": T0, "slow_views[bucket]": T0, "slow_views(sessions)": T0},
        "generation": 1,
        "error": None,
    }
    return RunRecord(**{**fields, **changes})


def watched(monkeypatch: pytest.MonkeyPatch, finished: RunRecord) -> tuple[bool, str]:
    """What `watch_run` prints and answers for a run the run log shows `finished`."""

    @contextmanager
    def connect(url: str, autocommit: bool = False) -> Iterator[None]:
        yield None

    monkeypatch.setattr(batch_watch, "connect", connect)
    monkeypatch.setattr(batch_watch, "queue_run", lambda conn, request: (finished.id, False))
    monkeypatch.setattr(batch_watch, "get_run", lambda conn, run_id: finished)
    out = StringIO()
    console = Console(file=out, width=400, color_system=None)
    succeeded = batch_watch.watch_run(Settings(), RunRequest("full"), console, execute_here=False)
    return succeeded, out.getvalue().splitlines()[-1]


def test_a_succeeded_run_prints_every_metric_label(monkeypatch: pytest.MonkeyPatch) -> None:
    succeeded, line = watched(monkeypatch, record())
    assert succeeded
    assert line == (
        "run 7 succeeded (full): 10 records in, 4 cells out, 0 malformed, skipped "
        "{'slow_views[bucket]': 1}; W none -> slow_views=2026-01-01T00:00:00Z, "
        "slow_views(sessions)=2026-01-01T00:00:00Z, slow_views[bucket]=2026-01-01T00:00:00Z"
    )


def test_a_failed_run_prints_its_error_whole(monkeypatch: pytest.MonkeyPatch) -> None:
    error = "[Errno 111] Connection refused: slow_views[bucket]"
    succeeded, line = watched(monkeypatch, record(status="failed", error=error))
    assert not succeeded
    assert line == f"run 7 failed: {error}"


def test_a_run_that_read_reused_ids_says_how_many(monkeypatch: pytest.MonkeyPatch) -> None:
    _, line = watched(monkeypatch, record(reused_ids=2, skipped={}))
    assert line.startswith(
        "run 7 succeeded (full): 10 records in, 4 cells out, 0 malformed, skipped {}, "
        "2 ids reused at another time; W none -> "
    )
