"""Crashes at the named fault points and `kill -9` of a runner mid-run: nothing served changes,
the next runner marks the run failed and its retry succeeds (rules 6 and 7)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from typing import Any

import psutil
import pytest

from batch_layer import execute_run, run_runner
from lambdactl.generator import GeneratorSpec
from shared.config import BatchConfig, Settings
from shared.db.connect import connect
from shared.db.runs import RunRequest, list_runs
from shared.kafka import create_topics
from tests.batch.helpers import (
    HOUR,
    MINUTE,
    oracle_mismatches,
    produce_spec,
    queue,
    run_record,
    served_view,
)
from tests.conftest import Platform

pytestmark = [pytest.mark.services, pytest.mark.long(240), pytest.mark.timeout(900)]


def _state(settings: Settings) -> tuple[Any, ...]:
    served, cells = served_view(settings)
    with connect(settings.postgres.url, autocommit=True) as conn:
        ids = conn.execute("SELECT count(*) FROM dedup_ids").fetchone()
    return served, cells, ids


def _runner(platform: Platform, **env: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", "lambdactl", "batch", "runner", "--once", "--no-schedule"],
        env={**platform.env, "LAMBDA_BATCH__HEARTBEAT_S": "0.5", **env},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


def _niceness(runner: int) -> dict[str, set[int]]:
    """The niceness of the runner and of the processes it started, by process name, once its
    Spark driver JVM runs."""
    deadline = time.monotonic() + 60
    while True:
        seen: dict[str, set[int]] = {}
        for process in [psutil.Process(runner), *psutil.Process(runner).children(recursive=True)]:
            with contextlib.suppress(psutil.NoSuchProcess):
                seen.setdefault(process.name(), set()).add(process.nice())
        if "java" in seen or time.monotonic() > deadline:
            return seen
        time.sleep(0.1)


def _recover(settings: Settings, spark: Any, run_id: int) -> None:
    """The next runner fails the dead run and executes its retry."""
    assert run_record(settings, run_id).status == "running"
    assert run_runner(settings, once=True, spark=spark, schedule=False) == 1
    dead = run_record(settings, run_id)
    assert dead.status == "failed" and dead.error and "died" in dead.error
    with connect(settings.postgres.url, autocommit=True) as conn:
        retry = next(r for r in list_runs(conn) if r.retry_of == run_id)
    assert retry.status == "succeeded", retry.error


def test_crashes_change_nothing_and_retries_succeed(platform: Platform, spark: Any) -> None:
    settings = platform.settings.model_copy(update={"batch": BatchConfig(retry_backoff_s=0)})
    create_topics(settings)
    now = int(time.time() * 1000) // MINUTE * MINUTE
    produce_spec(settings, GeneratorSpec(now - 4 * HOUR, now - 2 * HOUR, 1500, seed=51))
    execute_run(settings, spark, queue(settings, RunRequest("full")))

    for step, (mode, fault) in enumerate(
        [("full", "mid_load"), ("incremental", "before_generation_flip"), ("incremental", None)]
    ):
        produce_spec(
            settings,
            GeneratorSpec(now - (2 - step) * HOUR, now - (1 - step) * HOUR, 1500, seed=52 + step),
        )
        before = _state(settings)
        run_id = queue(settings, RunRequest(mode))  # type: ignore[arg-type]
        if fault is not None:
            job = _runner(platform, LAMBDA_FAULT=fault)
            assert job.wait(240) == -signal.SIGKILL, f"{fault}: the runner should crash there"
        else:
            job = _runner(platform)
            deadline = time.monotonic() + 240
            while True:
                record = run_record(settings, run_id)
                assert record.status in ("queued", "running"), record
                if record.progress > 0 or (
                    record.heartbeat_at
                    and record.started_at
                    and record.heartbeat_at > record.started_at
                ):
                    break
                assert time.monotonic() < deadline, "the run never started"
                time.sleep(0.1)
            niceness = _niceness(job.pid)
            assert niceness.get("java") == {BatchConfig().nice}, niceness
            assert set.union(*niceness.values()) == {BatchConfig().nice}, niceness
            os.kill(job.pid, signal.SIGKILL)
            job.wait(30)
        assert _state(settings) == before, f"{fault or 'kill -9'} changed what is served"
        _recover(settings, spark, run_id)
        assert _state(settings) != before
        assert oracle_mismatches(settings, platform.config) == []
