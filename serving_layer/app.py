"""The FastAPI app factory: one settings object, pooled connections, routes per resource."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import redis
import redis.asyncio as aioredis
from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi
from fastapi.responses import Response
from fastapi.staticfiles import StaticFiles
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from psycopg_pool import AsyncConnectionPool, ConnectionPool

from serving_layer.errors import install_error_handlers
from serving_layer.kafka_probe import KafkaProbe
from serving_layer.merged_view import MergedView
from serving_layer.observability import MetricsMiddleware, ServingMetrics, WatermarkAgeCollector
from serving_layer.pools import AsyncDb, Db
from serving_layer.responses import JSONResponse
from serving_layer.routes import dashboard, health, metrics, runs, status
from shared.config import Settings

DESCRIPTION = """Merged batch + speed views of windowed metrics (Lambda architecture).

Times are RFC 3339 UTC with `Z` in answers; queries accept RFC 3339 with an offset or integer
epoch milliseconds. When tokens are configured, send `Authorization: Bearer <token>`: a reader
token for queries, an operator token for batch runs (it can also query). Every bad input is a
4xx whose `detail` says what to send."""


def create_app(settings: Settings) -> FastAPI:
    observer = ServingMetrics()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        app.state.pg_pool = ConnectionPool(
            settings.postgres.url,
            min_size=1,
            max_size=8,
            kwargs={"autocommit": True, "connect_timeout": 3},
            open=True,
            timeout=5.0,
        )
        app.state.db = Db(app.state.pg_pool)
        async_pool = AsyncConnectionPool(
            settings.postgres.url,
            min_size=1,
            max_size=8,
            kwargs={"autocommit": True, "connect_timeout": 3},
            open=False,
            timeout=5.0,
        )
        await async_pool.open()
        app.state.async_db = AsyncDb(async_pool)
        app.state.redis = redis.Redis.from_url(
            settings.redis.url, socket_timeout=1.0, socket_connect_timeout=0.5
        )
        async_redis = aioredis.Redis.from_url(
            settings.redis.url, socket_timeout=1.0, socket_connect_timeout=0.5
        )
        app.state.view = MergedView(settings, async_redis)
        app.state.kafka = KafkaProbe(
            settings.kafka.bootstrap_servers, settings.serving.kafka_timeout_s
        )
        collector = WatermarkAgeCollector(settings, app.state.pg_pool)
        observer.registry.register(collector)
        try:
            yield
        finally:
            observer.registry.unregister(collector)
            app.state.kafka.close()
            app.state.pg_pool.close()
            await async_pool.close()
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
    install_error_handlers(app)
    app.add_middleware(MetricsMiddleware, metrics=observer)

    @app.get("/metrics", include_in_schema=False)
    def prometheus() -> Response:
        return Response(generate_latest(observer.registry), media_type=CONTENT_TYPE_LATEST)

    app.include_router(dashboard.router)
    app.include_router(health.router)
    app.include_router(metrics.router)
    app.include_router(runs.router)
    app.include_router(status.router)
    app.mount("/static", StaticFiles(directory=dashboard.STATIC_DIR), name="static")
    _document_key_dimensions(app, settings)
    return app


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
