"""The FastAPI app factory: one settings object, pooled connections, routes per resource."""

from __future__ import annotations

import logging
import os
import tempfile
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path
from typing import Any

import uvicorn
from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi
from fastapi.responses import Response
from fastapi.staticfiles import StaticFiles
from prometheus_client import CONTENT_TYPE_LATEST

from serving_layer.auth import check_open_access
from serving_layer.errors import install_error_handlers
from serving_layer.kafka_probe import KafkaProbe
from serving_layer.limits import RequestBudget, RequestLimits
from serving_layer.merged_view import MergedView
from serving_layer.observability import (
    MULTIPROCESS_DIR_ENV,
    MetricsMiddleware,
    ServingMetrics,
    WatermarkAgeCollector,
)
from serving_layer.pg_wire import WireServer
from serving_layer.pools import AsyncDb, Db, async_pool, blocking_pool
from serving_layer.responses import JSONResponse
from serving_layer.routes import dashboard, health, metrics, runs, sql, status
from serving_layer.served_row import HeldServedRow
from serving_layer.sql import SqlStatements
from shared.config import Settings, load_settings
from shared.gc_tuning import freeze_startup_objects
from shared.speed_view import redis_client, redis_client_async

DESCRIPTION = """Merged batch + speed views of windowed metrics (Lambda architecture).

Times are RFC 3339 UTC with `Z` in answers; queries accept RFC 3339 with an offset or integer
epoch milliseconds. When tokens are configured, send `Authorization: Bearer <token>`: a reader
token for queries, an operator token for batch runs (it can also query). Every bad input is a
4xx whose `detail` says what to send."""


def create_app(settings: Settings) -> FastAPI:
    check_open_access(settings)
    observer = ServingMetrics()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        app.state.pg_pool = blocking_pool(settings, settings.postgres.url)
        app.state.db = Db(app.state.pg_pool)
        replica = settings.batch_view_url != settings.postgres.url
        app.state.view_pool = (
            blocking_pool(settings, settings.batch_view_url, min_size=1)
            if replica
            else app.state.pg_pool
        )
        app.state.view_db = Db(app.state.view_pool, "batch_view") if replica else app.state.db
        query_pool = async_pool(settings)
        await query_pool.open()
        timeouts = {"socket_timeout": 1.0, "socket_connect_timeout": 0.5}
        app.state.redis = redis_client(settings.redis, **timeouts)
        async_redis = redis_client_async(settings.redis, **timeouts)
        app.state.view = MergedView(settings, async_redis)
        served = HeldServedRow(settings, query_pool, app.state.view.batch.hints)
        served.start()
        app.state.async_db = AsyncDb(query_pool, served)
        app.state.kafka = KafkaProbe(settings.kafka, settings.serving.kafka_timeout_s)
        wire = None
        if settings.serving.pg_port is not None:
            statements = app.state.sql_statements
            wire = WireServer(settings, statements, app.state.view, app.state.async_db)
            await wire.start()
        app.state.wire = wire
        collector = WatermarkAgeCollector(settings, app.state.pg_pool, app.state.view_pool)
        observer.add_scrape_time(collector)
        try:
            yield
        finally:
            if wire is not None:
                await wire.stop()
            observer.remove_scrape_time(collector)
            app.state.kafka.close()
            app.state.pg_pool.close()
            if replica:
                app.state.view_pool.close()
            await served.stop()
            await query_pool.close()
            app.state.redis.close()
            await async_redis.aclose()

    app = FastAPI(
        title="Lambda Platform",
        description=DESCRIPTION,
        version="0.1.0",
        lifespan=lifespan,
        default_response_class=JSONResponse,
    )
    app.state.settings = settings
    app.state.metrics = observer
    app.state.sql_statements = SqlStatements(settings)
    install_error_handlers(app)
    app.add_middleware(RequestBudget, serving=settings.serving, metrics=observer)
    app.add_middleware(RequestLimits, serving=settings.serving)
    app.add_middleware(MetricsMiddleware, metrics=observer)

    @app.get("/metrics", include_in_schema=False)
    def prometheus() -> Response:
        return Response(observer.exposition(), media_type=CONTENT_TYPE_LATEST)

    app.include_router(dashboard.router)
    app.include_router(health.router)
    app.include_router(metrics.router)
    app.include_router(runs.router)
    app.include_router(sql.router)
    app.include_router(status.router)
    app.mount("/static", StaticFiles(directory=dashboard.STATIC_DIR), name="static")
    _document_key_dimensions(app, settings)
    return app


def run_server(
    settings: Settings,
    host: str | None = None,
    port: int | None = None,
    access_log: bool = False,
    workers: int | None = None,
) -> None:
    """`lambdactl serve`: the app under uvicorn (uvloop + httptools). The access log is off
    unless asked for: it costs more per request than a cached series answer.

    With several workers, uvicorn's supervisor runs that many processes on one listening
    socket (and replaces one that dies); each builds its app from the same settings (the
    YAML file and `LAMBDA_*` environment it inherits), with caches of its own that are valid
    per served row, so every process answers alike. Their Prometheus counters are summed
    through a directory of the multiprocess mode (`PROMETHEUS_MULTIPROC_DIR`, made here
    unless the operator gave one), so `/metrics` tells the whole server whichever process
    answers the scrape."""
    count = workers or settings.serving.workers
    bind: dict[str, Any] = {
        "host": host or settings.serving.host,
        "port": port or settings.serving.port,
        "log_level": "info",
        "access_log": access_log,
    }
    if count == 1:
        _log_to_stderr()
        app = create_app(settings)
        _keep_startup_out_of_gc()
        uvicorn.run(app, **bind)
        return
    os.environ["LAMBDA_SERVING__WORKERS"] = str(count)  # each binds `pg_port` sharing it
    with _multiprocess_metrics_dir():
        uvicorn.run(
            f"{__name__}:{app_from_environment.__name__}", factory=True, workers=count, **bind
        )


def app_from_environment() -> FastAPI:
    """The app of one worker process of `run_server`, from the settings it inherits."""
    _log_to_stderr()
    app = create_app(load_settings())
    _keep_startup_out_of_gc()
    return app


@contextmanager
def _multiprocess_metrics_dir() -> Iterator[None]:
    given = os.environ.get(MULTIPROCESS_DIR_ENV)
    if given:
        for stale in Path(given).glob("*.db"):  # counters of an earlier server would be summed in
            stale.unlink()
        yield
        return
    with tempfile.TemporaryDirectory(prefix="lambda-serve-metrics-") as directory:
        os.environ[MULTIPROCESS_DIR_ENV] = directory
        try:
            yield
        finally:
            del os.environ[MULTIPROCESS_DIR_ENV]


def _log_to_stderr() -> None:
    """The layers' own loggers (pools, caches...) to stderr beside uvicorn's, which
    configures only its own: without a root handler their INFO lines were lost."""
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )


def _keep_startup_out_of_gc() -> None:
    """Measured under load: a full collection of the cyclic garbage collector walked every
    object the imports and the app factory built (FastAPI, pydantic, psycopg...) and paused
    the event loop ~135 ms, which is what a query's p99 showed. Those objects live as long as
    the process: freeze them (never scanned again) and collect the young generation less
    often (a request allocates thousands of short-lived, acyclic objects). Done by the server
    entry point, not the app factory, so tests that build many apps keep the defaults."""
    freeze_startup_objects(10_000)


def _document_key_dimensions(app: FastAPI, settings: Settings) -> None:
    """Key dimensions are query parameters named by the config: list them in the schema."""
    dimensions = sorted({d for m in settings.metrics for d in m.key})

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            schema = get_openapi(
                title=app.title,
                version=app.version,
                description=app.description,
                routes=app.routes,
            )
            operation = schema["paths"].get("/v1/metrics/{metric_name}/series", {}).get("get")
            if operation is not None:
                owners = {d: [m.name for m in settings.metrics if d in m.key] for d in dimensions}
                operation.setdefault("parameters", []).extend(
                    {
                        "name": d,
                        "in": "query",
                        "required": False,
                        "schema": {"type": "string"},
                        "description": f"key dimension; required for {', '.join(owners[d])}",
                    }
                    for d in dimensions
                )
            app.openapi_schema = schema
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]
