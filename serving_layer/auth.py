"""Bearer tokens: readers query, operators also run batches. With no token configured the API
is open (the local default). Tokens are compared in constant time and never logged."""

from __future__ import annotations

import hmac
from typing import Annotated, Literal

from fastapi import Depends, HTTPException, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from shared.config import AuthSettings

Role = Literal["reader", "operator"]

_bearer = HTTPBearer(
    auto_error=False,
    description="A reader token for queries, an operator token for batch runs.",
)


def _matches(token: str, candidates: tuple[str, ...]) -> bool:
    found = False
    for candidate in candidates:
        found |= hmac.compare_digest(token.encode(), candidate.encode())
    return found


def role_of(auth: AuthSettings, token: str | None) -> Role | None:
    if token is None:
        return None
    if _matches(token, auth.operator_tokens):
        return "operator"
    if _matches(token, auth.reader_tokens):
        return "reader"
    return None


def _unauthorized(message: str) -> HTTPException:
    return HTTPException(401, detail=message, headers={"WWW-Authenticate": "Bearer"})


def _check(request: Request, credentials: HTTPAuthorizationCredentials | None, need: Role) -> None:
    auth: AuthSettings = request.app.state.settings.auth
    if not auth.enabled:
        return
    if credentials is None:
        raise _unauthorized(
            "send `Authorization: Bearer <token>` with a "
            + ("reader or operator" if need == "reader" else "operator")
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
