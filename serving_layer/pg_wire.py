"""SQL in the PostgreSQL wire protocol (`serving.pg_port`), so psql and BI tools connect: the
protocol is pg-mimic's (startup, simple and extended query, text and binary results, cancel,
`SET`/`SHOW`, `information_schema` and `pg_catalog` from the tables declared here); every
SELECT is compiled by `serving_layer.sql` and read by the same pipeline as `POST /v1/sql`.
With tokens configured, a client sends a reader or operator token as its password (cleartext,
as `Authorization: Bearer` sends it: the protocol runs without TLS here)."""

from __future__ import annotations

import asyncio
import re
from datetime import UTC, datetime, timedelta
from typing import Any

from fastapi import HTTPException
from pg_mimic import PgError, PgServer, ResultColumn, Session, StaticStatement, messages
from pg_mimic import types as pg_types
from pg_mimic.auth import AuthPlugin, IdentityProvider, TrustAuthPlugin
from pg_mimic.catalog import pg_catalog_statement
from pg_mimic.middleware import DEFAULT_MIDDLEWARE, MiddlewareContext
from pg_mimic.session import Portal, Statement
from pg_mimic.stream import ConnectionClosed, PgStream
from sqlglot import exp

from serving_layer import sql
from serving_layer.auth import role_of
from serving_layer.merged_view import MergedView
from serving_layer.pools import AsyncDb
from serving_layer.read_plan import Answer
from shared.config import Settings
from shared.errors import LambdaError, ServiceUnavailableError

SERVER_VERSION = "16.0"
SERVER_VERSION_NUM = "160000"
"""What `server_version` and `version()` report: the PostgreSQL whose SQL the dialect parses
(sqlglot's `postgres`); clients pick their catalog queries by it."""

_OIDS = {
    "timestamptz": pg_types.TIMESTAMPTZ,
    "text": pg_types.TEXT,
    "bigint": pg_types.INT8,
    "double precision": pg_types.FLOAT8,
}
_VERSION = re.compile(r"select\s+(pg_catalog\.)?version\(\)\s*;?", re.IGNORECASE)
_ISOLATION = re.compile(r"show\s+transaction\s+isolation\s+level\s*;?", re.IGNORECASE)
_NO_OPS = re.compile(r"(savepoint|release|rollback\s+to|discard|deallocate)\b", re.IGNORECASE)


class TokenPassword(AuthPlugin):
    """A password that is a configured reader or operator token, compared in constant time
    (`serving_layer.auth.role_of`), whatever the user name."""

    def __init__(self, settings: Settings) -> None:
        self._auth = settings.auth

    async def authenticate(
        self, stream: PgStream, username: str, identity_provider: IdentityProvider
    ) -> bool:
        stream.write(messages.make_authentication_cleartext_password())
        await stream.drain()
        tag, payload = await stream.read_message()
        if tag != messages.PASSWORD:
            raise PgError("28P01", "expected a password: a reader or operator token")
        return role_of(self._auth, payload.rstrip(b"\x00").decode(errors="replace")) is not None


class MetricTables(Session):
    """One connection's session: the metrics as tables, each statement compiled and read."""

    def __init__(
        self, settings: Settings, statements: sql.SqlStatements, view: MergedView, db: AsyncDb
    ) -> None:
        self._settings = settings
        self._statements = statements
        self._view = view
        self._db = db

    async def init(self, connection: Any) -> None:
        await super().init(connection)
        connection.session_vars["server_version_num"] = SERVER_VERSION_NUM  # Grafana asks

    async def schema(self) -> dict[str, dict[str, str]]:
        """Each metric's table for `information_schema` and `pg_catalog` (`\\dt`, `\\d m`,
        SQLAlchemy's inspector): `ts`, the key dimensions, a session metric's `end`,
        `events` and `duration_s`, and `source`."""
        return {
            metric.name: {
                sql.TIME_COLUMN: "timestamptz",
                **dict.fromkeys(metric.key, "text"),
                **(sql.SESSION_COLUMNS if metric.session is not None else {}),
                sql.SOURCE_COLUMN: "text",
            }
            for metric in self._settings.metrics
        }

    async def describe(self, text: str, param_oids: list[int | None]) -> list[ResultColumn]:
        try:
            columns = sql.columns_of(self._settings, text)
        except HTTPException as exc:
            raise _pg_error(exc) from None
        return [ResultColumn(c.name, _OIDS[c.type]) for c in columns]

    async def query(self, text: str, params: list[str | None]) -> list[tuple[Any, ...]]:
        try:
            statement = self._statements.compile(text, params)
            if statement.explain:
                plan = await sql.explain(statement, self._view, self._db)
                return [(line,) for line in plan.rows]
            answer: Answer[Any] = await statement.query.read(self._view, self._db)
        except (HTTPException, LambdaError) as exc:
            raise _pg_error(exc) from None
        kinds = [c.type for c in statement.columns]
        return [tuple(map(_wire_value, kinds, row)) for row in statement.rows(answer)]


_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def _wire_value(kind: str, value: Any) -> Any:
    """A column's value as the protocol encodes it: a timestamptz (epoch ms) as an aware
    datetime."""
    if kind == "timestamptz" and value is not None:
        return _EPOCH + timedelta(milliseconds=value)
    return value


def _pg_error(exc: Exception) -> PgError:
    """An answer's refusal as PostgreSQL reports it: a statement the dialect cannot answer
    is a syntax or feature error at its position, a backing service down is 57P03."""
    if isinstance(exc, sql.SqlError):
        fields = {} if exc.position is None else {"P": str(exc.position)}
        return PgError(exc.sqlstate, exc.message, **fields)
    if isinstance(exc, ServiceUnavailableError):
        return PgError("57P03", str(exc))
    if isinstance(exc, HTTPException):
        state = "42P01" if exc.status_code == 404 else "22023"
        return PgError(state, str(exc.detail))
    return PgError("22023", str(exc))


async def _compat(ctx: MiddlewareContext) -> StaticStatement | None:
    """What clients send on connect that the default chain does not answer: `version()`
    (SQLAlchemy parses its number) and transaction no-ops (a read-only server has nothing to
    save or release)."""
    text = ctx.sql.strip()
    if _VERSION.fullmatch(text):
        version = f"PostgreSQL {SERVER_VERSION} (Lambda Platform SQL)"
        return StaticStatement(ctx.sql, [ResultColumn("version", pg_types.TEXT)], [(version,)])
    if _NO_OPS.match(text):
        return StaticStatement(ctx.sql, None, [])
    if _ISOLATION.fullmatch(text):  # SQLAlchemy asks on connect
        column = [ResultColumn("transaction_isolation", pg_types.TEXT)]
        return StaticStatement(ctx.sql, column, [("read committed",)])
    return None


class _CatalogStatement(Statement):
    """A `pg_catalog` query with parameters (SQLAlchemy's inspector sends them): pg-mimic
    evaluates its catalog as the statement is prepared, before any value is bound, so this
    evaluates it at Execute with the values in place, `x = ANY (ARRAY[...])` read as
    `x IN (...)` (sqlglot's executor answers ANY with nothing)."""

    def __init__(self, connection: Any, text: str, query: exp.Query) -> None:
        self._connection = connection
        self.sql = text
        self.param_oids: list[int | None] = []
        self._query = query

    async def describe(self) -> list[ResultColumn] | None:
        statement = await self._bound([])
        return None if statement is None else await statement.describe()

    def bind(self, params: list[str | None]) -> Portal:
        return _CatalogPortal(self, params)

    async def _bound(self, params: list[str | None]) -> Statement | None:
        query = self._query.copy()
        sql.bind_parameters(query, params, unbound_null=True)
        for equal in list(query.find_all(exp.EQ)):
            listed = equal.expression
            if isinstance(listed, exp.Any):
                inner = listed.this.this if isinstance(listed.this, exp.Paren) else listed.this
                if isinstance(inner, exp.Array):
                    equal.replace(exp.In(this=equal.this, expressions=inner.expressions))
        return await pg_catalog_statement(self._connection, query)


class _CatalogPortal(Portal):
    def __init__(self, statement: _CatalogStatement, params: list[str | None]) -> None:
        self._statement = statement
        self._params = params
        self._portal: Portal | None = None

    async def execute(self, max_rows: int) -> tuple[list[tuple[Any, ...]], bool]:
        if self._portal is None:
            statement = await self._statement._bound(self._params)
            if statement is None:
                return [], False
            self._portal = statement.bind([])
        rows, suspended = await self._portal.execute(max_rows)
        return rows, suspended


_FORMAT_TYPES = {
    "timestamptz": "timestamp with time zone",
    "text": "text",
    "bigint": "bigint",
    "double precision": "double precision",
}
_REFLECTED = {"not_null": False, "generated": ""}
"""What SQLAlchemy's column reflection reads besides names and types; every other output
(default, comment, identity, collation) is NULL."""


async def _reflected_columns(ctx: MiddlewareContext) -> Statement | None:
    """SQLAlchemy's column reflection (`inspect(engine).get_columns`): a pg_catalog query of
    `pg_attribute` with `format_type` and functions sqlglot's executor cannot evaluate, answered
    from the declared tables for the tables it names (`relname IN (...)`)."""
    query = ctx.expression
    if not isinstance(query, exp.Select) or "pg_attribute" not in ctx.sql:
        return None
    outputs = [e.alias_or_name for e in query.expressions]
    if outputs[:2] != ["name", "format_type"] or "table_name" not in outputs:
        return None
    names = {
        str(value.this)
        for found in query.find_all(exp.In)
        if isinstance(found.this, exp.Column) and found.this.name == "relname"
        for value in found.expressions
        if isinstance(value, exp.Literal | exp.Cast)
        for value in [value.this if isinstance(value, exp.Cast) else value]
    }
    tables = await ctx.connection.session.schema()
    rows = []
    for table in sorted(name for name in tables if name in names):
        for column, kind in tables[table].items():
            known = {"name": column, "format_type": _FORMAT_TYPES[kind], "table_name": table}
            rows.append(tuple(known.get(o, _REFLECTED.get(o)) for o in outputs))
    types = {"not_null": pg_types.BOOL}
    columns = [ResultColumn(o, types.get(o, pg_types.TEXT)) for o in outputs]
    return StaticStatement(ctx.sql, columns, rows)


async def _catalog(ctx: MiddlewareContext) -> Statement | None:
    """Catalog queries with parameters or `ANY (ARRAY[...])`, answered at Execute."""
    query = ctx.expression
    if not isinstance(query, exp.Query) or not any(
        (table.db or "").lower() == "pg_catalog" for table in query.find_all(exp.Table)
    ):
        return None
    if not ctx.param_oids and not any(
        isinstance(e.expression, exp.Any) for e in query.find_all(exp.EQ)
    ):
        return None
    return _CatalogStatement(ctx.connection, ctx.sql, query)


MetricTables.middleware = (_compat, _reflected_columns, _catalog, *DEFAULT_MIDDLEWARE)


class WireServer(PgServer):
    """The wire protocol on `serving.pg_port`: at most `serving.max_pg_connections` at once
    (a connection past them is answered SQLSTATE 53300 and closed), each with its own
    session over the app's merged view."""

    def __init__(
        self, settings: Settings, statements: sql.SqlStatements, view: MergedView, db: AsyncDb
    ) -> None:
        plugin: AuthPlugin = TokenPassword(settings) if settings.auth.enabled else TrustAuthPlugin()
        super().__init__(
            session_factory=lambda: MetricTables(settings, statements, view, db),
            auth_plugin_factory=lambda _user: plugin,
            server_version=SERVER_VERSION,
        )
        self._settings = settings
        self.startup_timeout_s = settings.serving.request_timeout_s
        """How long a client may take to finish its startup (and password) before it is
        dropped: a silent client holds no connection slot longer."""

    async def start(self) -> None:
        """Listen on `serving.pg_port`; the processes of `serving.workers` share it (each
        binds it with SO_REUSEPORT), a lone process refuses a port already taken."""
        serving = self._settings.serving
        await self.start_server(serving.host, serving.pg_port, reuse_port=serving.workers > 1)

    async def stop(self) -> None:
        self.close()
        await self.wait_closed()

    async def _client_connected_cb(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        await super()._client_connected_cb(_BoundedReader(reader), writer)

    async def _negotiate_startup(self, stream: PgStream) -> dict[str, str] | None:
        """The startup of pg-mimic, within `startup_timeout_s`, then refused past
        `serving.max_pg_connections` (this connection counted) as PostgreSQL refuses it."""
        try:
            async with asyncio.timeout(self.startup_timeout_s):
                startup: dict[str, str] | None = await super()._negotiate_startup(stream)
        except TimeoutError:
            raise ConnectionClosed from None
        most = self._settings.serving.max_pg_connections
        if startup is not None and len(self._writers) > most:
            refusal = {
                "S": "FATAL",
                "V": "FATAL",
                "C": "53300",
                "M": f"sorry, too many connections: serving.max_pg_connections ({most}) are "
                "open; retry later",
            }
            stream.write(messages.make_error_response(refusal))
            await stream.drain()
            raise ConnectionClosed
        return startup


MAX_MESSAGE_BYTES = 1 << 20
"""The longest protocol message read (a statement is at most a few KiB; `POST /v1/sql` takes
100k characters): a longer length, or a negative one, drops the connection before anything
is allocated for it."""


class _BoundedReader:
    """A connection's reader refusing to read a message longer than `MAX_MESSAGE_BYTES`."""

    def __init__(self, reader: asyncio.StreamReader) -> None:
        self._reader = reader

    async def readexactly(self, n: int) -> bytes:
        if not 0 <= n <= MAX_MESSAGE_BYTES:
            raise asyncio.IncompleteReadError(b"", max(n, 0))
        return await self._reader.readexactly(n)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._reader, name)
