"""PostgreSQL pools as routes use them. The query routes (series, top, keys) are `async` and
use the asyncio pool, so a request costs no thread hand-off; the operator routes run in
FastAPI's threadpool with the blocking pool.

After PostgreSQL restarts, every pooled connection is dead. Unchecked, the pools handed them
out one request at a time (each answered 503) while the replacements they started backed off
for as long as the outage had lasted: `/readyz` saw PostgreSQL down for about a minute after
it was back. So each pool checks a connection before handing it out — cheaply: an idle
connection has nothing to read unless the server closed it, so one `select` suffices and only
such a connection gets psycopg's round-trip check (`check_connection`) — and once it finds
one dead it checks all its idle ones (`check()`), since a restart closed them all. Failed
reconnections are given up after `serving.pg_reconnect_timeout_s`; a request that then finds
the pool empty starts a fresh attempt, so the pools reconnect within seconds of recovery."""

from __future__ import annotations

import select
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from typing import Any

import psycopg
from psycopg_pool import AsyncConnectionPool, ConnectionPool, PoolTimeout

from serving_layer.errors import unavailable
from shared.config import Settings

_UNREACHABLE = "the batch view (PostgreSQL) is unreachable; retry later"
_WAIT_S = 5.0
_MAX_SIZE = 8
_CONNECTION: dict[str, Any] = {"autocommit": True, "connect_timeout": 3}


def _closed_by_server(conn: psycopg.Connection[Any] | psycopg.AsyncConnection[Any]) -> bool:
    """Whether an idle connection may be dead: closed here, or with bytes waiting (a server
    that shuts down or restarts sends a FATAL message, then closes the socket)."""
    if conn.closed or conn.broken:
        return True
    try:
        readable, _, _ = select.select([conn.fileno()], [], [], 0)
    except (OSError, ValueError):
        return True
    return bool(readable)


def blocking_pool(settings: Settings) -> ConnectionPool:
    """The operator routes' pool (and `/readyz`'s), opened; connections checked (module doc)."""

    def check(conn: psycopg.Connection[Any]) -> None:
        if _closed_by_server(conn):
            try:
                ConnectionPool.check_connection(conn)
            except psycopg.Error:
                pool.check()
                raise

    pool: ConnectionPool = ConnectionPool(
        settings.postgres.url,
        max_size=_MAX_SIZE,
        kwargs=_CONNECTION,
        check=check,
        reconnect_timeout=settings.serving.pg_reconnect_timeout_s,
        open=True,
    )
    return pool


def async_pool(settings: Settings) -> AsyncConnectionPool:
    """The query routes' pool, not opened yet (`await pool.open()` in the event loop)."""

    async def check(conn: psycopg.AsyncConnection[Any]) -> None:
        if _closed_by_server(conn):
            try:
                await AsyncConnectionPool.check_connection(conn)
            except psycopg.Error:
                await pool.check()
                raise

    pool: AsyncConnectionPool = AsyncConnectionPool(
        settings.postgres.url,
        max_size=_MAX_SIZE,
        kwargs=_CONNECTION,
        check=check,
        reconnect_timeout=settings.serving.pg_reconnect_timeout_s,
        open=False,
    )
    return pool


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
