"""The worker's Prometheus metrics, in a registry of its own (served on `speed.metrics_port`)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

CAUSES = ("redis", "postgres", "kafka", "error")
"""What a worker can be degraded by: a store, or an unexpected failure of an apply."""


class SpeedMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.events = Counter(
            "speed_events",
            "Records read and applied (all outcomes), by source topic",
            ["topic"],
            registry=self.registry,
        )
        self.lag = Gauge(
            "speed_lag_records",
            "Records between a partition's end offset and the next offset to apply",
            ["topic", "partition"],
            registry=self.registry,
        )
        self.late = Counter(
            "speed_late_events",
            "Events late for a metric (rule 2), published to <source>.late",
            ["metric"],
            registry=self.registry,
        )
        self.dead_letters = Counter(
            "speed_dead_letters",
            "Malformed records published to <source>.dlq, by reason",
            ["topic", "reason"],
            registry=self.registry,
        )
        self.duplicates = Counter(
            "speed_duplicates_dropped",
            "Events dropped as copies of an id already counted (rule 4)",
            ["topic"],
            registry=self.registry,
        )
        self.skipped = Counter(
            "speed_skipped_events",
            "Events a metric could not use, by metric and reason",
            ["metric", "reason"],
            registry=self.registry,
        )
        self.apply_seconds = Histogram(
            "speed_apply_seconds",
            "Time to decide and apply one partition batch to Redis",
            registry=self.registry,
            buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5),
        )
        self.fence_conflicts = Counter(
            "speed_fence_conflicts",
            "Batches discarded because another worker moved the partition's fence",
            ["topic"],
            registry=self.registry,
        )
        self.rebuilds = Counter(
            "speed_rebuilds",
            "Rebuilds started after the speed view was lost (rule 9)",
            registry=self.registry,
        )
        self.rejoined_records = Counter(
            "speed_rejoined_records",
            "Records read again to join a table's late version anew (rule 11): a partition's "
            "events since W, for the metrics joining the table",
            ["topic"],
            registry=self.registry,
        )
        self.cleaned_keys = Counter(
            "speed_cleaned_keys",
            "Cells and de-dup sets deleted once the batch serves them (rule 8)",
            ["kind"],
            registry=self.registry,
        )

        self.degraded = Gauge(
            "speed_degraded",
            "1 while the worker backs off because a store fails (redis, kafka: batches are "
            "not applied; postgres: W is not refreshed; error: an unexpected failure)",
            ["cause"],
            registry=self.registry,
        )
        self.stalled = Gauge(
            "speed_partition_stalled",
            "1 while a partition's batches keep failing (since the first failure, until one is "
            "applied); /v1/status says why",
            ["topic", "partition"],
            registry=self.registry,
        )
        self.store_failures = Counter(
            "speed_store_failures",
            "Failed attempts to reach a store (or unexpected failures of an apply), by cause",
            ["cause"],
            registry=self.registry,
        )
        for cause in CAUSES:
            self.degraded.labels(cause).set(0)
            self.store_failures.labels(cause)

    def serve(self, port: int) -> None:
        if port:
            start_http_server(port, registry=self.registry)
