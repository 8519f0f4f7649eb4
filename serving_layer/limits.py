"""Bounds on what one request can make the API read: the request target (414), each query
parameter (400) and the body (413), from `serving.max_url_bytes`, `serving.max_param_chars`
and `serving.max_body_bytes`. Checked before routing, so no route parses an oversize input
and the limits have one definition; every refusal says the limit and the setting."""

from __future__ import annotations

from urllib.parse import parse_qsl

from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from serving_layer.responses import JSONResponse
from shared.config import ServingSettings


class RequestLimits:
    """Pure ASGI middleware (no per-request task). A body announced by Content-Length is
    refused before it is read; a streamed (chunked) one is counted as the route reads it."""

    def __init__(self, app: ASGIApp, serving: ServingSettings) -> None:
        self.app = app
        self.max_url = serving.max_url_bytes
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
        if len(query) > self.max_param:  # decoding never lengthens a parameter: else all fit
            for name, value in parse_qsl(query.decode("latin-1"), keep_blank_values=True):
                longest = max(len(name), len(value))
                if longest > self.max_param:
                    return 400, (
                        f"query parameter {name[:64]!r} is {longest} characters long, more "
                        f"than the limit of {self.max_param} (LAMBDA_SERVING__MAX_PARAM_CHARS); "
                        "send a shorter value"
                    )
        for header, value in scope["headers"]:
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
