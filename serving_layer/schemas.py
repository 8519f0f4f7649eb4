"""Response and request bodies of the public contract, as pydantic models so `/docs` and
`/openapi.json` describe exactly what the API sends."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

SpeedStatus = Literal["ok", "rebuilding", "unavailable"]
BatchStatus = Literal["ok", "unavailable"]
"""`unavailable`: PostgreSQL did not answer; the answer holds only the windows starting at or
after `batch_watermark` (the W last read), from the speed view (rule 12 in docs/semantics.md)."""
PointSource = Literal["batch", "speed", "mixed"]
Number = int | float


class Problem(BaseModel):
    """Every 4xx/5xx: `detail` says what went wrong and what to send instead."""

    detail: str


def problems(*codes: int) -> dict[int | str, dict[str, object]]:
    """OpenAPI `responses` entries for the error codes a route can answer with."""
    meaning = {
        400: "bad input; `detail` says what to send",
        401: "missing or unknown token (when tokens are configured)",
        403: "a reader token on an operator route",
        404: "unknown metric or run",
        409: "a range run while a session metric is configured (queueing), or the run is not "
        "queued (cancelling)",
        429: "`batch.max_queued_runs` runs of the mode are queued; retry after `Retry-After` "
        "seconds or cancel queued runs",
        503: "PostgreSQL is unreachable, or (with `Retry-After`) the process is at "
        "`serving.max_inflight_requests` or the request passed `serving.request_timeout_s`",
    }
    return {code: {"model": Problem, "description": meaning[code]} for code in codes}


class LookupInfo(BaseModel):
    """A table joined to each event as of its time (rule 11 in docs/semantics.md)."""

    model_config = ConfigDict(populate_by_name=True, serialize_by_alias=True)

    table: str
    on: str = Field(description="the event's join key: a field or an expression")
    alias: str = Field(alias="as", description="the name its fields are read by: `<as>.<field>`")


class SessionInfo(BaseModel):
    """A session metric's rule (rule 13 in docs/semantics.md)."""

    gap: str
    max_duration: str


class MetricInfo(BaseModel):
    name: str
    source: str
    key: list[str] = Field(
        description="key dimensions: each may be fixed (`dim=value`) or grouped (`group_by`)"
    )
    value: str | None
    aggregations: list[str] = Field(
        description="the point fields by default, e.g. count, distinct_user_id, p50, p99"
    )
    by: list[str] = Field(description="values accepted by `top?by=`")
    windows: list[str]
    grace: str
    version: str
    rollups: list[list[str]] = Field(
        description="key subsets pre-aggregated: a query keeping only these dimensions (as "
        "filters or group_by) is answered from them"
    )
    fields: dict[str, str] = Field(
        default_factory=dict,
        description="computed fields (name: SQL expression), usable like event fields",
    )
    where: str | None = Field(
        default=None, description="the filter: only events for which it is TRUE are counted"
    )
    lookups: list[LookupInfo] = Field(
        default_factory=list, description="tables joined to each event as of its time"
    )
    retention: dict[str, str] = Field(
        default_factory=dict,
        description="how long each window's cells are kept, back from W (a window not listed: "
        "always); a query needing older cells of it answers 400",
    )
    session: SessionInfo | None = Field(
        default=None,
        description="a session metric: its points count the sessions starting in each window "
        "(`sessions`, `bounces`, `duration_*_s`) and aggregate their events",
    )


class MetricList(BaseModel):
    metrics: list[MetricInfo]


class Point(BaseModel):
    """One window. Besides start/end/source it carries exactly the metric's aggregations
    (`count`, `sum`, `min`, `max`, `avg`, `distinct_<field>`, and `p<100 q>` for each
    requested quantile of a `quantiles(<field>)` metric)."""

    model_config = ConfigDict(extra="allow")

    start: str
    end: str
    source: PointSource


class SeriesResponse(BaseModel):
    """One series: a key (every dimension given once), or the merge over every key passing
    `filters` (then `key` holds the dimensions fixed to one value; none given: the total)."""

    metric: str
    window: str
    step: str | None = Field(default=None, description="hopping windows: the step, if asked")
    tz: str | None = Field(default=None, description="the zone whole-day windows align to")
    key: dict[str, str]
    filters: dict[str, list[str]] | None = Field(
        default=None, description="the dimension filters of a merged series (dim -> values)"
    )
    batch_watermark: str | None = Field(description="W: cells ending at or before it are batch")
    batch_status: BatchStatus = Field(description="ok, or unavailable: windows from W on only")
    speed_status: SpeedStatus
    points: list[Point]


class SeriesGroup(BaseModel):
    key: dict[str, str] = Field(description="the group's `group_by` dimensions")
    points: list[Point]


class GroupedSeriesResponse(BaseModel):
    """One series per group of `group_by`, groups ascending by key, at most `limit`."""

    metric: str
    window: str
    step: str | None = Field(default=None, description="hopping windows: the step, if asked")
    tz: str | None = Field(default=None, description="the zone whole-day windows align to")
    filters: dict[str, list[str]]
    group_by: list[str]
    batch_watermark: str | None
    batch_status: BatchStatus = Field(description="ok, or unavailable: windows from W on only")
    speed_status: SpeedStatus
    groups: list[SeriesGroup]
    truncated: bool = Field(description="more groups had points than `limit`")


class TopItem(BaseModel):
    key: dict[str, str]
    value: Number | None
    source: PointSource


class TopResponse(BaseModel):
    metric: str
    window: str
    start: str
    end: str
    by: str
    batch_watermark: str | None
    batch_status: BatchStatus = Field(description="ok, or unavailable: windows from W on only")
    speed_status: SpeedStatus
    items: list[TopItem]


class SessionItem(BaseModel):
    """One session: `start` its first event, `end` its last, then its events' aggregations."""

    model_config = ConfigDict(extra="allow")
    key: dict[str, str]
    start: str
    end: str
    source: Literal["batch", "speed"]
    events: int
    duration_s: float


class SessionsResponse(BaseModel):
    metric: str
    key: dict[str, str]
    start: str
    end: str
    batch_watermark: str | None
    speed_status: SpeedStatus
    sessions: list[SessionItem]
    truncated: bool = Field(description="more sessions started in the range than `limit`")


class KeysResponse(BaseModel):
    metric: str
    start: str
    end: str
    batch_watermark: str | None
    speed_status: SpeedStatus
    keys: list[dict[str, str]]
    truncated: bool = Field(description="more keys matched than `limit`")


class RunCreate(BaseModel):
    model_config = ConfigDict(extra="forbid")

    mode: Literal["incremental", "full", "range"] = "incremental"
    start: str | int | None = Field(
        default=None, description="range runs: RFC 3339 with offset or epoch milliseconds"
    )
    end: str | int | None = Field(default=None, description="range runs: exclusive end")


class Run(BaseModel):
    run_id: int
    mode: str
    start: str | None
    end: str | None
    status: Literal["queued", "running", "succeeded", "failed", "cancelled"]
    progress: float = Field(description="0..1")
    requested_at: str
    started_at: str | None
    finished_at: str | None
    heartbeat_at: str | None
    duration_s: float | None
    rows_in: int | None
    rows_out: int | None
    malformed: int | None
    skipped: dict[str, int] | None
    w_before: dict[str, str] | None
    w_after: dict[str, str] | None
    generation: int | None
    error: str | None
    executed_mode: str | None = Field(
        default=None, description="the mode it ran as (a changed metric turns runs into full)"
    )
    attempt: int = 1
    timings: dict[str, float] | None = Field(default=None, description="seconds per phase")
    reused_ids: int | None = Field(
        default=None,
        description="ids read at more than one event time: each is another event (rule 4)",
    )


class RunQueued(Run):
    coalesced: bool = Field(description="an identical queued run existed; this is its id")


class RunList(BaseModel):
    runs: list[Run]


class PartitionStallInfo(BaseModel):
    cause: str = Field(description="what failed: kafka, postgres, or error (anything else)")
    error: str
    since: str = Field(description="when the partition's first failing batch failed")
    worker: str = Field(description="host:pid of the speed worker that owns the partition")


class PartitionLag(BaseModel):
    topic: str
    partition: int
    end_offset: int | None = Field(
        description="Kafka's end offset; null if Kafka is down or gave the partition none"
    )
    applied_offset: int | None = Field(description="the speed layer's fence")
    lag: int | None
    stream_time: str | None
    stalled: PartitionStallInfo | None = Field(
        default=None, description="set while the partition's batches keep failing"
    )


class MetricWatermark(BaseModel):
    metric: str
    batch_watermark: str | None
    age_s: float | None = Field(description="now - W, in seconds")
    served_version: str | None
    configured_version: str


class StatusResponse(BaseModel):
    speed_status: SpeedStatus
    generation: int | None = Field(
        description="the served generation, as queries read it (from the read replica when "
        "`serving.batch_view_url` is set)"
    )
    published_at: str | None
    replica_lag_s: float | None = Field(
        default=None,
        description="how far the read replica replays behind the primary (0: it has replayed "
        "all it received); null when the batch view is read from the primary",
    )
    partitions: list[PartitionLag]
    metrics: list[MetricWatermark]
    runs: list[Run]
    batch_error: str | None = Field(
        default=None, description="the error of the newest finished run, when it failed"
    )
    kafka: str
    postgres: str


class Health(BaseModel):
    status: str


class Ready(BaseModel):
    ready: bool
    checks: dict[str, str]


class SqlRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    query: str = Field(
        max_length=100_000,
        description="one SELECT over a metric's table (docs/sql.md), e.g. SELECT "
        "time_bucket('1h', ts) AS hour, COUNT(*) FROM views_by_page WHERE ts >= "
        "'2026-12-01T00:00:00Z' AND ts < '2026-12-02T00:00:00Z' GROUP BY 1",
    )
    format: Literal["objects", "arrays"] = Field(
        default="objects", description="rows as objects by column name, or as arrays"
    )


class SqlColumn(BaseModel):
    name: str
    type: Literal["timestamptz", "text", "bigint", "double precision"]


class SqlResponse(BaseModel):
    columns: list[SqlColumn]
    rows: list[dict[str, str | Number | None]] | list[list[str | Number | None]]
    metric: str
    batch_watermark: str | None
    batch_status: BatchStatus
    speed_status: SpeedStatus
