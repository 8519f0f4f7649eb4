"""Liveness and readiness: open endpoints for orchestrators."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter
from fastapi.responses import JSONResponse

from serving_layer.deps import DbDep, RedisDep

router = APIRouter(tags=["health"])


@router.get("/healthz")
def healthz() -> dict[str, str]:
    return {"status": "ok"}


@router.get("/readyz")
def readyz(db: DbDep, redis_client: RedisDep) -> Any:
    checks: dict[str, str] = {}
    try:
        db.execute("SELECT 1")
        checks["postgres"] = "ok"
    except Exception as exc:  # report, never raise: this endpoint tells what is down
        checks["postgres"] = f"down: {exc}"
    try:
        redis_client.ping()
        checks["redis"] = "ok"
    except Exception as exc:
        checks["redis"] = f"down: {exc}"
    ready = all(v == "ok" for v in checks.values())
    return JSONResponse({"ready": ready, "checks": checks}, status_code=200 if ready else 503)
