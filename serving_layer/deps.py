"""Request-scoped dependencies: settings, a PostgreSQL connection from the pool, Redis, the
merged view and the metrics registry — all built once by the app factory."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Annotated, Any

import psycopg
import redis
from fastapi import Depends, Request
from psycopg_pool import ConnectionPool, PoolTimeout

from serving_layer.errors import unavailable
from serving_layer.merged_view import MergedView
from serving_layer.observability import ServingMetrics
from shared.config import Settings


def get_settings(request: Request) -> Settings:
    settings: Settings = request.app.state.settings
    return settings


class Db:
    """The PostgreSQL pool as routes use it: a connection is taken and given back inside the
    route's own worker thread. (A `yield` dependency would give it back from another
    threadpool task, which deadlocks once every worker thread waits for a connection.)"""

    def __init__(self, pool: ConnectionPool) -> None:
        self._pool = pool

    @contextmanager
    def connection(self) -> Iterator[psycopg.Connection[Any]]:
        try:
            cm = self._pool.connection(timeout=5.0)
            conn = cm.__enter__()
        except (PoolTimeout, psycopg.OperationalError):
            raise unavailable("the batch view (PostgreSQL) is unreachable; retry later") from None
        try:
            yield conn
        except BaseException as exc:
            if not cm.__exit__(type(exc), exc, exc.__traceback__):
                raise
        else:
            cm.__exit__(None, None, None)


def get_db(request: Request) -> Db:
    db: Db = request.app.state.db
    return db


def get_redis(request: Request) -> redis.Redis:
    client: redis.Redis = request.app.state.redis
    return client


def get_view(request: Request) -> MergedView:
    view: MergedView = request.app.state.view
    return view


def get_observer(request: Request) -> ServingMetrics:
    metrics: ServingMetrics = request.app.state.metrics
    return metrics


SettingsDep = Annotated[Settings, Depends(get_settings)]
DbDep = Annotated[Db, Depends(get_db)]
RedisDep = Annotated[redis.Redis, Depends(get_redis)]
ViewDep = Annotated[MergedView, Depends(get_view)]
ObserverDep = Annotated[ServingMetrics, Depends(get_observer)]
