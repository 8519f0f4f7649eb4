"""Bearer tokens: readers query, operators also run batches. With no token configured the API
is open: the local default, refused in any other profile unless asked for explicitly
(`check_open_access`). Tokens are compared in constant time and never logged: the settings
hold them as secrets, and no message echoes a presented token."""

from __future__ import annotations

import hashlib
import hmac
from typing import Annotated, Literal

from fastapi import Depends, HTTPException, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from pydantic import SecretStr

from shared.config import AuthSettings, Settings
from shared.errors import ConfigError

Role = Literal["reader", "operator"]

_bearer = HTTPBearer(
    auto_error=False,
    description="A reader token for queries, an operator token for batch runs.",
)


def check_open_access(settings: Settings) -> None:
    """Refuse to serve without tokens outside the local profile, unless the operator said
    so: an API left open by a forgotten variable lets anyone queue full recomputes. Called
    by the app factory and, before any worker process starts, by `lambdactl serve`."""
    if settings.profile == "local" or settings.auth.enabled or settings.auth.allow_open:
        return
    raise ConfigError(
        f"profile {settings.profile!r} needs API tokens: set LAMBDA_AUTH__READER_TOKENS and "
        "LAMBDA_AUTH__OPERATOR_TOKENS (comma-separated or a JSON list), or set "
        "LAMBDA_AUTH__ALLOW_OPEN=true to serve without authentication on purpose"
    )


def _digest(text: str) -> bytes:
    return hashlib.sha256(text.encode()).digest()


def _matches(presented: bytes, candidates: tuple[SecretStr, ...]) -> bool:
    """Whether the presented token's digest is one of the candidates'. Every candidate is
    compared, and digests have one length: the time taken tells neither which token
    matched nor how long the configured ones are."""
    found = False
    for candidate in candidates:
        found |= hmac.compare_digest(presented, _digest(candidate.get_secret_value()))
    return found


def role_of(auth: AuthSettings, token: str | None) -> Role | None:
    if token is None:
        return None
    presented = _digest(token)
    operator = _matches(presented, auth.operator_tokens)
    reader = _matches(presented, auth.reader_tokens)
    if operator:
        return "operator"
    return "reader" if reader else None


def _unauthorized(message: str) -> HTTPException:
    return HTTPException(401, detail=message, headers={"WWW-Authenticate": "Bearer"})


def _check(request: Request, credentials: HTTPAuthorizationCredentials | None, need: Role) -> None:
    auth: AuthSettings = request.app.state.settings.auth
    if not auth.enabled:
        return
    if credentials is None:
        raise _unauthorized(
            "send `Authorization: Bearer <token>` with "
            + ("a reader or operator" if need == "reader" else "an operator")
            + " token"
        )
    role = role_of(auth, credentials.credentials)
    if role is None:
        raise _unauthorized("unknown token; send a configured reader or operator token")
    if need == "operator" and role != "operator":
        raise HTTPException(403, detail="this needs an operator token; a reader token can query")


async def require_reader(
    request: Request,
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
) -> None:
    _check(request, credentials, "reader")


async def require_operator(
    request: Request,
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
) -> None:
    _check(request, credentials, "operator")


ReaderDep = Depends(require_reader)
OperatorDep = Depends(require_operator)
