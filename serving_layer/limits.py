"""Bounds on what one request can make the API read: the request target (414), its headers
(431), each query parameter (400) and the body (413), from `serving.max_url_bytes`,
`serving.max_headers`, `serving.max_header_bytes`, `serving.max_param_chars` and
`serving.max_body_bytes`; and on what the API takes on at once (`RequestBudget`: 503).
Checked before routing, so no route parses an oversize input and the limits have one
definition; every refusal says the limit and the setting."""

from __future__ import annotations

import asyncio
import inspect
import logging
import math
from functools import partial
from urllib.parse import parse_qsl

from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from serving_layer.observability import ServingMetrics, route_template
from serving_layer.responses import JSONResponse
from shared.config import ServingSettings

log = logging.getLogger(__name__)

UNBUDGETED_PATHS = frozenset({"/healthz", "/readyz", "/metrics"})
"""Never shed nor timed out: an orchestrator must tell an overloaded process from a dead one,
and Prometheus must see the overload."""
SHED_RETRY_AFTER_S = 1
"""A refusal for load: requests in flight end within milliseconds to seconds."""


class RequestLimits:
    """Pure ASGI middleware (no per-request task). A body announced by Content-Length is
    refused before it is read; a streamed (chunked) one is counted as the route reads it."""

    def __init__(self, app: ASGIApp, serving: ServingSettings) -> None:
        self.app = app
        self.max_url = serving.max_url_bytes
        self.max_headers = serving.max_headers
        self.max_header_bytes = serving.max_header_bytes
        self.max_param = serving.max_param_chars
        self.max_body = serving.max_body_bytes
        self.too_large = (
            f"the request body is larger than the limit of {self.max_body} bytes "
            "(LAMBDA_SERVING__MAX_BODY_BYTES); send a smaller body"
        )

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        refusal = self._refusal(scope)
        if refusal is not None:
            status, detail = refusal
            await JSONResponse({"detail": detail}, status_code=status)(scope, receive, send)
            return
        streamed = any(
            name == b"transfer-encoding" and value.lower() != b"identity"
            for name, value in scope["headers"]
        )
        await self.app(scope, self._bounded(receive) if streamed else receive, send)

    def _refusal(self, scope: Scope) -> tuple[int, str] | None:
        query: bytes = scope["query_string"]
        target = len(scope.get("raw_path") or scope["path"].encode()) + len(query) + 1
        if target > self.max_url:
            return 414, (
                f"the request target is {target} bytes, more than the limit of {self.max_url} "
                "(LAMBDA_SERVING__MAX_URL_BYTES); send fewer or shorter query parameters"
            )
        headers = scope["headers"]
        if len(headers) > self.max_headers:
            return 431, (
                f"the request has {len(headers)} header fields, more than the limit of "
                f"{self.max_headers} (LAMBDA_SERVING__MAX_HEADERS); send fewer headers"
            )
        header_bytes = sum(len(name) + len(value) for name, value in headers)
        if header_bytes > self.max_header_bytes:
            return 431, (
                f"the request's headers are {header_bytes} bytes, more than the limit of "
                f"{self.max_header_bytes} (LAMBDA_SERVING__MAX_HEADER_BYTES); send fewer or "
                "shorter headers"
            )
        if len(query) > self.max_param:  # decoding never lengthens a parameter: else all fit
            for name, value in parse_qsl(query.decode("latin-1"), keep_blank_values=True):
                longest = max(len(name), len(value))
                if longest > self.max_param:
                    return 400, (
                        f"query parameter {name[:64]!r} is {longest} characters long, more "
                        f"than the limit of {self.max_param} (LAMBDA_SERVING__MAX_PARAM_CHARS); "
                        "send a shorter value"
                    )
        for header, value in headers:
            if header == b"content-length" and value.isdigit() and int(value) > self.max_body:
                return 413, self.too_large
        return None

    def _bounded(self, receive: Receive) -> Receive:
        """`receive`, failing once the body read so far exceeds the limit. The failure is an
        HTTPException: FastAPI turns any other error while reading a body into a 400."""
        received = 0

        async def bounded() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.max_body:
                    raise HTTPException(413, self.too_large)
            return message

        return bounded


class RequestBudget:
    """Pure ASGI middleware bounding what one API process takes on: at most
    `serving.max_inflight_requests` requests in flight (one more is answered 503 at once,
    instead of queueing behind work it cannot see), each answered within
    `serving.request_timeout_s` (else 503). Both carry `Retry-After` and are counted in
    `/metrics`.

    The route runs as a task of its own, so the 503 goes out at the deadline whatever the
    route is doing, provided the event loop is free: an async route is cancelled at its next
    await (its PostgreSQL statement is cancelled on the server, its connection goes back to
    the pool); a sync route (the operator routes, in the thread pool) cannot be stopped, so
    it is left to finish and its answer is dropped (a run it queued stays queued). CPU work
    of an async route between awaits holds the event loop, and with it every answer, the 503
    included, until it yields: long merges yield every 20 ms (`merged_view.LoopTurns`). A
    request counts as in flight until its work has ended, so work a timeout left running
    still sheds load. A response that has started is not cut off."""

    def __init__(self, app: ASGIApp, serving: ServingSettings, metrics: ServingMetrics) -> None:
        self.app = app
        self.metrics = metrics
        self.max_in_flight = serving.max_inflight_requests
        self.timeout_s = serving.request_timeout_s
        self.in_flight = 0
        self.timeout_retry_after_s = math.ceil(self.timeout_s)
        self.overloaded = (
            f"the server is at its limit of {self.max_in_flight} requests in flight "
            f"(LAMBDA_SERVING__MAX_INFLIGHT_REQUESTS); retry in {SHED_RETRY_AFTER_S} s "
            "(Retry-After) or send the request to another API process"
        )
        self.too_slow = (
            f"the request took longer than its time budget of {self.timeout_s:g} s "
            "(LAMBDA_SERVING__REQUEST_TIMEOUT_S); narrow [start, end), add filters or send a "
            f"larger window or step, or retry in {self.timeout_retry_after_s} s (Retry-After)"
        )

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] in UNBUDGETED_PATHS:
            await self.app(scope, receive, send)
            return
        if self.in_flight >= self.max_in_flight:
            self.metrics.shed.inc()
            await _unavailable(self.overloaded, SHED_RETRY_AFTER_S)(scope, receive, send)
            return
        response = _Response(send)
        loop = asyncio.get_running_loop()
        work = asyncio.ensure_future(self.app(scope, receive, response.send))
        self.in_flight += 1
        work.add_done_callback(self._ended)
        ended = loop.create_future()
        work.add_done_callback(partial(_settle, ended))
        deadline = loop.call_later(self.timeout_s, _settle, ended)
        try:
            await ended
        except asyncio.CancelledError:
            work.cancel()
            raise
        finally:
            deadline.cancel()
        if work.done() or response.started:
            await work
            return
        response.abandoned = True
        if _runs_on_the_loop(scope):
            work.cancel()
        work.add_done_callback(_log_failure)
        self.metrics.timed_out.labels(route_template(scope)).inc()
        await _unavailable(self.too_slow, self.timeout_retry_after_s)(scope, receive, send)

    def _ended(self, _work: asyncio.Future[None]) -> None:
        self.in_flight -= 1


class _Response:
    """The route's side of a response: whether it has started, and — once a 503 answered in
    its place — its messages dropped."""

    def __init__(self, send: Send) -> None:
        self._send = send
        self.started = False
        self.abandoned = False

    async def send(self, message: Message) -> None:
        if self.abandoned:
            return
        if message["type"] == "http.response.start":
            self.started = True
        await self._send(message)


def _runs_on_the_loop(scope: Scope) -> bool:
    """Whether the matched route is async (or none matched yet). A sync route runs in a
    thread, which cancelling its task would not stop but abandon: no longer counted in
    flight, and outside the thread pool's limit (anyio releases its slot)."""
    endpoint = getattr(scope.get("route"), "endpoint", None)
    return endpoint is None or inspect.iscoroutinefunction(endpoint)


def _unavailable(detail: str, retry_after_s: int) -> JSONResponse:
    return JSONResponse(
        {"detail": detail}, status_code=503, headers={"Retry-After": str(retry_after_s)}
    )


def _settle(ended: asyncio.Future[None], *_: object) -> None:
    if not ended.done():
        ended.set_result(None)


def _log_failure(work: asyncio.Future[None]) -> None:
    """Work a timeout abandoned may still fail; nobody awaits it, so say so here."""
    if not work.cancelled() and work.exception() is not None:
        log.warning("a request past its time budget then failed: %r", work.exception())
