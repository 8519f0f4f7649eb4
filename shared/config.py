"""One typed settings object: the YAML file (`LAMBDA_CONFIG`, default `lambda.yaml`) plus
environment overrides (`LAMBDA_` prefix, `__` for nesting), validated with messages that name
the bad field and say what is allowed."""

from __future__ import annotations

import itertools
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Literal

import orjson
from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    SecretStr,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic_settings import (
    BaseSettings,
    InitSettingsSource,
    NoDecode,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
)

from shared.aggregations import check_aggregations, parse_aggregation
from shared.config_file import ConfigFile, KeyPath, dotted
from shared.cron import Schedule
from shared.durations import format_duration, parse_duration
from shared.errors import ConfigError

if TYPE_CHECKING:
    from shared.metric_plan import MetricPlan

Duration = Annotated[int, BeforeValidator(parse_duration)]
"""A duration in milliseconds, written in the YAML as `30s`, `1m`, `1h` or `1d`."""

RESERVED_DIMENSIONS = frozenset(
    {"window", "start", "end", "at", "by", "n", "limit", "prefix", "group_by", "step", "tz", "q"}
)
"""Query parameter names (the query API's own and those slicing queries take)."""
_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_\-]{0,62}")
_FIELD = re.compile(r"[^\s]{1,128}")
_COMPUTED = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,127}")


def _pairs(value: object) -> object:
    """A YAML mapping of computed fields as (name, expression) pairs, sorted by name: their
    order means nothing (each is evaluated after the fields it reads), so it changes neither
    the metric's version nor anything else. Every expression must be text."""
    if isinstance(value, Mapping):
        for name, text in value.items():
            if not isinstance(text, str):
                raise ValueError(f'fields.{name}: write the expression as text, e.g. "a * 100"')
        return tuple(sorted(value.items()))
    return value


def _retention_pairs(value: object) -> object:
    """A YAML mapping of window -> how long its cells are kept (`{1m: 7d, 1h: 400d}`) as
    (window ms, retention ms) pairs, by window."""
    if isinstance(value, Mapping):
        pairs = []
        for window, kept in value.items():
            try:
                pairs.append((parse_duration(window), parse_duration(kept)))
            except ValueError as exc:
                raise ValueError(f"retention.{window}: {exc}") from None
        return tuple(sorted(pairs))
    return value


def _kept_text(retention: int | None) -> str:
    return "forever" if retention is None else format_duration(retention)


def _check_name(value: str, what: str) -> str:
    if not _NAME.fullmatch(value):
        raise ValueError(
            f"{what} {value!r} must start with a letter and use only letters, digits, '_' or '-'"
        )
    return value


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class SourceConfig(_Strict):
    """A Kafka topic of JSON events."""

    name: str
    topic: str
    time_field: str
    id_field: str | None = None
    partitions: int = Field(default=4, ge=1, le=1024)
    max_future: Duration = parse_duration("5m")
    dedup_horizon: Duration | None = None
    """How long an id is remembered, in stream time (rule 4 in docs/semantics.md, "The de-dup
    horizon"): per partition, until the stream time has passed the event time of the copy that
    counted by more than this; a copy whose id is no longer remembered counts again. Unset:
    every id forever, across partitions."""

    @field_validator("name", "topic")
    @classmethod
    def _valid_name(cls, value: str) -> str:
        return _check_name(value, "source name/topic")

    @model_validator(mode="after")
    def _horizon_needs_ids(self) -> SourceConfig:
        if self.dedup_horizon is not None:
            if self.id_field is None:
                raise ValueError(
                    f"source {self.name!r}: dedup_horizon needs an id_field (it says how long "
                    "ids are remembered); set id_field or remove dedup_horizon"
                )
            if self.dedup_horizon <= 0:
                raise ValueError(f"source {self.name!r}: dedup_horizon must be positive")
        return self

    @property
    def dlq_topic(self) -> str:
        return f"{self.topic}.dlq"

    @property
    def late_topic(self) -> str:
        return f"{self.topic}.late"


class TableConfig(_Strict):
    """A keyed, versioned lookup table: a Kafka topic of JSON records, each a version of its
    key's row valid from its time (rule 11 in docs/semantics.md). Kept forever, like a source:
    its history is part of the master dataset."""

    name: str
    topic: str
    key_field: str
    """The field holding a record's key (text or integer; compared by its text)."""
    time_field: str | None = None
    """The field a version is valid from (epoch ms or RFC 3339); unset: the record's
    timestamp."""
    partitions: int = Field(default=1, ge=1, le=1024)

    @field_validator("name", "topic")
    @classmethod
    def _valid_name(cls, value: str) -> str:
        return _check_name(value, "table name/topic")

    @field_validator("key_field", "time_field")
    @classmethod
    def _valid_field(cls, value: str | None) -> str | None:
        if value is not None and not _FIELD.fullmatch(value):
            raise ValueError(f"field name {value!r} must be non-empty with no spaces")
        return value

    @property
    def dlq_topic(self) -> str:
        return f"{self.topic}.dlq"


class LookupConfig(_Strict):
    """An as-of join of a metric's events with a table (rule 11): `as` names the matched
    version, whose fields the metric reads as `<as>.<field>`."""

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    table: str
    on: str
    """The event's join key: a field or an expression over the event's fields."""
    alias: str = Field(alias="as")

    @field_validator("alias")
    @classmethod
    def _valid_alias(cls, value: str) -> str:
        if not _COMPUTED.fullmatch(value):
            raise ValueError(
                f"lookup name (as) {value!r} must be a letter or '_' followed by letters, "
                "digits or '_'"
            )
        return value

    @field_validator("on")
    @classmethod
    def _valid_on(cls, on: str) -> str:
        from shared.expressions import compile_definitions

        compile_definitions(None, {"on": on}, None)
        return on


class SessionConfig(_Strict):
    """How a session metric cuts each key's events into sessions (rule 13 in
    docs/semantics.md): at a pause of `gap` or more, and at `max_duration` after a session's
    first event."""

    gap: Duration
    max_duration: Duration

    @model_validator(mode="after")
    def _gap_shorter(self) -> SessionConfig:
        if self.gap <= 0:
            raise ValueError("session gap must be a positive duration, e.g. 30m")
        if self.gap >= self.max_duration:
            raise ValueError(
                f"session gap {format_duration(self.gap)} must be shorter than max_duration "
                f"{format_duration(self.max_duration)}: a session is cut at max_duration "
                "anyway, so a longer gap would never end one"
            )
        return self


class MetricConfig(_Strict):
    """A windowed aggregate over one source, keyed by zero or more dimensions."""

    name: str
    source: str
    lookups: tuple[LookupConfig, ...] = ()
    """Tables joined to each event as of its time (rule 11), before `fields` and `where`."""
    fields: Annotated[tuple[tuple[str, str], ...], BeforeValidator(_pairs)] = ()
    """Computed fields: (name, SQL expression) by name; the YAML writes a mapping (rule 10 in
    docs/semantics.md)."""
    where: str | None = None
    """A condition (rule 10): the metric counts an event only when it is TRUE."""
    key: tuple[str, ...] = ()
    value: str | None = None
    aggregations: tuple[str, ...] = ("count",)
    windows: tuple[Duration, ...]
    grace: Duration = 0
    rollups: tuple[tuple[str, ...], ...] = ()
    """Subsets of `key` both layers pre-aggregate like the full key (`[]`: the total), so a
    query merging over the other dimensions reads few cells; normalized to key order."""
    session: SessionConfig | None = None
    """Set for a session metric (rule 13): `key` is the session key and `windows` bucket the
    sessions by their first event."""
    retention: Annotated[tuple[tuple[int, int], ...], BeforeValidator(_retention_pairs)] = ()
    """How long each window's cells are kept, counted back from the metric's W (rule 14 in
    docs/semantics.md): (window ms, retention ms) pairs by window; the YAML writes a mapping
    (`{1m: 7d, 1h: 400d}`). A window without one is kept forever. Not part of the version."""

    @field_validator("name")
    @classmethod
    def _valid_name(cls, value: str) -> str:
        return _check_name(value, "metric name")

    @field_validator("lookups")
    @classmethod
    def _valid_lookups(cls, lookups: tuple[LookupConfig, ...]) -> tuple[LookupConfig, ...]:
        aliases = [lookup.alias for lookup in lookups]
        if len(set(aliases)) != len(aliases):
            raise ValueError(f"lookup names (as) must be distinct: {aliases}")
        return lookups

    @field_validator("fields")
    @classmethod
    def _valid_fields(
        cls, fields: tuple[tuple[str, str], ...], info: ValidationInfo
    ) -> tuple[tuple[str, str], ...]:
        for name, _ in fields:
            if not _COMPUTED.fullmatch(name) or name in RESERVED_DIMENSIONS:
                raise ValueError(
                    f"computed field name {name!r} must be a letter or '_' followed by letters, "
                    "digits or '_', and not a query parameter "
                    f"({', '.join(sorted(RESERVED_DIMENSIONS))})"
                )
        _compile_named(info, None, dict(fields))
        return fields

    @field_validator("where")
    @classmethod
    def _valid_where(cls, where: str | None, info: ValidationInfo) -> str | None:
        if where is not None:
            _compile_named(info, where, dict(info.data.get("fields", ())))
        return where

    @field_validator("key")
    @classmethod
    def _valid_key(cls, dims: tuple[str, ...]) -> tuple[str, ...]:
        for dim in dims:
            if dim in RESERVED_DIMENSIONS:
                raise ValueError(
                    f"dimension name {dim!r} is reserved (it is a query parameter); rename it. "
                    f"Reserved: {', '.join(sorted(RESERVED_DIMENSIONS))}"
                )
            if not _FIELD.fullmatch(dim):
                raise ValueError(f"dimension name {dim!r} must be non-empty with no spaces")
        if len(set(dims)) != len(dims):
            raise ValueError("key dimensions must be distinct")
        return dims

    @field_validator("rollups")
    @classmethod
    def _valid_rollups(
        cls, rollups: tuple[tuple[str, ...], ...], info: ValidationInfo
    ) -> tuple[tuple[str, ...], ...]:
        key: tuple[str, ...] = info.data.get("key", ())
        normalized: list[tuple[str, ...]] = []
        for dims in rollups:
            if len(set(dims)) != len(dims) or any(d not in key for d in dims):
                raise ValueError(
                    f"rollup {list(dims)} must list distinct dimensions of the key {list(key)}"
                )
            ordered = tuple(d for d in key if d in dims)
            if len(ordered) == len(key):
                raise ValueError(
                    f"rollup {list(dims)} is the whole key, which is always stored; drop it"
                )
            if ordered in normalized:
                raise ValueError(f"rollup {list(dims)} is listed twice")
            normalized.append(ordered)
        return tuple(normalized)

    @field_validator("aggregations")
    @classmethod
    def _valid_aggregations(cls, aggs: tuple[str, ...]) -> tuple[str, ...]:
        if not aggs:
            raise ValueError("list at least one aggregation")
        check_aggregations([parse_aggregation(agg) for agg in aggs])
        return aggs

    @field_validator("windows")
    @classmethod
    def _valid_windows(cls, windows: tuple[int, ...]) -> tuple[int, ...]:
        if not windows:
            raise ValueError("list at least one window, e.g. [1m, 1h]")
        if any(w <= 0 for w in windows):
            raise ValueError("windows must be positive durations")
        base = min(windows)
        for window in windows:
            if window % base:
                raise ValueError(
                    f"window {format_duration(window)} is not a multiple of the smallest window "
                    f"{format_duration(base)}; every window must be a multiple of it"
                )
        if len(set(windows)) != len(windows):
            raise ValueError("windows must not repeat")
        return tuple(sorted(windows))

    @model_validator(mode="after")
    def _valid_retention(self) -> MetricConfig:
        kept = dict(self.retention)
        for window, retention in self.retention:
            if window not in self.windows:
                windows = ", ".join(map(format_duration, self.windows))
                raise ValueError(
                    f"retention names window {format_duration(window)}, which is not one of "
                    f"the metric's windows ({windows})"
                )
            if retention < window:
                raise ValueError(
                    f"retention of window {format_duration(window)} is "
                    f"{format_duration(retention)}, less than one window; keep at least one"
                )
        base = min(self.windows, default=0)
        base_kept = kept.get(base)
        session = self.session
        if session is not None and base_kept is not None and base_kept < session.max_duration:
            raise ValueError(
                f"a session metric keeps its base window {format_duration(base)} at least "
                f"max_duration ({format_duration(session.max_duration)}), not "
                f"{format_duration(base_kept)}: each key continues from its last session "
                "starting up to max_duration before W"
            )
        for finer, coarser in itertools.pairwise(self.windows):
            short, long = kept.get(finer), kept.get(coarser)
            shorter = long is not None and (short is None or long < short)
            if shorter:
                raise ValueError(
                    f"window {format_duration(coarser)} must be kept at least as long as the "
                    f"finer {format_duration(finer)} ({_kept_text(long)} < {_kept_text(short)}): "
                    "a coarser window is what answers once a finer one's cells are gone"
                )
        return self

    @model_validator(mode="after")
    def _session_key(self) -> MetricConfig:
        if self.session is not None and not self.key:
            raise ValueError(
                "a session metric needs a key: the session key whose events form sessions, "
                "e.g. key: [user_id]"
            )
        if self.session is not None and () in self.rollups:
            raise ValueError(
                "rollup [] is always kept for a session metric (its total per bucket); drop it"
            )
        return self

    @model_validator(mode="after")
    def _inputs_not_always_null(self) -> MetricConfig:
        """A computed field read as a key dimension, the value or a sketch's field that is
        NULL for every event would have every event skipped (rule 10): refused, as a `where`
        that is never TRUE is."""
        from shared.expressions import compile_definitions, null_fields

        nulls = null_fields(compile_definitions(None, dict(self.fields), None))
        if not nulls:
            return self
        sketched = [a for a in map(parse_aggregation, self.aggregations) if a.field]
        inputs = [
            *((dim, "a key dimension", "key") for dim in self.key),
            *(() if self.value is None else [(self.value, "its value", "value")]),
            *((a.field, f"the field of {a.spec}", a.skip_reason) for a in sketched),
        ]
        for name, role, reason in inputs:
            if name in nulls:
                raise ValueError(
                    f"metric {self.name!r}: fields.{name} is NULL for every event "
                    f"({nulls[name]}), and the metric reads it as {role}: every event would be "
                    f"skipped as {reason}_missing; fix the expression or read another field"
                )
        return self

    @model_validator(mode="after")
    def _value_needed(self) -> MetricConfig:
        needs = [a.spec for a in map(parse_aggregation, self.aggregations) if a.needs_value]
        if needs and self.value is None:
            raise ValueError(
                f"aggregations {sorted(needs)} need a numeric `value` field; set `value:` "
                "or keep only count, distinct(<field>) and quantiles(<field>)"
            )
        return self


KafkaSecurityProtocol = Literal["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"]
SaslMechanism = Literal["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"]


class KafkaSettings(_Strict):
    """The cluster and how every client of the platform reaches it (librdkafka's names, with
    `_` for `.`); `shared.kafka` turns them into each client library's settings. The local
    stack is PLAINTEXT."""

    bootstrap_servers: str = "127.0.0.1:9092"
    security_protocol: KafkaSecurityProtocol = "PLAINTEXT"
    sasl_mechanism: SaslMechanism | None = None
    sasl_username: str | None = None
    sasl_password: SecretStr | None = None
    ssl_ca_location: str | None = None
    """CA certificates (PEM) the brokers' certificates are checked against; unset: the
    system's."""
    ssl_certificate_location: str | None = None
    """The client's certificate (PEM), for brokers that authenticate clients by TLS."""
    ssl_key_location: str | None = None
    ssl_key_password: SecretStr | None = None

    @model_validator(mode="after")
    def _security_complete(self) -> KafkaSettings:
        """A SASL or TLS setting the protocol would not use is a mistake that silently sends
        plain text, and SASL without credentials fails only at the first connection."""
        sasl = self.security_protocol.startswith("SASL_")
        tls = self.security_protocol.endswith("SSL")
        sasl_fields = ("sasl_mechanism", "sasl_username", "sasl_password")
        tls_fields = (
            "ssl_ca_location",
            "ssl_certificate_location",
            "ssl_key_location",
            "ssl_key_password",
        )
        missing = [f for f in sasl_fields if sasl and getattr(self, f) is None]
        if missing:
            raise ValueError(
                f"security_protocol {self.security_protocol} needs {', '.join(missing)}: set "
                + ", ".join(f"LAMBDA_KAFKA__{f.upper()}" for f in missing)
                + " (sasl_mechanism: PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512)"
            )
        unused = [f for f in sasl_fields if not sasl and getattr(self, f) is not None]
        unused += [f for f in tls_fields if not tls and getattr(self, f) is not None]
        if unused:
            raise ValueError(
                f"{', '.join(unused)} set, but security_protocol {self.security_protocol} does "
                "not use them; set LAMBDA_KAFKA__SECURITY_PROTOCOL to SSL, SASL_PLAINTEXT or "
                "SASL_SSL as the cluster expects, or drop them"
            )
        if (self.ssl_certificate_location is None) != (self.ssl_key_location is None):
            raise ValueError(
                "ssl_certificate_location and ssl_key_location go together (the client's "
                "certificate and its private key); set both or neither"
            )
        return self


class RedisSettings(_Strict):
    url: str = "redis://127.0.0.1:6379/0"
    """Every Redis client is built from this URL alone, so TLS goes in it too: `rediss://`,
    with redis-py's `ssl_ca_certs`, `ssl_certfile`, `ssl_keyfile` and `ssl_cert_reqs`
    query parameters (README, Security)."""
    cluster: bool = False
    """The URL names one node of a Redis Cluster: clients discover the others and route each
    key by its hash slot (every key of one source partition shares a slot; see
    `shared.speed_view.keys`). A cluster has only database 0."""


class PostgresSettings(_Strict):
    url: str = "postgresql://lambda:lambda@127.0.0.1:5432/lambda"
    """A libpq URL, used as it is by every connection: TLS is its `sslmode`,
    `sslrootcert`, `sslcert` and `sslkey` parameters (README, Security)."""


class SparkSettings(_Strict):
    master: str = "local[2]"
    driver_memory: str = "2g"
    shuffle_partitions: int = Field(default=8, ge=1)
    max_offsets_per_slice: int = Field(default=1_000_000, ge=1)
    """At most this many offsets per Spark input partition (a read task): a partition's range
    is cut into equal slices, so a big partition keeps every core busy and a failed task
    re-reads little."""
    conf: dict[str, str] = Field(default_factory=dict)
    """Extra Spark properties, e.g. `spark.executor.memory` for a cluster."""
    fast_path: bool = True
    """Decode Kafka records with `pyarrow.json` where it agrees with the shared parser."""
    broadcast_table_records: int = Field(default=1_000_000, ge=0)
    """A joined table with at most this many records (offsets) in the run's snapshot is
    gathered in the driver and sent whole to every task (a broadcast join: the events are not
    shuffled); a bigger one is joined by sorting both sides by key, never through the driver
    (rule 11). The bound counts records, not bytes: for a table whose records carry wide
    fields the metrics read, lower it so that the broadcast fits the driver's memory and
    `spark.driver.maxResultSize`."""


class BatchConfig(_Strict):
    schedule: str = "hourly"
    max_attempts: int = Field(default=3, ge=1)
    """Attempts of a run before the runner gives up on it (retries are queued with backoff)."""
    retry_backoff_s: float = Field(default=30.0, ge=0)
    """Delay before the first retry; doubled for every further attempt."""
    heartbeat_s: float = Field(default=2.0, gt=0)
    poll_s: float = Field(default=2.0, gt=0)
    """How often an idle runner looks for queued runs (and waits for the runner lock)."""
    outage_backoff_s: float = Field(default=1.0, gt=0)
    """First wait of the runner after PostgreSQL became unreachable; doubled after every
    failed reconnection up to `outage_backoff_max_s`. The runner never exits for an outage:
    it reconnects, fails the run the outage interrupted (retried per `max_attempts`) and
    executes the queued runs again."""
    outage_backoff_max_s: float = Field(default=10.0, gt=0)
    """The longest wait between two reconnection attempts of the runner."""
    nice: int = Field(default=10, ge=0, le=19)
    """The CPU niceness `lambdactl batch runner` takes at start; its Spark driver JVM and
    Spark's Python workers inherit it (executors of a `spark://` cluster do not), and a run
    gives it to the PostgreSQL backend of its connection when the server runs on the same
    host (`batch_layer.job.nice_local_backend`). A run is a
    background recompute: where it shares cores with the speed and serving layers it should
    take the CPU they leave, not their share. 0 keeps the priority the runner was started
    with; a runner started nicer stays so."""
    max_queued_runs: int = Field(default=10, ge=1)
    """When this many runs of a mode are queued, an operator's request for another (API: 429,
    `lambdactl batch run`: exit 1) is refused until the runner starts one or one is
    cancelled: one runner executes runs one at a time, each for minutes, so an unbounded
    queue is a backlog of hours any client can grow. A request identical to a queued one
    coalesces and is never refused. The runner's own runs (the schedule's incremental run, the
    full run of changed definitions, retries) are never refused, so none is lost; they add at
    most one: a retry takes the place of the run that failed."""
    max_range_days: int = Field(default=366, ge=1)
    """The widest `[start, end)` a range run may ask for. A range run reads the whole log up
    to the served snapshot whatever its range, and replaces the served cells of its range in
    place, in one transaction: a wider recompute is a full run's work, which a full run does
    better (a new generation, flipped atomically)."""

    @field_validator("schedule")
    @classmethod
    def _valid_schedule(cls, value: str) -> str:
        Schedule(value)
        return value


class SpeedSettings(_Strict):
    app_id: str = "lambda-speed"
    """The Faust app id, which is also the Kafka consumer group of the workers."""
    watermark_refresh_s: float = Field(default=2.0, gt=0)
    session_timeout_s: float = Field(default=10.0, gt=0)
    cleanup_delay_s: float = Field(default=60.0, ge=0)
    ttl_days: int = Field(default=7, ge=7)
    cleanup_interval_s: float = Field(default=10.0, gt=0)
    """How often a worker deletes its partitions' cells at or before a served W and its
    de-dup id sets that are late for every metric (rule 8)."""
    max_poll_records: int = Field(default=20_000, ge=1)
    """Records per fetch across the worker's partitions (one Redis apply per partition)."""
    max_partition_fetch_bytes: int = Field(default=4 * 1024 * 1024, ge=1024)
    metrics_port: int = Field(default=0, ge=0, le=65535)
    """Port of the worker's Prometheus `/metrics` endpoint; 0 = off."""
    rebalance_timeout_s: float = Field(default=20.0, gt=0)
    """How long the group coordinator waits for members to rejoin in a rebalance."""
    gil_switch_interval_s: float = Field(default=0.0005, gt=0)
    """`sys.setswitchinterval` of a worker: Faust's Kafka client runs in its own thread, and a
    shorter interval hands the GIL back to it sooner after each socket call."""
    outage_backoff_s: float = Field(default=0.5, gt=0)
    """First wait of a worker after a store failed (Redis: a batch not applied, or a fence
    not read; PostgreSQL: W not refreshed; Kafka: dead letters or late events not
    published); doubled after every further failure up to `outage_backoff_max_s`. The worker
    keeps its partitions, commits nothing it has not applied, and resumes from its fences."""
    outage_backoff_max_s: float = Field(default=10.0, gt=0)
    """The longest wait between two attempts while a store is down."""
    redis_timeout_s: float = Field(default=10.0, gt=0)
    """Socket timeout of the worker's Redis calls (connecting: at most 2 s), so an
    unreachable Redis fails a batch instead of hanging the worker."""


def _token_list(value: object) -> object:
    """Tokens from the environment may be a JSON list or comma-separated text."""
    if isinstance(value, str):
        text = value.strip()
        if text.startswith("["):
            return orjson.loads(text)
        return tuple(t.strip() for t in text.split(",") if t.strip())
    return value


TokenList = Annotated[tuple[SecretStr, ...], NoDecode, BeforeValidator(_token_list)]
"""Secrets: `repr`, `str` and JSON dumps of the settings show `**********`, never a token."""


class AuthSettings(_Strict):
    """Bearer tokens. With none configured the API is open: the local default; any other
    profile refuses to serve open unless `allow_open` says so (`serving_layer.auth`)."""

    reader_tokens: TokenList = ()
    operator_tokens: TokenList = ()
    allow_open: bool = False

    @property
    def enabled(self) -> bool:
        return bool(self.reader_tokens or self.operator_tokens)


class ServingSettings(_Strict):
    host: str = "127.0.0.1"
    port: int = 8000
    workers: int = Field(default=1, ge=1, le=64)
    """API processes sharing the port (`lambdactl serve`); one process saturates a core.
    Each keeps its own caches, valid per served row, so they answer identically."""
    max_cells: int = Field(default=50_000, ge=1)
    """The most base cells one request may touch (series, top, keys); beyond it a 400."""
    max_top_n: int = Field(default=1000, ge=1)
    max_keys_limit: int = Field(default=1000, ge=1)
    max_groups: int = Field(default=10_000, ge=1)
    """The most groups a `group_by` series may ask for (`limit`)."""
    kafka_timeout_s: float = Field(default=2.0, gt=0)
    """How long `/v1/status` and `/readyz` wait for Kafka before reporting it unreachable."""
    cache_points: int = Field(default=150_000, ge=0)
    """Batch-side series points kept per app, valid for one served row (~500 bytes each)."""
    speed_cache_bytes: int = Field(default=64 << 20, ge=0)
    """Speed-side points kept per app, keyed by the exact sub-cell states they merge."""
    live_cells_cache_bytes: int = Field(default=32 << 20, ge=0)
    """Stored cells of windows reaching past W kept per app, valid for one served row: the
    batch part of a window straddling W (or of `top` over one) is read once per publication,
    not per request."""
    pg_reconnect_timeout_s: float = Field(default=5.0, gt=0)
    """How long the API's PostgreSQL pools retry (1 s, doubling) to replace a lost connection
    before giving it up; a request that then finds no connection starts a fresh attempt, so
    after an outage the API reconnects within about half of this, not after a backoff grown
    during the outage."""
    max_body_bytes: int = Field(default=64 * 1024, ge=1)
    """The largest request body (Content-Length or streamed); beyond it a 413. Run requests
    are a few dozen bytes."""
    max_url_bytes: int = Field(default=8 * 1024, ge=256)
    """The longest request target (path and query string); beyond it a 414."""
    max_param_chars: int = Field(default=1024, ge=1)
    """The longest query parameter value (a dimension value, `prefix`, `group_by`...);
    beyond it a 400."""
    max_headers: int = Field(default=100, ge=1)
    """The most header fields one request may carry; beyond it a 431. uvicorn's httptools
    parser (what `lambdactl serve` runs) bounds neither their number nor their size."""
    max_header_bytes: int = Field(default=16 * 1024, ge=1024)
    """The most bytes of header names and values one request may carry (cookies and a token
    take a few KiB); beyond it a 431. The server has read them by then: a proxy in front
    bounds what reaches it."""
    request_timeout_s: float = Field(default=10.0, gt=0)
    """Each request's time budget, until its response starts; past it a 503 with
    `Retry-After`. An async query is cancelled at its next await; a sync (operator) route's
    thread cannot be and runs to its end, its answer dropped. Health, readiness and
    `/metrics` are exempt."""
    max_inflight_requests: int = Field(default=64, ge=1)
    """Requests one API process works on at once (work a timeout left running included); any
    more are answered 503 with `Retry-After` at once instead of queueing behind them, so an
    overload shows as refusals, not as every client's time-out. Health, readiness and
    `/metrics` are exempt."""
    served_refresh_s: float = Field(default=5.0, gt=0)
    """How often each API process re-reads the served row it holds besides on each
    announcement of a publication (`LISTEN lp_served`): the safety net for a lost one. A
    request plans against the held row instead of reading it while the statement that read
    it was sent less than twice this ago and less than half of `speed.cleanup_delay_s`."""
    served_row_confirm: bool = True
    """Whether a request confirms the served row its process holds with one `SELECT 1` on
    the `LISTEN` connection, shared by the requests arriving meanwhile, so that its answer
    reflects every publication committed before it arrived. Off: no round trip at all, and
    an answer may lag a publication by its announcement's delivery (microseconds to a few
    milliseconds)."""
    pg_port: int | None = Field(default=None, ge=1, le=65535)
    """The port each API process answers SQL on in the PostgreSQL wire protocol (psql, BI
    tools), on `host`; unset: off. With tokens configured a client sends one as its password
    (any user name); the protocol runs without TLS, so beyond `127.0.0.1` put a
    TLS-terminating proxy in front (docs/sql.md)."""
    max_pg_connections: int = Field(default=64, ge=1)
    """Wire-protocol connections one API process holds at once; any more are refused with
    SQLSTATE 53300 (too_many_connections) at once."""
    batch_view_url: str | None = None
    """A libpq URL of a PostgreSQL streaming replica of `postgres.url` to read the batch view
    from (queries, `/v1/status`'s W, and the speed layer's reads of the served row); the
    batch runner and the run routes keep the primary. Unset: the primary
    (docs/operations.md, "A read replica for the batch view")."""


class StackSettings(_Strict):
    data_dir: Path = Path(".lambda")


class Settings(BaseSettings):
    """Everything the platform is configured by; build it with `load_settings()`."""

    model_config = SettingsConfigDict(
        env_prefix="LAMBDA_", env_nested_delimiter="__", extra="forbid", frozen=True
    )

    profile: Literal["local", "production"] = "local"
    """`local`: the laptop stack, open API allowed. Anything else is a deployment, where the
    API refuses to start without tokens unless `auth.allow_open` is set."""
    sources: tuple[SourceConfig, ...] = ()
    tables: tuple[TableConfig, ...] = ()
    metrics: tuple[MetricConfig, ...] = ()
    batch: BatchConfig = BatchConfig()
    kafka: KafkaSettings = KafkaSettings()
    redis: RedisSettings = RedisSettings()
    postgres: PostgresSettings = PostgresSettings()
    spark: SparkSettings = SparkSettings()
    speed: SpeedSettings = SpeedSettings()
    auth: AuthSettings = AuthSettings()
    serving: ServingSettings = ServingSettings()
    stack: StackSettings = StackSettings()

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        return (init_settings, env_settings, _YamlFileSource(settings_cls, _config_path()))

    @model_validator(mode="after")
    def _cross_checks(self) -> Settings:
        names = [s.name for s in self.sources]
        if len(set(names)) != len(names):
            raise ValueError("source names must be unique")
        tables = [t.name for t in self.tables]
        if len(set(tables)) != len(tables):
            raise ValueError("table names must be unique")
        topics = [s.topic for s in self.sources] + [t.topic for t in self.tables]
        if len(set(topics)) != len(topics):
            raise ValueError("every source and table needs a topic of its own")
        metric_names = [m.name for m in self.metrics]
        if len(set(metric_names)) != len(metric_names):
            raise ValueError("metric names must be unique")
        for metric in self.metrics:
            if metric.source not in names:
                raise ValueError(
                    f"metric {metric.name!r} names source {metric.source!r}, which is not "
                    f"configured; configured sources: {names or 'none'}"
                )
            for lookup in metric.lookups:
                if lookup.table not in tables:
                    raise ValueError(
                        f"metric {metric.name!r}: lookup {lookup.alias!r} names table "
                        f"{lookup.table!r}, which is not configured; configured tables: "
                        f"{tables or 'none'}"
                    )
            _check_expressions(metric, self.source(metric.source))
            _check_horizon(metric, self.source(metric.source))
        if any(m.lookups for m in self.metrics):
            from shared.metric_plan import compile_plan

            for metric in self.metrics:  # what only the plan sees: what lookups read
                try:
                    compile_plan(metric, self.source(metric.source), self.tables)
                except ValueError as exc:
                    raise ValueError(f"metric {metric.name!r}: {exc}") from None
        return self

    def table(self, name: str) -> TableConfig:
        return next(t for t in self.tables if t.name == name)

    def source(self, name: str) -> SourceConfig:
        return next(s for s in self.sources if s.name == name)

    def metric(self, name: str) -> MetricConfig | None:
        return next((m for m in self.metrics if m.name == name), None)

    @property
    def plans(self) -> Mapping[str, MetricPlan]:
        """Every metric compiled once (`shared.metric_plan`), by name in configured order.
        Imported here: the plan module builds on this one."""
        from shared.metric_plan import compile_plans

        return compile_plans(self.sources, self.metrics, self.tables)

    def plan(self, name: str) -> MetricPlan | None:
        return self.plans.get(name)

    @property
    def batch_view_url(self) -> str:
        """Where the batch view is read (`serving.batch_view_url`, else the primary): every
        reader of the served row and its cells uses this one, so the speed layer's cleanup
        waits on the W the API serves (rule 8 in docs/semantics.md)."""
        return self.serving.batch_view_url or self.postgres.url

    def plans_of(self, source: SourceConfig) -> tuple[MetricPlan, ...]:
        return tuple(p for p in self.plans.values() if p.source.name == source.name)


def _compile_named(info: ValidationInfo, where: str | None, fields: Mapping[str, str]) -> None:
    """`compile_definitions` without the source (`_check_expressions` compiles again with
    it), its error naming the metric: the error's location names it by index
    (`metrics.0.where`)."""
    from shared.expressions import compile_definitions

    try:
        compile_definitions(where, fields, None)
    except ValueError as exc:
        name = info.data.get("name")
        if name is None:
            raise
        raise ValueError(f"metric {name!r}: {exc}") from None


def _check_horizon(metric: MetricConfig, source: SourceConfig) -> None:
    """A de-dup horizon at least as long as the time a metric's speed cells stay open: then
    every copy the horizon lets count again is late for the speed layer, and both layers
    agree on every copy they count (rule 4 in docs/semantics.md)."""
    horizon = source.dedup_horizon
    if horizon is None:
        return
    needed = min(metric.windows) + metric.grace
    if horizon < needed:
        raise ValueError(
            f"metric {metric.name!r}: its source's dedup_horizon ({format_duration(horizon)}) "
            f"is shorter than its base window plus grace ({format_duration(needed)}): a copy "
            "the horizon lets count again must be late for the speed layer; raise "
            "dedup_horizon to at least that"
        )


def _check_expressions(metric: MetricConfig, source: SourceConfig) -> None:
    """What a metric's expressions can only be checked against with its source: the time field
    is the event time there (a BIGINT), and no computed field or lookup may take its name."""
    from shared.expressions import compile_definitions

    fields = dict(metric.fields)
    if source.time_field in fields:
        raise ValueError(
            f"metric {metric.name!r}: fields.{source.time_field}: the source's time field "
            "already has that name (the event time); name the computed field differently"
        )
    for lookup in metric.lookups:
        if lookup.alias in fields or lookup.alias == source.time_field:
            raise ValueError(
                f"metric {metric.name!r}: lookup {lookup.alias!r} has the name of a computed "
                "field or of the time field; name it differently"
            )
    try:
        compile_definitions(metric.where, fields, source.time_field)
    except ValueError as exc:
        raise ValueError(f"metric {metric.name!r}: {exc}") from None


def _config_path() -> str:
    return os.environ.get("LAMBDA_CONFIG", "lambda.yaml")


class _YamlFileSource(InitSettingsSource):
    """The YAML file as a settings source, read with `ConfigLoader` (pydantic-settings' own
    YAML source uses `yaml.safe_load`). A missing file adds nothing: `load_settings` refuses
    a LAMBDA_CONFIG that names none, and without LAMBDA_CONFIG the defaults apply."""

    def __init__(self, settings_cls: type[BaseSettings], path: str) -> None:
        data = ConfigFile.read(path).data if Path(path).is_file() else {}
        super().__init__(settings_cls, data)


def load_settings(**overrides: object) -> Settings:
    """Read the YAML file and the environment; raise ConfigError with a readable message."""
    path = os.environ.get("LAMBDA_CONFIG")
    if path is not None and not Path(path).is_file():
        raise ConfigError(f"LAMBDA_CONFIG={path!r} does not exist; point it at the YAML config")
    try:
        settings = Settings(**overrides)  # type: ignore[arg-type]
    except ValidationError as exc:
        file = ConfigFile.read(_config_path()) if Path(_config_path()).is_file() else None
        raise ConfigError(describe_validation_error(exc, file, overrides)) from exc
    return settings


def describe_validation_error(
    exc: ValidationError, file: ConfigFile | None = None, overrides: Mapping[str, object] = {}
) -> str:
    """One line per error, naming where the bad value was written: `<file>:<line>:` when it
    comes from the file, the variable when it comes from the environment."""
    lines = ["invalid configuration:"]
    for err in exc.errors():
        loc = err["loc"]
        where = dotted(loc)
        variable = _env_variable(loc)
        if variable is not None:
            where = f"{where} (from {variable})"
        elif file is not None and not _given(loc, overrides) and (line := file.line_of(loc)):
            where = f"{file.path}:{line}: {where}"
        message = err["msg"].removeprefix("Value error, ")
        lines.append(f"  {where}: {message}")
    return "\n".join(lines)


def _env_variable(loc: KeyPath) -> str | None:
    """The `LAMBDA_*` variable that sets `loc` or a setting enclosing it."""
    names = {name.upper(): name for name in os.environ}
    for end in range(1, len(loc) + 1):
        name = "LAMBDA_" + "__".join(str(part) for part in loc[:end]).upper()
        if name in names:
            return names[name]
    return None


def _given(loc: KeyPath, overrides: Mapping[str, object]) -> bool:
    """Whether `loc` or a setting enclosing it was passed to `load_settings`."""
    value: object = overrides
    for part in loc:
        if not isinstance(value, Mapping):
            return True
        if part not in value:
            return False
        value = value[part]
    return bool(loc)


RunMode = Literal["incremental", "full", "range"]
