"""Batch layer: PySpark recomputes the authoritative cells from the Kafka log into PostgreSQL.

Public surface: `execute_run` (one queued run, any mode), `run_full` (one run as full),
`run_runner` (the service: queued runs one at a time, the schedule, retries, dead runners),
`runner_active`, `spark_session`; its errors derive from `BatchError` (`batch_layer.errors`)."""

from batch_layer.errors import BatchError, RunNotExecutable
from batch_layer.job import RunSummary, execute_run, run_full
from batch_layer.runner import run_runner, runner_active
from batch_layer.spark import spark_session

__all__ = [
    "BatchError",
    "RunNotExecutable",
    "RunSummary",
    "execute_run",
    "run_full",
    "run_runner",
    "runner_active",
    "spark_session",
]
