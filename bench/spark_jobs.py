"""Where a batch run's wall time goes, measured from outside the run: the Spark jobs of its job
group (`lambda-batch-run-<id>`, set by `batch_layer.progress.RunProgress`), read from Spark's
status store after the run, and the run's own phase timings (`RunSummary.timings`).

Every Spark action of a run is one or more jobs (adaptive execution runs each query stage as a
job of its own) that carry the action's call site, e.g. `collect at .../aggregate.py:385`.
`aggregate_source` runs its actions in a fixed order, so the call sites, in order of first
appearance, name the stages: the per-partition summary (the first action: it reads Kafka,
decodes and fills the cache), the rebuild index, the ids' collect for de-dup (sources with an
id field) and the cells. The time between them (driver-side work: sorting the ids, planning
the next action) is given to the stage that follows the previous action, e.g. the driver's
sort of the ids counts as de-dup."""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Job:
    """One Spark job: its call site, its submission and completion (epoch seconds) and the
    summed run time of its tasks (seconds; up to the cores times its span)."""

    job_id: int
    call_site: str
    submitted: float
    completed: float
    task_s: float = 0.0


@dataclass(frozen=True)
class Action:
    """Consecutive jobs of one call site (one Spark action)."""

    call_site: str
    jobs: tuple[Job, ...]

    @property
    def start(self) -> float:
        return min(j.submitted for j in self.jobs)

    @property
    def end(self) -> float:
        return max(j.completed for j in self.jobs)

    @property
    def task_s(self) -> float:
        return sum(j.task_s for j in self.jobs)

    def short(self) -> str:
        """`collect at aggregate.py:385` (the call site without the directories)."""
        what, _, where = self.call_site.partition(" at ")
        return f"{what} at {where.rsplit('/', 1)[-1]}" if where else what


def jobs_of_group(spark: Any, group: str, since: float, wait_s: float = 10.0) -> list[Job]:
    """The finished jobs of job group `group` submitted at or after `since` (epoch seconds;
    two worlds' runs share a group name: each database numbers its runs from 1), by
    submission. Spark's status store learns of a job's end from its listener bus, shortly
    after the action returned: read it until every such job has ended (at most `wait_s`)."""
    store = spark.sparkContext._jsc.sc().statusStore()
    deadline = time.monotonic() + wait_s
    while True:
        jobs, running = [], 0
        listed = store.jobsList(None)
        for i in range(listed.size()):
            data = listed.apply(i)
            job_group = data.jobGroup()
            if not job_group.isDefined() or job_group.get() != group:
                continue
            submitted = data.submissionTime().get().getTime() / 1000
            if submitted < since:
                continue
            if not data.completionTime().isDefined():
                running += 1
                continue
            jobs.append(
                Job(
                    int(data.jobId()),
                    str(data.name()),
                    submitted,
                    data.completionTime().get().getTime() / 1000,
                    _task_seconds(store, data.stageIds()),
                )
            )
        if not running or time.monotonic() > deadline:
            return sorted(jobs, key=lambda j: (j.submitted, j.job_id))
        time.sleep(0.1)


def _task_seconds(store: Any, stage_ids: Any) -> float:
    """The summed run time of the tasks of the stages that ran (a stage whose shuffle output
    an earlier job made is listed, skipped, with no attempt)."""
    total = 0
    for i in range(stage_ids.size()):
        try:
            total += store.lastStageAttempt(stage_ids.apply(i)).executorRunTime()
        except Exception:  # no attempt: skipped
            continue
    return total / 1000


def actions_of(jobs: Sequence[Job]) -> list[Action]:
    """The jobs grouped by call site, in order of each call site's first job."""
    grouped: dict[str, list[Job]] = {}
    for job in jobs:
        grouped.setdefault(job.call_site, []).append(job)
    return sorted(
        (Action(site, tuple(group)) for site, group in grouped.items()), key=lambda a: a.start
    )


def run_stages(
    jobs: Sequence[Job], started: float, wall_s: float, timings: Mapping[str, float]
) -> dict[str, float]:
    """A full (or any one-source) run's wall time by stage, seconds; the stages add up to
    `wall_s`. `started` is when `execute_run` was called (epoch seconds), `timings` the run's
    `RunSummary.timings`.

    - `snapshot`: the offset snapshot (the run's own timing);
    - `plan`: from the snapshot to the first Spark job: planning the read (the Python data
      source's schema and slices), the run's DataFrames and the first action;
    - `read_decode`: the first action's jobs: every record read from Kafka, decoded by the
      Python reader, persisted in Spark's cache (and summed per partition);
    - `rebuild_index`: to the end of the second action (stream times to W to `rebuild_from`);
    - `dedup`: to the first job of the cells: the ids' collect, the driver's sort, handing the
      ids to the publication's loader, planning the cells with the anti join;
    - `cells`: every window's cells in one plan, collected to the driver as Arrow, until the
      read/aggregate phase ends (the run's own timing);
    - `publish`: the run's own timing: waiting for the id load and the id key, loading,
      indexing and attaching the cells' generation, flipping the served row, commit, dropping
      old generations;
    - `other`: the rest of the wall time (runner lock, run-log updates, the heartbeat thread).

    The run's phases are anchored at `started`: the few milliseconds of `other` before them
    shift the Spark-measured boundaries by as much. Returns only `snapshot`, `read_aggregate`
    (the whole Spark part), `publish` and `other` when the actions are not the expected four
    (or three, without de-dup)."""
    snapshot = timings.get("snapshot_s", 0.0)
    read_aggregate = timings.get("read_aggregate_s", 0.0)
    publish = timings.get("publish_s", 0.0)
    other = wall_s - timings.get("total_s", snapshot + read_aggregate + publish)
    actions = actions_of(jobs)
    if len(actions) not in (3, 4):
        return {
            "snapshot": snapshot,
            "read_aggregate": read_aggregate,
            "publish": publish,
            "other": other,
        }
    read, rebuild, *_, cells = actions
    spark_began = started + snapshot
    spark_ended = spark_began + read_aggregate
    return {
        "snapshot": snapshot,
        "plan": read.start - spark_began,
        "read_decode": read.end - read.start,
        "rebuild_index": rebuild.end - read.end,
        "dedup": cells.start - rebuild.end,
        "cells": spark_ended - cells.start,
        "publish": publish,
        "other": other,
    }


def describe(jobs: Sequence[Job], since: float) -> str:
    """Each action's call site, jobs, span (seconds after `since`) and summed task time, for
    the log."""
    return "; ".join(
        f"{a.short()} x{len(a.jobs)} {a.start - since:.1f}-{a.end - since:.1f} s "
        f"(tasks {a.task_s:.1f} s)"
        for a in actions_of(jobs)
    )


def fields(stages: Mapping[str, float], prefix: str = "stage") -> str:
    """`stage_<name>_s=<s> ...` for the BENCH line."""
    return " ".join(f"{prefix}_{name}_s={value:.2f}" for name, value in stages.items())
