"""Liveness and readiness: open endpoints for orchestrators."""

from __future__ import annotations

from fastapi import APIRouter, Request

from serving_layer.responses import JSONResponse
from serving_layer.schemas import Health, Ready
from serving_layer.timefmt import format_time
from shared.speed_view import stalled_partitions

router = APIRouter(tags=["health"])


@router.get("/healthz", response_model=Health)
def healthz() -> Health:
    return Health(status="ok")


@router.get(
    "/readyz",
    response_model=Ready,
    responses={503: {"model": Ready, "description": "a backing service is unreachable"}},
)
def readyz(request: Request) -> JSONResponse:
    """Kafka, Redis and PostgreSQL (and the batch view's read replica, when one is
    configured) reachable, each check bounded by a short timeout, and no speed partition
    stalled (a partition whose batches keep failing: which, since when, why)."""
    state = request.app.state
    checks: dict[str, str] = {}
    pools = {"postgres": state.pg_pool}
    if state.view_pool is not state.pg_pool:
        pools["batch_view_replica"] = state.view_pool
    for name, pool in pools.items():
        try:
            with pool.connection(timeout=3.0) as conn:
                conn.execute("SELECT 1")
            checks[name] = "ok"
        except Exception as exc:  # report, never raise: this endpoint tells what is down
            checks[name] = f"down: {type(exc).__name__}"
    try:
        state.redis.ping()
        checks["redis"] = "ok"
        stalls = stalled_partitions(state.redis)
        checks["speed"] = (
            "ok"
            if not stalls
            else "stalled: "
            + "; ".join(
                f"{member} since {format_time(s.since_ms)} ({s.cause}: {s.error})"
                for member, s in sorted(stalls.items())
            )
        )
    except Exception as exc:
        checks["redis"] = f"down: {type(exc).__name__}"
    checks["kafka"] = state.kafka.check()
    ready = all(v == "ok" for v in checks.values())
    return JSONResponse(
        Ready(ready=ready, checks=checks).model_dump(), status_code=200 if ready else 503
    )
