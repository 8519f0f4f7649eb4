"""Request-scoped dependencies: settings, a PostgreSQL connection from the pool, Redis."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Annotated, Any

import psycopg
import redis
from fastapi import Depends, Request
from psycopg_pool import ConnectionPool

from shared.config import Settings


def get_settings(request: Request) -> Settings:
    settings: Settings = request.app.state.settings
    return settings


def get_db(request: Request) -> Iterator[psycopg.Connection[Any]]:
    pool: ConnectionPool = request.app.state.pg_pool
    with pool.connection() as conn:
        yield conn


def get_redis(request: Request) -> redis.Redis:
    client: redis.Redis = request.app.state.redis
    return client


SettingsDep = Annotated[Settings, Depends(get_settings)]
DbDep = Annotated[psycopg.Connection[Any], Depends(get_db)]
RedisDep = Annotated[redis.Redis, Depends(get_redis)]
