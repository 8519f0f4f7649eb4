"""`/v1/status`: the speed layer's lag per partition, W and its age per metric, last runs."""

from __future__ import annotations

import time

from fastapi import APIRouter, Request

from serving_layer.auth import ReaderDep
from serving_layer.deps import BatchViewDbDep, DbDep, SettingsDep
from serving_layer.routes.runs import _iso, run_out
from serving_layer.schemas import (
    MetricWatermark,
    PartitionLag,
    PartitionStallInfo,
    StatusResponse,
    problems,
)
from serving_layer.timefmt import format_time
from shared.db.runs import list_runs
from shared.db.served import read_served, replay_lag_s
from shared.metric_plan import read_plans
from shared.speed_view import PartitionStall, fence_key, rebuild_member, stalled_partitions
from shared.speed_view import speed_status as read_speed_status

router = APIRouter(
    prefix="/v1", tags=["status"], dependencies=[ReaderDep], responses=problems(400, 401, 503)
)


def _stall_info(stall: PartitionStall | None) -> PartitionStallInfo | None:
    if stall is None:
        return None
    since = format_time(stall.since_ms)
    return PartitionStallInfo(
        cause=stall.cause, error=stall.error, since=since, worker=stall.worker
    )


@router.get("/status", response_model=StatusResponse)
def status(
    request: Request, settings: SettingsDep, db: DbDep, view_db: BatchViewDbDep
) -> StatusResponse:
    with view_db.connection() as conn:
        served = read_served(conn)
        replica_lag = replay_lag_s(conn)
    with db.connection() as conn:
        runs = [run_out(r) for r in list_runs(conn, limit=5)]
    client = request.app.state.redis
    speed_status = read_speed_status(client)
    kafka = request.app.state.kafka
    kafka_state = kafka.check()
    partitions: list[PartitionLag] = []
    stalls: dict[str, PartitionStall] = {}
    if speed_status != "unavailable":
        try:
            stalls = stalled_partitions(client)
        except Exception:  # Redis went away after the status read: report it as such
            speed_status = "unavailable"
    for source in settings.sources:
        ends = None if kafka_state != "ok" else kafka.end_offsets(source.topic, source.partitions)
        fences: list[tuple[int | None, int | None]] = [(None, None)] * source.partitions
        if speed_status != "unavailable":
            try:
                pipe = client.pipeline(transaction=False)
                for p in range(source.partitions):
                    pipe.hmget(fence_key(source.topic, p), ["offset", "stream_time"])
                fences = [
                    (None if o is None else int(o), None if t is None else int(t))
                    for o, t in pipe.execute()
                ]
            except Exception:  # Redis went away between the two calls: report it as such
                speed_status = "unavailable"
        for p in range(source.partitions):
            offset, stream_time = fences[p]
            end = None if ends is None else ends.get(p)
            lag = None
            if end is not None and speed_status != "unavailable":
                lag = max(0, end - (0 if offset is None else offset + 1))
            partitions.append(
                PartitionLag(
                    topic=source.topic,
                    partition=p,
                    end_offset=end,
                    applied_offset=offset,
                    lag=lag,
                    stream_time=None if stream_time is None else format_time(stream_time),
                    stalled=_stall_info(stalls.get(rebuild_member(source.topic, p))),
                )
            )
    published = None if served is None else served.published_at
    now_ms = time.time() * 1000
    metrics = []
    for metric in read_plans(settings.plans.values()):
        version = metric.version
        w = None if served is None else served.watermark(metric.name, version)
        metrics.append(
            MetricWatermark(
                metric=metric.name,
                batch_watermark=None if w is None else format_time(w),
                age_s=None if w is None else round((now_ms - w) / 1000, 3),
                served_version=None if served is None else served.versions.get(metric.name),
                configured_version=version,
            )
        )
    return StatusResponse(
        speed_status=speed_status,
        generation=None if served is None else served.generation,
        published_at=None if published is None else _iso(published),
        replica_lag_s=None if replica_lag is None else round(replica_lag, 3),
        partitions=partitions,
        metrics=metrics,
        runs=runs,
        batch_error=next((r.error for r in runs if r.status in ("succeeded", "failed")), None),
        kafka=kafka_state,
        postgres="ok",
    )
