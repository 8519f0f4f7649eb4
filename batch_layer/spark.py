"""The Spark session of the batch layer (local[*] by default, any master by config)."""

from __future__ import annotations

import os
import sys

from pyspark.sql import SparkSession

from shared.config import Settings


def spark_session(settings: Settings) -> SparkSession:
    """One session per process; executors run this same Python, so they import `shared`."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    spark = (
        SparkSession.builder.appName("lambda-batch")
        .master(settings.spark.master)
        .config("spark.driver.memory", settings.spark.driver_memory)
        .config("spark.sql.shuffle.partitions", str(settings.spark.shuffle_partitions))
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.execution.arrow.pyspark.enabled", "true")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("WARN")
    from batch_layer.kafka_source import KafkaMetricInputs

    spark.dataSource.register(KafkaMetricInputs)
    return spark
