"""The FastAPI app factory: one settings object, pooled connections, routes per resource."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import redis
from fastapi import FastAPI
from psycopg_pool import ConnectionPool

from serving_layer.routes import health, metrics
from shared.config import Settings


def create_app(settings: Settings) -> FastAPI:
    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        app.state.settings = settings
        app.state.pg_pool = ConnectionPool(
            settings.postgres.url, min_size=1, max_size=8, kwargs={"autocommit": True}, open=True
        )
        app.state.redis = redis.Redis.from_url(
            settings.redis.url, socket_timeout=1.0, socket_connect_timeout=1.0
        )
        try:
            yield
        finally:
            app.state.pg_pool.close()
            app.state.redis.close()

    app = FastAPI(
        title="Lambda Platform",
        description="Merged batch + speed views of windowed metrics.",
        version="0.1.0",
        lifespan=lifespan,
    )
    app.include_router(health.router)
    app.include_router(metrics.router)
    return app
