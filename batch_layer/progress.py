"""A run's heartbeat and progress: a thread polls Spark's status tracker for the run's job
group and writes `heartbeat_at` and `progress` into the run log every few seconds, so the
operator sees the run move and a dead runner's run is recognisable."""

from __future__ import annotations

import logging
import threading
from types import TracebackType
from typing import Any

from shared.db.connect import connect
from shared.db.runs import heartbeat

log = logging.getLogger(__name__)

SPARK_SHARE = 0.85
"""The part of a run's progress given to its Spark jobs; publication is the rest."""


class RunProgress:
    """Context manager: heartbeats `run_id` while a run executes; `phase_done(x)` raises the
    floor of the progress (e.g. 1.0 when the last Spark job is done)."""

    def __init__(self, postgres_url: str, spark: Any, run_id: int, interval_s: float) -> None:
        self.postgres_url = postgres_url
        self.spark = spark
        self.run_id = run_id
        self.group = f"lambda-batch-run-{run_id}"
        self.interval_s = interval_s
        self.progress = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name=self.group, daemon=True)

    def __enter__(self) -> RunProgress:
        self.spark.sparkContext.setJobGroup(self.group, f"batch run {self.run_id}")
        self._thread.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._stop.set()
        self._thread.join(timeout=10)
        self.spark.sparkContext.setLocalProperty("spark.jobGroup.id", None)

    def floor(self, value: float) -> None:
        self.progress = max(self.progress, value)

    def spark_fraction(self) -> float:
        """Completed over known tasks of the run's Spark jobs so far."""
        tracker = self.spark.sparkContext.statusTracker()
        done = total = 0
        for job_id in tracker.getJobIdsForGroup(self.group):
            job = tracker.getJobInfo(job_id)
            if job is None:
                continue
            for stage_id in job.stageIds:
                stage = tracker.getStageInfo(stage_id)
                if stage is not None:
                    done += stage.numCompletedTasks
                    total += stage.numTasks
        return done / total if total else 0.0

    def _loop(self) -> None:
        try:
            with connect(self.postgres_url, autocommit=True) as conn:
                while not self._stop.wait(self.interval_s):
                    try:
                        self.floor(min(self.spark_fraction(), 0.99) * SPARK_SHARE)
                    except Exception:  # the tracker may race with the session's end
                        log.debug("status tracker poll failed", exc_info=True)
                    heartbeat(conn, self.run_id, round(self.progress, 3))
        except Exception:
            log.warning("heartbeat thread of run %s stopped", self.run_id, exc_info=True)
