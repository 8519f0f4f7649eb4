"""Bad input becomes a 4xx whose message says what to send instead; a backing service that is
down becomes a 503 naming it. Nothing a client sends can produce a 500."""

from __future__ import annotations

import logging

import psycopg
from fastapi import FastAPI, HTTPException, Request
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException

from serving_layer.responses import JSONResponse
from shared.errors import LambdaError, ServiceUnavailableError

log = logging.getLogger(__name__)


class BatchViewUnsettled(ServiceUnavailableError):
    """The served row changed under a read again and again (runs publishing back to back):
    answered 503, the client retries."""


class TooManyCells(LambdaError):
    """A query would read more than `serving.max_cells` cells: answered 400."""

    def __init__(self, limit: int) -> None:
        super().__init__(
            f"the query reads more than {limit} cells (LAMBDA_SERVING__MAX_CELLS); add filters "
            "(dim=value), group by fewer dimensions, narrow [start, end) or use a larger window"
        )


class RetentionExpired(LambdaError):
    """A query needs cells that retention removed (rule 14 in docs/semantics.md): answered 400
    with what is kept."""


def bad_request(message: str) -> HTTPException:
    return HTTPException(status_code=400, detail=message)


def not_found(message: str) -> HTTPException:
    return HTTPException(status_code=404, detail=message)


def conflict(message: str) -> HTTPException:
    return HTTPException(status_code=409, detail=message)


def too_many_requests(message: str, retry_after_s: int) -> HTTPException:
    """A 429: the request is fine but must wait; `Retry-After` says how long, in seconds."""
    return HTTPException(
        status_code=429, detail=message, headers={"Retry-After": str(retry_after_s)}
    )


def unavailable(message: str) -> HTTPException:
    return HTTPException(status_code=503, detail=message)


class BatchViewUnreachable(HTTPException):
    """A 503: PostgreSQL refused or dropped the connection (not the pool busy with other
    requests). A series read catches it and answers from the speed view alone (rule 12 in
    docs/semantics.md)."""

    def __init__(self) -> None:
        super().__init__(
            status_code=503, detail="the batch view (PostgreSQL) is unreachable; retry later"
        )


def _describe(exc: RequestValidationError) -> str:
    parts = []
    for err in exc.errors():
        loc = [str(p) for p in err.get("loc", ())]
        kind = loc[0] if loc and loc[0] in ("query", "body", "path", "header") else "request"
        where = ".".join(p for p in loc if p != kind) or kind
        message = str(err.get("msg", "invalid")).removeprefix("Value error, ")
        if err.get("type") == "missing":
            parts.append(f"missing {kind} parameter {where!r}; send it")
        elif err.get("type") == "json_invalid":
            parts.append("the body is not valid JSON; send a JSON object")
        else:
            got = err.get("input")
            shown = "" if isinstance(got, dict | list) else f" (got {str(got)[:80]!r})"
            parts.append(f"{kind} {where}: {message}{shown}")
    return "invalid request: " + "; ".join(parts)


def install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(RequestValidationError)
    async def _validation(request: Request, exc: RequestValidationError) -> JSONResponse:
        return JSONResponse({"detail": _describe(exc)}, status_code=400)

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        return JSONResponse(
            {"detail": str(exc.detail)}, status_code=exc.status_code, headers=exc.headers
        )

    @app.exception_handler(psycopg.OperationalError)
    async def _postgres_down(request: Request, exc: psycopg.OperationalError) -> JSONResponse:
        log.warning("PostgreSQL unavailable: %s", exc)
        return JSONResponse(
            {"detail": "the batch view (PostgreSQL) is unreachable; retry later"},
            status_code=503,
        )

    @app.exception_handler(TooManyCells)
    @app.exception_handler(RetentionExpired)
    async def _too_many(request: Request, exc: LambdaError) -> JSONResponse:
        return JSONResponse({"detail": str(exc)}, status_code=400)

    @app.exception_handler(BatchViewUnsettled)
    async def _unsettled(request: Request, exc: BatchViewUnsettled) -> JSONResponse:
        return JSONResponse({"detail": str(exc)}, status_code=503)

    @app.exception_handler(UnicodeError)
    async def _bad_encoding(request: Request, exc: UnicodeError) -> JSONResponse:
        return JSONResponse({"detail": "send UTF-8 text"}, status_code=400)
