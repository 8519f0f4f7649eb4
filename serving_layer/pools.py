"""PostgreSQL pools as routes use them. The query routes (series, top, keys) are `async` and
use the asyncio pool, so a request costs no thread hand-off; the operator routes run in
FastAPI's threadpool with the blocking pool. Reads of the batch view (the query routes,
`/v1/status`'s served row) go to `Settings.batch_view_url`, a streaming replica when one is
configured; the run routes to the primary, which alone takes writes.

After PostgreSQL restarts, every pooled connection is dead. Unchecked, the pools handed them
out one request at a time (each answered 503) while the replacements they started backed off
for as long as the outage had lasted: `/readyz` saw PostgreSQL down for about a minute after
it was back. So each pool checks a connection before handing it out — cheaply: an idle
connection has nothing to read unless the server closed it, so one `select` suffices and only
such a connection gets psycopg's round-trip check (`check_connection`) — and once it finds
one dead it checks all its idle ones (`check()`), since a restart closed them all. Failed
reconnections are given up after `serving.pg_reconnect_timeout_s`; a request that then finds
the pool empty starts a fresh attempt, so the pools reconnect within seconds of recovery.

A request waits up to `_WAIT_S` for a connection (all may be busy: then its 503 says the API
is overloaded, not that PostgreSQL is down); but once one found none while none was busy,
PostgreSQL is most likely down, and each request waiting 5 s for its 503 only piles them up:
until a request gets a connection again, they wait `_WAIT_DOWN_S`. That change of state is
logged once each way (`event=store_down` / `event=store_recovered`, as the other processes
do); psycopg_pool's own line per failed attempt (two a second per pool through an outage)
and per connection a restart closed are dropped (`_PoolNoise`)."""

from __future__ import annotations

import logging
import select
import threading
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from typing import TYPE_CHECKING, Any

import psycopg
from fastapi import HTTPException
from psycopg_pool import AsyncConnectionPool, ConnectionPool, PoolTimeout

from serving_layer.errors import BatchViewUnreachable, unavailable
from shared.config import Settings

if TYPE_CHECKING:
    from serving_layer.served_row import HeldServedRow

log = logging.getLogger(__name__)

_OVERLOADED = (
    "the API is overloaded: every PostgreSQL connection stayed busy with other requests; "
    "retry later, or add API workers (LAMBDA_SERVING__WORKERS)"
)
_WAIT_S = 5.0
_WAIT_DOWN_S = 0.5
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


class _PoolNoise(logging.Filter):
    """Drops psycopg_pool's per-attempt and per-connection warnings (module doc)."""

    MESSAGES = (
        "error connecting in %r: %s",
        "reconnection attempt in pool %r failed after %s sec",
        "discarding broken connection: %s",
    )

    def filter(self, record: logging.LogRecord) -> bool:
        return record.msg not in self.MESSAGES


_POOL_NOISE = _PoolNoise()


def blocking_pool(settings: Settings, url: str, min_size: int = 4) -> ConnectionPool:
    """A pool of the routes run in threads, on `url`, opened; connections checked (module
    doc)."""
    logging.getLogger("psycopg.pool").addFilter(_POOL_NOISE)

    def check(conn: psycopg.Connection[Any]) -> None:
        if _closed_by_server(conn):
            try:
                ConnectionPool.check_connection(conn)
            except psycopg.Error:
                pool.check()
                raise

    pool: ConnectionPool = ConnectionPool(
        url,
        min_size=min_size,
        max_size=_MAX_SIZE,
        kwargs=_CONNECTION,
        check=check,
        reconnect_timeout=settings.serving.pg_reconnect_timeout_s,
        open=True,
    )
    return pool


def async_pool(settings: Settings) -> AsyncConnectionPool:
    """The query routes' pool on the batch view (`Settings.batch_view_url`), not opened yet
    (`await pool.open()` in the event loop)."""
    logging.getLogger("psycopg.pool").addFilter(_POOL_NOISE)

    async def check(conn: psycopg.AsyncConnection[Any]) -> None:
        if _closed_by_server(conn):
            try:
                await AsyncConnectionPool.check_connection(conn)
            except psycopg.Error:
                await pool.check()
                raise

    pool: AsyncConnectionPool = AsyncConnectionPool(
        settings.batch_view_url,
        max_size=_MAX_SIZE,
        kwargs=_CONNECTION,
        check=check,
        reconnect_timeout=settings.serving.pg_reconnect_timeout_s,
        open=False,
    )
    return pool


class _Waits:
    """Whether the last request found no connection, hence how long the next one waits for
    one (module doc)."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.failing = False
        self.held = 0
        """Connections requests hold right now."""
        self._lock = threading.Lock()

    def took(self) -> None:
        with self._lock:
            self.held += 1

    def gave(self) -> None:
        with self._lock:
            self.held -= 1

    def timeout(self) -> float:
        return _WAIT_DOWN_S if self.failing else _WAIT_S

    def refusal(self, error: Exception) -> HTTPException:
        """The 503 for a request that got no connection: the pool was busy (other requests
        held connections all along: overload), or PostgreSQL is down."""
        if isinstance(error, PoolTimeout) and self.held:
            return unavailable(_OVERLOADED)
        self.failed(error)
        return BatchViewUnreachable()

    def failed(self, error: Exception) -> None:
        if not self.failing:
            self.failing = True
            log.warning(
                "event=store_down store=postgres pool=%s error=%s: %s; answering 503 until a "
                "connection is made again",
                self.name,
                type(error).__name__,
                error,
            )

    def succeeded(self) -> None:
        if self.failing:
            self.failing = False
            # WARNING, like the outage: the API leaves the root logger unconfigured, so
            # INFO lines of the layer's own loggers are not shown.
            log.warning("event=store_recovered store=postgres pool=%s", self.name)


class Db:
    """The PostgreSQL pool as routes use it: a connection is taken and given back inside the
    route's own worker thread. (A `yield` dependency would give it back from another
    threadpool task, which deadlocks once every worker thread waits for a connection.)"""

    def __init__(self, pool: ConnectionPool, name: str = "operator") -> None:
        self._pool = pool
        self._waits = _Waits(name)

    @contextmanager
    def connection(self) -> Iterator[psycopg.Connection[Any]]:
        try:
            cm = self._pool.connection(timeout=self._waits.timeout())
            conn = cm.__enter__()
        except (PoolTimeout, psycopg.OperationalError) as exc:
            raise self._waits.refusal(exc) from None
        self._waits.succeeded()
        self._waits.took()
        try:
            yield conn
        except BaseException as exc:
            if not cm.__exit__(type(exc), exc, exc.__traceback__):
                raise
        else:
            cm.__exit__(None, None, None)
        finally:
            self._waits.gave()


class AsyncDb:
    """The asyncio pool: a connection is held only around a statement, not across the
    request's Redis read. `served`: the served row held for the batch view this pool reads
    (`serving_layer.served_row`), which reads of it plan against without a statement."""

    def __init__(self, pool: AsyncConnectionPool, served: HeldServedRow | None = None) -> None:
        self._pool = pool
        self._waits = _Waits("query")
        self.served = served

    @asynccontextmanager
    async def connection(self) -> AsyncIterator[psycopg.AsyncConnection[Any]]:
        try:
            cm = self._pool.connection(timeout=self._waits.timeout())
            conn = await cm.__aenter__()
        except (PoolTimeout, psycopg.OperationalError) as exc:
            raise self._waits.refusal(exc) from None
        self._waits.succeeded()
        self._waits.took()
        try:
            yield conn
        except BaseException as exc:
            if not await cm.__aexit__(type(exc), exc, exc.__traceback__):
                raise
        else:
            await cm.__aexit__(None, None, None)
        finally:
            self._waits.gave()
