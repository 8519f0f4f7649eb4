"""Prometheus metrics of the serving layer, in a registry per app (tests build many apps):
request latency per route, errors, merge sizes, and the batch watermark's age per metric,
read from the served row at scrape time. When several API processes share a port, their
counters and histograms are summed by prometheus-client's multiprocess mode."""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Iterator
from typing import Any, Protocol

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.multiprocess import MultiProcessCollector
from prometheus_client.registry import Collector
from psycopg_pool import ConnectionPool
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from shared.config import Settings
from shared.db.served import read_served, replay_lag_s
from shared.metric_plan import read_plans

log = logging.getLogger(__name__)

MULTIPROCESS_DIR_ENV = "PROMETHEUS_MULTIPROC_DIR"
"""Set before the worker processes start, it makes every counter of theirs a shared file."""

_LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10)
_CELL_BUCKETS = (0, 1, 10, 60, 100, 500, 1_000, 1_500, 5_000, 10_000, 50_000, 100_000)


class MergedAnswer(Protocol):
    """What `observe_merge` reads of a merged view's answer."""

    batch_cells: int
    speed_states: int
    speed_status: str
    batch_status: str


class ServingMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.latency = Histogram(
            "lambda_serving_request_seconds",
            "HTTP request latency by route template",
            ["method", "route"],
            buckets=_LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.requests = Counter(
            "lambda_serving_requests_total",
            "HTTP requests by route template and status code",
            ["method", "route", "status"],
            registry=self.registry,
        )
        self.errors = Counter(
            "lambda_serving_errors_total",
            "HTTP responses with a 4xx/5xx status, by route and class",
            ["route", "kind"],
            registry=self.registry,
        )
        self.merge_cells = Histogram(
            "lambda_serving_merge_cells",
            "Cells merged per query, by layer (batch rows, speed sub-cell states)",
            ["endpoint", "layer"],
            buckets=_CELL_BUCKETS,
            registry=self.registry,
        )
        self.speed_unavailable = Counter(
            "lambda_serving_speed_unavailable_total",
            "Queries answered batch-only because Redis was unreachable",
            registry=self.registry,
        )
        self.batch_unavailable = Counter(
            "lambda_serving_batch_unavailable_total",
            "Queries answered from the speed view alone, from the W last read on, because "
            "PostgreSQL was unreachable (rule 12)",
            registry=self.registry,
        )
        self.shed = Counter(
            "lambda_serving_shed_requests_total",
            "Requests answered 503 at once: serving.max_inflight_requests were in flight",
            registry=self.registry,
        )
        self.timed_out = Counter(
            "lambda_serving_timed_out_requests_total",
            "Requests answered 503 at serving.request_timeout_s, by route template",
            ["route"],
            registry=self.registry,
        )

        self._scrape_time: list[Collector] = []

    def add_scrape_time(self, collector: Collector) -> None:
        """A collector that reads its figures when scraped (not counted per process)."""
        self._scrape_time.append(collector)
        self.registry.register(collector)

    def remove_scrape_time(self, collector: Collector) -> None:
        self._scrape_time.remove(collector)
        self.registry.unregister(collector)

    def exposition(self) -> bytes:
        """The `/metrics` text: this app's registry, or, under several worker processes,
        every process's counters summed plus this process's scrape-time collectors."""
        directory = os.environ.get(MULTIPROCESS_DIR_ENV)
        if not directory:
            return generate_latest(self.registry)
        registry = CollectorRegistry()
        MultiProcessCollector(registry, path=directory)
        for collector in self._scrape_time:
            registry.register(collector)
        return generate_latest(registry)

    def observe_merge(self, endpoint: str, answer: MergedAnswer) -> None:
        """A merged answer: the cells it merged per layer, and whether a store was missing."""
        self.merge_cells.labels(endpoint, "batch").observe(answer.batch_cells)
        self.merge_cells.labels(endpoint, "speed").observe(answer.speed_states)
        if answer.speed_status == "unavailable":
            self.speed_unavailable.inc()
        if answer.batch_status == "unavailable":
            self.batch_unavailable.inc()


class WatermarkAgeCollector(Collector):
    """`batch_watermark_age_seconds{metric}` = now - W, `batch_last_run_failed` and
    `batch_last_run_reused_ids`, read when Prometheus scrapes."""

    def __init__(
        self, settings: Settings, runs_pool: ConnectionPool, view_pool: ConnectionPool
    ) -> None:
        self._settings = settings
        self._runs_pool = runs_pool
        self._view_pool = view_pool

    def collect(self) -> Iterator[GaugeMetricFamily]:
        gauge = GaugeMetricFamily(
            "batch_watermark_age_seconds",
            "Seconds between now and the served batch watermark W, per metric",
            labels=["metric"],
        )
        failed = GaugeMetricFamily(
            "batch_last_run_failed",
            "1 when the newest finished batch run failed (its error is in /v1/status), else 0",
        )
        reused = GaugeMetricFamily(
            "batch_last_run_reused_ids",
            "Ids the newest succeeded batch run read at more than one event time: each use "
            "counts as its own event (rule 4 in docs/semantics.md)",
        )
        lag = GaugeMetricFamily(
            "batch_view_replay_lag_seconds",
            "How far the read replica the batch view is read from (serving.batch_view_url) "
            "replays behind the primary: 0 when it has replayed all it received",
        )
        try:
            with self._view_pool.connection(timeout=2.0) as conn:
                served = read_served(conn)
                replay_lag = replay_lag_s(conn)
            if replay_lag is not None:
                lag.add_metric([], replay_lag)
                yield lag
            with self._runs_pool.connection(timeout=2.0) as conn:
                last = conn.execute(
                    "SELECT status FROM batch_runs WHERE status IN ('succeeded', 'failed') "
                    "ORDER BY id DESC LIMIT 1"
                ).fetchone()
                succeeded = conn.execute(
                    "SELECT reused_ids FROM batch_runs WHERE status = 'succeeded' "
                    "ORDER BY id DESC LIMIT 1"
                ).fetchone()
            failed.add_metric([], 1.0 if last is not None and last[0] == "failed" else 0.0)
            yield failed
            if succeeded is not None and succeeded[0] is not None:
                reused.add_metric([], float(succeeded[0]))
                yield reused
        except Exception as exc:  # a scrape must not fail because PostgreSQL is down
            log.warning("watermark age not collected: %s", exc)
            served = None
        if served is not None:
            now_ms = time.time() * 1000
            for metric in read_plans(self._settings.plans.values()):
                w = served.watermark(metric.name, metric.version)
                if w is not None:
                    gauge.add_metric([metric.name], (now_ms - w) / 1000)
        yield gauge

    def describe(self) -> list[Any]:
        return []


def route_template(scope: Scope) -> str:
    """The route template a request matched (`unmatched` before routing, or when none did)."""
    return getattr(scope.get("route"), "path", None) or "unmatched"


class MetricsMiddleware:
    """Pure ASGI middleware (no per-request task overhead) timing each route template."""

    def __init__(self, app: ASGIApp, metrics: ServingMetrics) -> None:
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        status = 500

        async def send_wrapper(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_wrapper)
        finally:
            template = route_template(scope)
            method = scope.get("method", "GET")
            self.metrics.latency.labels(method, template).observe(time.perf_counter() - started)
            self.metrics.requests.labels(method, template, str(status)).inc()
            if status >= 400:
                self.metrics.errors.labels(template, "5xx" if status >= 500 else "4xx").inc()
