"""Batch layer: PySpark recomputes the authoritative cells from the Kafka log into PostgreSQL."""

from batch_layer.job import queue_run, run_full
from batch_layer.spark import spark_session

__all__ = ["queue_run", "run_full", "spark_session"]
