"""PostgreSQL pools as routes use them. The query routes (series, top, keys) are `async` and
use the asyncio pool, so a request costs no thread hand-off; the operator routes run in
FastAPI's threadpool with the blocking pool."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from typing import Any

import psycopg
from psycopg_pool import AsyncConnectionPool, ConnectionPool, PoolTimeout

from serving_layer.errors import unavailable

_UNREACHABLE = "the batch view (PostgreSQL) is unreachable; retry later"
_WAIT_S = 5.0


class Db:
    """The PostgreSQL pool as routes use it: a connection is taken and given back inside the
    route's own worker thread. (A `yield` dependency would give it back from another
    threadpool task, which deadlocks once every worker thread waits for a connection.)"""

    def __init__(self, pool: ConnectionPool) -> None:
        self._pool = pool

    @contextmanager
    def connection(self) -> Iterator[psycopg.Connection[Any]]:
        try:
            cm = self._pool.connection(timeout=_WAIT_S)
            conn = cm.__enter__()
        except (PoolTimeout, psycopg.OperationalError):
            raise unavailable(_UNREACHABLE) from None
        try:
            yield conn
        except BaseException as exc:
            if not cm.__exit__(type(exc), exc, exc.__traceback__):
                raise
        else:
            cm.__exit__(None, None, None)


class AsyncDb:
    """The asyncio pool: a connection is held only around a statement, not across the
    request's Redis read."""

    def __init__(self, pool: AsyncConnectionPool) -> None:
        self._pool = pool

    @asynccontextmanager
    async def connection(self) -> AsyncIterator[psycopg.AsyncConnection[Any]]:
        try:
            cm = self._pool.connection(timeout=_WAIT_S)
            conn = await cm.__aenter__()
        except (PoolTimeout, psycopg.OperationalError):
            raise unavailable(_UNREACHABLE) from None
        try:
            yield conn
        except BaseException as exc:
            if not await cm.__aexit__(type(exc), exc, exc.__traceback__):
                raise
        else:
            await cm.__aexit__(None, None, None)
