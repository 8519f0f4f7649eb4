"""Batch layer: PySpark recomputes the authoritative cells from the Kafka log into PostgreSQL."""

from batch_layer.job import run_full
from batch_layer.spark import spark_session

__all__ = ["run_full", "spark_session"]
