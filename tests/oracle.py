"""Brute-force reference for every layer's tests (docs/semantics.md: validity, the rules).

Written independently of the project's code on purpose: it imports nothing from `shared`,
`speed_layer`, `batch_layer`, `serving_layer` or `lambdactl`, so a bug there cannot hide in
both the system and its reference. Everything is computed exactly and slowly: every event is
kept, distinct counts are Python sets, sums are `math.fsum`, quantiles are read off the
sorted list of every value (`ExactQuantile`).

Choices the design leaves open, made here once:
- JSON is strict: the value must be UTF-8 text holding one JSON object; `NaN`/`Infinity`
  literals are not JSON, so such a record is malformed (a number too large for a double, such
  as `1e999`, is JSON and makes the value field non-finite: a metric-level skip).
- RFC 3339 follows its grammar: `T` separator, `Z` or `+hh:mm`/`-hh:mm` offset (`t` and `z` are
  accepted, as the RFC allows), no leap second `60`, 1 to 6 fractional digits.
- Any event time (integer or text) outside the years 1..9999 UTC is malformed.
- A duplicate is dropped before any metric sees it; a skipped event is counted as skipped,
  not late, for that metric. Skips are counted per metric, not per reason.
- `quantiles(f)`: the field follows the `value` rules (a finite JSON number, not a boolean; an
  integer too large for a double is invalid); the exact quantile of fraction q over a cell's n
  values is the *inclusive lower quantile*, the smallest value v with #{values <= v} >= q n
  (what DataSketches' `get_quantile(q)` estimates with inclusive ranks). A layer's answer is
  judged by rank, not value (`compare`, `ExactQuantile.accepts`): the KLL sketch bounds the
  rank error, never the value error.
- What the stores can hold is part of validity: an id or a key dimension value is at most
  1,024 bytes of UTF-8 and holds no NUL character (PostgreSQL text cannot), a key's values
  together at most 2,048 bytes (a too-long or NUL id makes the record malformed; a key, a
  skip); a value or quantile field must be smaller than 2**63 in magnitude (a skip).
- Slicing (`view`, `series_windows`, `sliced_series`, `sliced_top`, `sliced_keys`): an answer
  is recomputed from the events themselves — the base cells rule 8 takes from each side (every
  valid event before W, the non-late ones after), the keys passing the filters pooled per
  group, so a group's distinct count is that of the union of its events and its quantiles
  those of all its values. Hopping windows start at the multiples of the step (epoch, UTC);
  with a time zone, windows and steps of whole days are local days starting at local midnight,
  counted from 1970-01-01 (a DST day lasts 23 or 25 hours); other sizes ignore the zone.
- Lookups (rule 11): a table's records are those of `records` on its topic, wherever they sit
  in the list. `key_field` and `time_field` name top-level fields. A key (a tombstone's record
  key too) must be storable text, as a key dimension; a valid-from outside the years 1..9999
  (the record's timestamp included) makes the record invalid. The name `as` is bound to the
  joined version's whole JSON object (its key and time fields too). `on` is evaluated as a
  computed field over the event alone, so the source's time field reads the event time.
"""

from __future__ import annotations

import json
import math
import re
import time
import uuid
from bisect import bisect_left, bisect_right
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import date, datetime, timedelta
from decimal import Decimal, InvalidOperation
from fractions import Fraction
from typing import Any, NamedTuple
from zoneinfo import ZoneInfo

from tests import expression_duckdb

Cell = tuple[str, int, int, tuple[str, ...]]
"""(metric name, window size in ms, window start in epoch ms, canonical key values)."""

_UNITS_MS = {"s": 1_000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}
_DURATION = re.compile(r"([0-9]+)([smhd])")
_DISTINCT = re.compile(r"distinct\((.+)\)")
_QUANTILES = re.compile(r"quantiles\(\s*([^\s()]+)\s*\)")
_RFC3339 = re.compile(
    r"([0-9]{4})-([0-9]{2})-([0-9]{2})[Tt]([0-9]{2}):([0-9]{2}):([0-9]{2})"
    r"(?:\.([0-9]{1,6}))?([Zz]|[+-][0-9]{2}:[0-9]{2})"
)
_EPOCH = datetime(1970, 1, 1)
_TEXT_BYTES, _KEY_BYTES, _VALUE_BOUND = 1024, 2048, 2**63
_MIN_MS = (datetime(1, 1, 1) - _EPOCH) // timedelta(milliseconds=1)
_MAX_MS = (datetime(9999, 12, 31, 23, 59, 59, 999_000) - _EPOCH) // timedelta(milliseconds=1)
_PLAIN_AGGREGATIONS = ("count", "sum", "min", "max", "avg")

DEFAULT_QUANTILES: tuple[str, ...] = ("0.5", "0.9", "0.99")
"""The fractions a `quantiles(f)` cell renders unless asked otherwise (`p50`, `p90`, `p99`)."""
KLL_RANK_EPS = 0.0133
"""Normalized rank error allowed of a reported quantile: the a-priori single-sided error of a
DataSketches KLL sketch with k = 200 (`kll_doubles_sketch.get_normalized_rank_error(200,
False)` = 0.013295, at 99% confidence), rounded up. A sketch that has kept every item (n <= k)
is exact, so this only loosens the check for larger cells."""


@dataclass(frozen=True)
class Record:
    """One Kafka record as the oracle sees it."""

    topic: str
    partition: int
    offset: int
    create_time_ms: int
    value: bytes | None
    key: bytes | None = None
    """The Kafka key: read only for a table's tombstone (rule 11), which names its key by it."""


@dataclass
class OracleResult:
    """Cells plus the counts a layer reports (malformed, skipped, late, duplicates, and the
    invalid records of each lookup table)."""

    cells: dict[Cell, dict[str, float | int]]
    malformed: dict[str, int]
    skipped: dict[str, int]
    late: dict[str, int]
    duplicates: int
    stream_time: dict[tuple[str, int], int]
    table_malformed: dict[str, int] = field(default_factory=dict)
    """Table name -> how many of its records are invalid (join nothing); tables with none are
    left out."""


@dataclass
class _Source:
    name: str
    topic: str
    time_field: str
    id_field: str | None
    max_future_ms: int
    dedup_horizon_ms: int | None


@dataclass(frozen=True)
class _Table:
    name: str
    topic: str
    key_field: str
    time_field: str | None


@dataclass(frozen=True)
class _Lookup:
    table: str
    on: str
    alias: str


@dataclass(frozen=True)
class _Version:
    """One valid table record: a version of `key` valid from `valid_from` (rule 11)."""

    key: str
    valid_from: int
    offset: int
    partition: int
    fields: dict[str, Any] | None
    """The record's whole JSON object; None when it deletes the key."""


@dataclass
class _Metric:
    name: str
    source: str
    key: list[str]
    value: str | None
    aggregations: list[str]
    distinct_fields: list[str]
    quantile_field: str | None
    windows_ms: list[int]
    grace_ms: int
    where: str | None = None
    fields: dict[str, str] = field(default_factory=dict)
    lookups: list[_Lookup] = field(default_factory=list)
    session: tuple[int, int] | None = None
    """(gap, max_duration) of a session metric (rule 13)."""
    session_part: bool = False
    """A part of a session metric: its cells come from the metric's sessions."""

    @property
    def defined(self) -> bool:
        """Whether the inputs are read through `where`/`fields`, nested paths (rule 10) or
        lookups (rule 11)."""
        names = [*self.key, *([self.value] if self.value else []), *self.distinct_fields]
        names += [self.quantile_field] if self.quantile_field else []
        return (
            bool(self.fields)
            or self.where is not None
            or bool(self.lookups)
            or any("." in n for n in names)
        )

    @property
    def base_ms(self) -> int:
        return min(self.windows_ms)


@dataclass
class _Acc:
    count: int = 0
    values: list[float] = field(default_factory=list)
    distinct: dict[str, set[str]] = field(default_factory=dict)
    quantile_values: list[float] = field(default_factory=list)


# --------------------------------------------------------------------------- config


def parse_duration(text: str | int) -> int:
    """`30s`, `2m`, `1h`, `1d` -> milliseconds (an int is taken as milliseconds)."""
    if isinstance(text, int) and not isinstance(text, bool):
        return text
    match = _DURATION.fullmatch(str(text).strip())
    if match is None:
        raise ValueError(f"not a duration: {text!r}")
    return int(match.group(1)) * _UNITS_MS[match.group(2)]


def _sources(config: dict[str, Any]) -> dict[str, _Source]:
    return {
        s["name"]: _Source(
            name=s["name"],
            topic=s["topic"],
            time_field=s["time_field"],
            id_field=s.get("id_field"),
            max_future_ms=parse_duration(s.get("max_future", "5m")),
            dedup_horizon_ms=(
                None if s.get("dedup_horizon") is None else parse_duration(s["dedup_horizon"])
            ),
        )
        for s in config["sources"]
    }


def _tables(config: dict[str, Any]) -> dict[str, _Table]:
    return {
        t["name"]: _Table(
            name=t["name"],
            topic=t["topic"],
            key_field=t["key_field"],
            time_field=t.get("time_field"),
        )
        for t in config.get("tables") or []
    }


def _lookups(config: dict[str, Any], metric: dict[str, Any]) -> list[_Lookup]:
    tables = _tables(config)
    lookups = []
    for raw in metric.get("lookups") or []:
        lookup = _Lookup(table=raw["table"], on=raw["on"], alias=raw.get("as", raw.get("alias")))
        if lookup.table not in tables:
            raise ValueError(f"metric {metric['name']!r}: no table {lookup.table!r}")
        lookups.append(lookup)
    return lookups


def _metrics(config: dict[str, Any]) -> list[_Metric]:
    metrics = []
    for m in config["metrics"]:
        aggregations = [str(a).strip() for a in m["aggregations"]]
        distinct_fields = []
        quantile_fields = []
        for a in aggregations:
            match = _DISTINCT.fullmatch(a)
            quantiles = _QUANTILES.fullmatch(a)
            if match is not None:
                distinct_fields.append(match.group(1))
            elif quantiles is not None:
                quantile_fields.append(quantiles.group(1))
            elif a not in _PLAIN_AGGREGATIONS:
                raise ValueError(f"oracle does not know aggregation {a!r}")
            elif a != "count" and m.get("value") is None:
                raise ValueError(f"metric {m['name']!r}: {a} needs a value field")
        if len(quantile_fields) > 1:
            raise ValueError(f"metric {m['name']!r}: at most one quantiles(<field>)")
        windows = [parse_duration(w) for w in m["windows"]]
        if not windows or min(windows) <= 0:
            raise ValueError(f"metric {m['name']!r}: windows must be positive")
        metrics.append(
            _Metric(
                name=m["name"],
                source=m["source"],
                key=list(m.get("key") or []),
                value=m.get("value"),
                aggregations=aggregations,
                distinct_fields=distinct_fields,
                quantile_field=quantile_fields[0] if quantile_fields else None,
                windows_ms=windows,
                grace_ms=parse_duration(m.get("grace", "0s")),
                where=m.get("where"),
                fields=dict(m.get("fields") or {}),
                lookups=_lookups(config, m),
                session=_session(m.get("session")),
            )
        )
        if metrics[-1].session is not None:
            owners = [metrics[-1], *_session_parts(metrics[-1])]
            metrics += owners[1:]
            metrics += [replace(o, name=f"{o.name}[]", key=[], session_part=True) for o in owners]
    return metrics


def _session(session: dict[str, Any] | None) -> tuple[int, int] | None:
    if session is None:
        return None
    return parse_duration(session["gap"]), parse_duration(session["max_duration"])


def _session_parts(metric: _Metric) -> list[_Metric]:
    """A session metric's parts as the contract names them: `<m>(sessions)` (count of
    sessions; sum, max and quantiles of their durations in ms) and `<m>(bounces)` (count of
    sessions of one event), bucketed like the metric by each session's first event."""
    return [
        _Metric(
            name=f"{metric.name}(sessions)",
            source=metric.source,
            key=metric.key,
            value="duration",
            aggregations=["count", "sum", "max", "quantiles(duration)"],
            distinct_fields=[],
            quantile_field="duration",
            windows_ms=metric.windows_ms,
            grace_ms=metric.grace_ms,
            session_part=True,
        ),
        _Metric(
            name=f"{metric.name}(bounces)",
            source=metric.source,
            key=metric.key,
            value=None,
            aggregations=["count"],
            distinct_fields=[],
            quantile_field=None,
            windows_ms=metric.windows_ms,
            grace_ms=metric.grace_ms,
            session_part=True,
        ),
    ]


# --------------------------------------------------------------------------- event validity


def canonical(value: Any) -> str | None:
    """A string is itself, an integer its decimal text; anything else has no canonical form."""
    if isinstance(value, bool):
        return None
    if isinstance(value, str):
        return value
    if isinstance(value, int):
        return str(value)
    return None


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _decode(value: bytes | None) -> dict[str, Any] | None:
    if value is None:
        return None
    try:
        decoded = json.loads(value.decode("utf-8"), parse_constant=_reject_constant)
        # A string with a lone surrogate (e.g. "\\ud800") is no Unicode text: not JSON here.
        json.dumps(decoded, ensure_ascii=False).encode("utf-8")
    except (ValueError, RecursionError):
        return None
    return decoded if isinstance(decoded, dict) else None


def parse_rfc3339_ms(text: str) -> int | None:
    """Epoch ms (microseconds floored) of an RFC 3339 timestamp with offset, else None."""
    match = _RFC3339.fullmatch(text)
    if match is None:
        return None
    year, month, day, hour, minute, second = (int(match.group(i)) for i in range(1, 7))
    micro = int((match.group(7) or "").ljust(6, "0"))
    offset = match.group(8)
    offset_minutes = 0
    if offset not in ("Z", "z"):
        off_h, off_m = int(offset[1:3]), int(offset[4:6])
        if off_h > 23 or off_m > 59:
            return None
        offset_minutes = (off_h * 60 + off_m) * (1 if offset[0] == "+" else -1)
    try:
        local = datetime(year, month, day, hour, minute, second, micro)
    except ValueError:
        return None
    utc_micros = (local - _EPOCH) // timedelta(microseconds=1) - offset_minutes * 60_000_000
    return utc_micros // 1000


def _event_time(raw: Any) -> int | None:
    if isinstance(raw, bool):
        return None
    if isinstance(raw, int):
        return raw
    if isinstance(raw, str):
        return parse_rfc3339_ms(raw)
    return None


def _validate(source: _Source, record: Record) -> tuple[dict[str, Any], int, str | None] | str:
    """(event, event time ms, canonical id or None), or the reason the record is malformed."""
    event = _decode(record.value)
    if event is None:
        return "not_json_object"
    if source.time_field not in event:
        return "time_missing"
    event_time = _event_time(event[source.time_field])
    if event_time is None:
        return "time_invalid"
    if not _MIN_MS <= event_time <= _MAX_MS:
        return "time_out_of_range"
    if event_time > record.create_time_ms + source.max_future_ms:
        return "time_in_future"
    event_id = None
    if source.id_field is not None:
        if source.id_field not in event:
            return "id_missing"
        event_id = canonical(event[source.id_field])
        if event_id is None or not storable(event_id):
            return "id_invalid"
    return event, event_time, event_id


def storable(text: str) -> bool:
    """Whether an id or key text fits PostgreSQL's text and index entries (see the top)."""
    return "\0" not in text and len(text.encode("utf-8")) <= _TEXT_BYTES


def summable(raw: Any) -> float | None:
    """`finite_number`, and small enough to be summed (see the top)."""
    value = finite_number(raw)
    return value if value is not None and abs(value) < _VALUE_BOUND else None


def finite_number(raw: Any) -> float | None:
    """A JSON number as a finite double; None for a boolean, a non-number, an integer too large
    for a double, or a non-finite float (`1e999` decodes to inf)."""
    if isinstance(raw, bool) or not isinstance(raw, int | float):
        return None
    try:
        value = float(raw)
    except OverflowError:
        return None
    return value if math.isfinite(value) else None


def _table_version(table: _Table, record: Record) -> _Version | None:
    """The version a table record is (rule 11), or None when it is invalid. A tombstone names
    its key by the record key (UTF-8) and deletes it from the record's timestamp on; a JSON
    object is a version of the canonical text of its `key_field`, valid from its `time_field`
    read as an event time (or the record's timestamp), deleting the key when `"deleted": true`.
    """
    fields = None
    if record.value is None:
        if record.key is None:
            return None
        try:
            key: str | None = record.key.decode("utf-8")
        except UnicodeDecodeError:
            return None
        valid_from: int | None = record.create_time_ms
    else:
        fields = _decode(record.value)
        if fields is None or table.key_field not in fields:
            return None
        key = canonical(fields[table.key_field])
        if table.time_field is None:
            valid_from = record.create_time_ms
        elif table.time_field not in fields:
            return None
        else:
            valid_from = _event_time(fields[table.time_field])
        if fields.get("deleted") is True:
            fields = None
    if key is None or not storable(key):
        return None
    if valid_from is None or not _MIN_MS <= valid_from <= _MAX_MS:
        return None
    return _Version(key, valid_from, record.offset, record.partition, fields)


def _table_versions(
    config: dict[str, Any], records: list[Record]
) -> tuple[dict[str, dict[str, list[_Version]]], dict[str, int]]:
    """Table name -> key -> every valid version of the key among `records` (in no particular
    order), and table name -> how many of its records are invalid."""
    versions: dict[str, dict[str, list[_Version]]] = {}
    malformed: dict[str, int] = {}
    for table in _tables(config).values():
        by_key = versions.setdefault(table.name, {})
        for record in records:
            if record.topic != table.topic:
                continue
            version = _table_version(table, record)
            if version is None:
                _bump(malformed, table.name)
            else:
                by_key.setdefault(version.key, []).append(version)
    return versions, malformed


def _as_of(versions: list[_Version], event_time: int) -> dict[str, Any] | None:
    """The fields of the version valid at `event_time`: the greatest valid-from at or before
    it, ties by greater offset, then greater partition; None when there is none or it deletes
    the key. Every version of the key is looked at."""
    best: _Version | None = None
    for v in versions:
        if v.valid_from <= event_time and (
            best is None
            or (v.valid_from, v.offset, v.partition)
            > (best.valid_from, best.offset, best.partition)
        ):
            best = v
    return None if best is None else best.fields


def _joined(
    metric: _Metric,
    time_field: str,
    events: list[tuple[dict[str, Any], int]],
    tables: dict[str, dict[str, list[_Version]]],
) -> list[dict[str, Any]]:
    """Each event as the metric's expressions and inputs see it (rule 11): the event with each
    lookup's name bound to the fields of the version its `on` joins (the name absent when the
    lookup finds nothing, hiding an event field of that name). `on` is evaluated by DuckDB on
    the event itself, as a computed field would be."""
    if not metric.lookups:
        return [event for event, _ in events]
    joined = [dict(event) for event, _ in events]
    for lookup in metric.lookups:
        name = "on"
        while name in lookup.on:  # a name `on` cannot read, so it reads the event only
            name += "_"
        keys = expression_duckdb.evaluate({name: lookup.on}, None, time_field, events)
        by_key = tables[lookup.table]
        for out, (_event, event_time), (_selected, computed) in zip(
            joined, events, keys, strict=True
        ):
            key = canonical(computed[name])
            fields = None if key is None else _as_of(by_key.get(key, []), event_time)
            if fields is None:
                out.pop(lookup.alias, None)
            else:
                out[lookup.alias] = fields
    return joined


class _Inputs:
    """What a metric's input names read in one event: a computed field's value (evaluated by
    DuckDB, `tests/expression_duckdb.py`), the event time for the time field, else the JSON at
    the dotted path (the whole name when the metric has no definitions)."""

    def __init__(
        self,
        metric: _Metric,
        event: dict[str, Any],
        event_time: int,
        time_field: str,
        computed: dict[str, Any],
    ) -> None:
        self.metric, self.event, self.event_time = metric, event, event_time
        self.time_field, self.computed = time_field, computed

    def get(self, name: str) -> Any:
        if not self.metric.defined:
            return self.event.get(name)
        if name in self.computed:
            return self.computed[name]
        if name == self.time_field:
            return self.event_time
        node: Any = self.event
        for part in name.split("."):
            if not isinstance(node, dict):
                return None
            node = node.get(part)
        return node


def _metric_fields(
    metric: _Metric, event: dict[str, Any] | _Inputs
) -> tuple[tuple[str, ...], float | None, dict[str, str], float | None] | None:
    """(key, value, distinct values, quantile value) of the event for this metric, or None
    when skipped."""
    key = []
    for dim in metric.key:
        text = canonical(event.get(dim))
        if text is None or not storable(text):
            return None
        key.append(text)
    if len("".join(key).encode("utf-8")) > _KEY_BYTES:
        return None
    distinct = {}
    for name in metric.distinct_fields:
        text = canonical(event.get(name))
        if text is None:
            return None
        distinct[name] = text
    value = None
    if metric.value is not None:
        value = summable(event.get(metric.value))
        if value is None:
            return None
    quantile = None
    if metric.quantile_field is not None:
        quantile = summable(event.get(metric.quantile_field))
        if quantile is None:
            return None
    return tuple(key), value, distinct, quantile


# --------------------------------------------------------------------------- computation


def window_start(t_ms: int, size_ms: int) -> int:
    """Start of the epoch-aligned tumbling window of `size_ms` holding `t_ms` (floor)."""
    return t_ms - t_ms % size_ms


def sessionize(times: Iterable[int], gap_ms: int, max_duration_ms: int) -> list[Session]:
    """One key's sessions over its event times (any order), by the rule as written: in time
    order, an event starts a new session when at least `gap_ms` passed since the session's
    latest event, or when it is at least `max_duration_ms` after the session's first."""
    sessions: list[Session] = []
    for t in sorted(times):
        if sessions:
            first, last, events = sessions[-1]
            if t - last < gap_ms and t - first < max_duration_ms:
                sessions[-1] = Session(first, t, events + 1)
                continue
        sessions.append(Session(t, t, 1))
    return sessions


class Session(NamedTuple):
    """A session of one key: its first and last event times and how many events it holds."""

    first: int
    last: int
    events: int


def _bump(counter: dict[str, int], name: str) -> None:
    counter[name] = counter.get(name, 0) + 1


def compute(
    config: dict[str, Any],
    records: list[Record],
    *,
    late_rule: bool = False,
    watermarks: dict[str, int] | None = None,
    quantiles: Sequence[str | float | Decimal] = DEFAULT_QUANTILES,
) -> OracleResult:
    """Every cell of every metric over `records`, with the layers' counts.

    Without `late_rule` every valid, non-duplicate event counts (the batch's answer). With it,
    rule 2 drops late events per metric, as the speed layer does; `watermarks` (metric -> W)
    adds the `cell_end <= W` half of that rule. A `quantiles(f)` metric's cells carry one
    `ExactQuantile` per fraction in `quantiles` (the API's `q`), named by `quantile_name`.

    The records of the configured tables' topics (`tables:`) are the versions the metrics'
    `lookups` join (rule 11), as of each event's time whatever their place in `records`; their
    invalid records are counted in `table_malformed`.
    """
    fractions = _fractions(quantiles)
    metrics = {m.name: m for m in _metrics(config)}
    accs, malformed, skipped, late, duplicates, stream_time, table_malformed = _accumulate(
        config, records, late_rule=late_rule, watermarks=watermarks, base_only=False
    )
    cells = {cell: _finish(metrics[cell[0]], acc, fractions) for cell, acc in accs.items()}
    return OracleResult(cells, malformed, skipped, late, duplicates, stream_time, table_malformed)


def _accumulate(
    config: dict[str, Any],
    records: list[Record],
    *,
    late_rule: bool,
    watermarks: dict[str, int] | None,
    base_only: bool,
) -> tuple[
    dict[Cell, _Acc],
    dict[str, int],
    dict[str, int],
    dict[str, int],
    int,
    dict[tuple[str, int], int],
    dict[str, int],
]:
    """`compute`'s walk over the records: every event of every cell (every configured window,
    or only the base window with `base_only`), kept whole, and the counts."""
    if watermarks is not None and not late_rule:
        raise ValueError("watermarks only apply with late_rule=True")
    sources = _sources(config)
    metrics = _metrics(config)
    tables, table_malformed = _table_versions(config, records)
    accs: dict[Cell, _Acc] = {}
    malformed: dict[str, int] = {}
    skipped = {m.name: 0 for m in metrics}
    late = {m.name: 0 for m in metrics} if late_rule else {}
    duplicates = 0
    stream_time: dict[tuple[str, int], int] = {}

    for source in sources.values():
        source_metrics = [m for m in metrics if m.source == source.name and not m.session_part]
        sessions: dict[tuple[str, Key], list[tuple[int, _Fields]]] = {}
        seen_ids: set[tuple[int, str]] = set()
        remembered: dict[tuple[int, tuple[int, str]], int] = {}
        ordered = sorted(
            (r for r in records if r.topic == source.topic),
            key=lambda r: (r.partition, r.offset),
        )
        kept: list[tuple[dict[str, Any], int, int]] = []
        for record in ordered:
            parsed = _validate(source, record)
            if isinstance(parsed, str):
                _bump(malformed, parsed)
                continue
            event, event_time, event_id = parsed
            where = (record.topic, record.partition)
            # rule 2: an event moves its partition's stream time no further than its record's
            # timestamp (the broker's append time), however far ahead its own time lies
            clock = min(event_time, record.create_time_ms)
            stream_time[where] = max(stream_time.get(where, clock), clock)
            horizon = source.dedup_horizon_ms
            # rule 4: copies of one event share its id and its time; an id reused at another
            # time is another event
            identity = None if event_id is None else (event_time, event_id)
            if identity is not None and horizon is None:  # an event counts once
                if identity in seen_ids:
                    duplicates += 1
                    continue
                seen_ids.add(identity)
            elif identity is not None:
                # rule 4's horizon: per partition, an event is remembered from the copy that
                # counted until the stream time has passed that copy's time by the horizon
                counted_at = remembered.get((record.partition, identity))
                if counted_at is not None and stream_time[where] - counted_at <= horizon:
                    duplicates += 1
                    continue
                remembered[(record.partition, identity)] = event_time
            kept.append((event, event_time, stream_time[where]))
        events = [(e, t) for e, t, _ in kept]
        joined = {m.name: _joined(m, source.time_field, events, tables) for m in source_metrics}
        evaluated = {
            m.name: expression_duckdb.evaluate(
                m.fields,
                m.where,
                source.time_field,
                [(e, t) for e, (_, t) in zip(joined[m.name], events, strict=True)],
            )
            for m in source_metrics
            if m.defined
        }
        for position, (_event, event_time, as_of) in enumerate(kept):
            for metric in source_metrics:
                selected, computed = (
                    evaluated[metric.name][position] if metric.defined else (True, {})
                )
                if not selected:
                    continue
                inputs = _Inputs(
                    metric, joined[metric.name][position], event_time, source.time_field, computed
                )
                fields = _metric_fields(metric, inputs)
                if fields is None:
                    _bump(skipped, metric.name)
                    continue
                if late_rule and _is_late(metric, event_time, as_of, (watermarks or {})):
                    _bump(late, metric.name)
                    continue
                if metric.session is not None:
                    sessions.setdefault((metric.name, fields[0]), []).append((event_time, fields))
                    continue
                sizes = [metric.base_ms] if base_only else metric.windows_ms
                for size in sizes:
                    _add(
                        accs, (metric.name, size, window_start(event_time, size), fields[0]), fields
                    )
        by_name = {m.name: m for m in metrics}
        for (name, key), timed in sessions.items():
            metric = by_name[name]
            assert metric.session is not None
            gap, longest = metric.session
            timed.sort(key=lambda pair: pair[0])
            for session in sessionize([t for t, _ in timed], gap, longest):
                inside = [f for t, f in timed if session.first <= t <= session.last]
                duration = float(session.last - session.first)
                part = (key, duration, {}, duration)
                sizes = [metric.base_ms] if base_only else metric.windows_ms
                for size in sizes:
                    start = window_start(session.first, size)
                    # each key's cell, and the metric's total ([]: its rollup over every key)
                    for at, rolled in ((key, ""), ((), "[]")):
                        for fields in inside:
                            _add(accs, (f"{name}{rolled}", size, start, at), fields)
                        _add(accs, (f"{name}(sessions){rolled}", size, start, at), part)
                        if session.events == 1:
                            bounce = (at, None, {}, None)
                            _add(accs, (f"{name}(bounces){rolled}", size, start, at), bounce)
                if not base_only:  # the session itself, stored as a cell of window 0
                    for fields in inside:
                        _add(accs, (name, 0, session.first, key), fields)
                    _add(accs, (f"{name}(sessions)", 0, session.first, key), part)
    return accs, malformed, skipped, late, duplicates, stream_time, table_malformed


def _is_late(metric: _Metric, event_time: int, as_of: int, watermarks: dict[str, int]) -> bool:
    """The speed layer's lateness: rule 2 for a cell (its cell's end plus the grace reached by
    the partition's stream time, or at or before W), rule 13 for a session (the event's own
    time plus the grace, or before W plus `max_duration`)."""
    w = watermarks.get(metric.name)
    if metric.session is not None:
        longest = metric.session[1]
        return event_time + metric.grace_ms <= as_of or (w is not None and event_time < w + longest)
    base_end = window_start(event_time, metric.base_ms) + metric.base_ms
    return base_end + metric.grace_ms <= as_of or (w is not None and base_end <= w)


_Fields = tuple[Any, float | None, dict[str, str], float | None]
"""An event's (key, value, distinct texts by field, quantile value) for one metric."""


def _add(accs: dict[Cell, _Acc], cell: Cell, fields: _Fields) -> None:
    _key, value, distinct, quantile = fields
    acc = accs.setdefault(cell, _Acc())
    acc.count += 1
    if value is not None:
        acc.values.append(value)
    for name, text in distinct.items():
        acc.distinct.setdefault(name, set()).add(text)
    if quantile is not None:
        acc.quantile_values.append(quantile)


def _finish(metric: _Metric, acc: _Acc, fractions: Sequence[Decimal]) -> dict[str, float | int]:
    out: dict[str, float | int] = {}
    for agg in metric.aggregations:
        match = _DISTINCT.fullmatch(agg)
        if match is not None:
            out[f"distinct_{match.group(1)}"] = len(acc.distinct[match.group(1)])
        elif _QUANTILES.fullmatch(agg) is not None:
            ordered = tuple(sorted(acc.quantile_values))
            for q in fractions:
                out[quantile_name(q)] = ExactQuantile(q, ordered)
        elif agg == "count":
            out["count"] = acc.count
        elif agg == "sum":
            out["sum"] = _sum(acc.values)
        elif agg == "min":
            out["min"] = min(acc.values)
        elif agg == "max":
            out["max"] = max(acc.values)
        elif agg == "avg":
            out["avg"] = _sum(acc.values) / acc.count
    return out


def _sum(values: list[float]) -> float:
    try:
        return math.fsum(values)
    except OverflowError:
        return sum(values)


def compute_cells(
    config: dict[str, Any],
    records: list[Record],
    *,
    late_rule: bool = False,
    watermarks: dict[str, int] | None = None,
    quantiles: Sequence[str | float | Decimal] = DEFAULT_QUANTILES,
) -> dict[Cell, dict[str, float | int]]:
    """`compute(...).cells`."""
    return compute(
        config, records, late_rule=late_rule, watermarks=watermarks, quantiles=quantiles
    ).cells


def retained(
    config: dict[str, Any], cells: dict[Cell, Any], watermarks: dict[str, int]
) -> dict[Cell, Any]:
    """Rule 14 over `cells`: of a window with `retention: {w: r}`, only the cells that end
    after W - r (W: each metric's, by name in `watermarks`; its rollups and session parts
    have its retention); a session metric's sessions (window 0) go with the base window's
    cell of their first event."""
    rules: dict[str, tuple[dict[int, int], int]] = {}
    for metric in config["metrics"]:
        retention = {
            parse_duration(w): parse_duration(r) for w, r in metric.get("retention", {}).items()
        }
        rules[metric["name"]] = retention, min(parse_duration(w) for w in metric["windows"])
    kept = {}
    for cell, values in cells.items():
        name, size, start, _ = cell
        retention, base = rules.get(name.split("(")[0].split("[")[0], ({}, 0))
        watermark = watermarks.get(name)
        window = size or base
        end = start - start % window + window  # window 0: its first event's base cell
        if window in retention and watermark is not None and end <= watermark - retention[window]:
            continue
        kept[cell] = values
    return kept


def batch_watermark(
    config: dict[str, Any], records: list[Record], metric_name: str, prev: int | None = None
) -> int | None:
    """W_m = max(prev, floor_base(max_p L_p - grace)) over `records` (rule 5)."""
    metric = next(m for m in _metrics(config) if m.name == metric_name)
    topic = _sources(config)[metric.source].topic
    result = compute(config, [r for r in records if r.topic == topic])
    latest = [t for (t_topic, _), t in result.stream_time.items() if t_topic == topic]
    if not latest:
        return prev
    w = window_start(max(latest) - metric.grace_ms, metric.base_ms)
    return w if prev is None else max(prev, w)


# --------------------------------------------------------------------------- quantiles


def _fractions(quantiles: Sequence[str | float | Decimal]) -> list[Decimal]:
    """Each fraction as the exact decimal it is written as (a float by its shortest repr)."""
    fractions = []
    for q in quantiles:
        try:
            fraction = Decimal(str(q))
        except InvalidOperation:
            fraction = Decimal("NaN")
        if not fraction.is_finite() or not 0 < fraction < 1:
            raise ValueError(f"quantile {q!r} is not strictly between 0 and 1")
        fractions.append(fraction)
    return fractions


def quantile_name(q: str | float | Decimal) -> str:
    """`p` and 100 q, plain decimal, no trailing zeros: 0.5 -> p50, 0.999 -> p99.9."""
    (fraction,) = _fractions([q])
    hundredfold = fraction * 100
    if hundredfold == hundredfold.to_integral_value():
        return f"p{int(hundredfold)}"
    return f"p{format(hundredfold, 'f').rstrip('0')}"


def exact_quantile(ordered: Sequence[float], q: str | float | Decimal) -> float:
    """The inclusive lower quantile of the ascending, non-empty `ordered`: the smallest value v
    with #{values <= v} >= q n, i.e. `ordered[ceil(q n) - 1]` (q n computed exactly)."""
    if not ordered:
        raise ValueError("no values")
    (fraction,) = _fractions([q])
    rank = math.ceil(Fraction(fraction) * len(ordered))
    return ordered[max(rank, 1) - 1]


def rank_bounds(ordered: Sequence[float], v: float) -> tuple[float, float]:
    """(#{values < v} / n, #{values <= v} / n) over the ascending, non-empty `ordered`: the
    normalized ranks a reported `v` may stand for (equal when v is no value of the cell)."""
    n = len(ordered)
    return bisect_left(ordered, v) / n, bisect_right(ordered, v) / n


class ExactQuantile(float):
    """A cell's exact quantile of fraction `q` (the float value), carrying the cell's sorted
    values so `compare` can judge a sketch's answer by rank (`accepts`).

    A float subclass so a cell's outputs stay `name -> number`: it equals, prints and
    JSON-encodes as its value, and callers that copy or subset a cell keep the values."""

    q: Decimal
    values: tuple[float, ...]

    def __new__(cls, q: str | float | Decimal, values: Sequence[float]) -> ExactQuantile:
        ordered = tuple(sorted(values))
        self = super().__new__(cls, exact_quantile(ordered, q))
        (self.q,) = _fractions([q])
        self.values = ordered
        return self

    def __reduce__(self) -> tuple[type[ExactQuantile], tuple[Decimal, tuple[float, ...]]]:
        return type(self), (self.q, self.values)

    def rank_bounds(self, v: float) -> tuple[float, float]:
        """`rank_bounds` over this cell's values."""
        return rank_bounds(self.values, v)

    def accepts(self, v: Any, eps: float = KLL_RANK_EPS) -> bool:
        """Whether `v` is a right answer for q within normalized rank error `eps`: a finite
        number with rank_lo(v) - eps <= q <= rank_hi(v) + eps."""
        number = finite_number(v)
        if number is None:
            return False
        lo, hi = self.rank_bounds(number)
        return lo - eps <= float(self.q) <= hi + eps


# --------------------------------------------------------------------------- slicing

DAY_MS = _UNITS_MS["d"]

Key = tuple[str, ...]
"""A stored key: canonical values in the metric's key order (a group: in `group_by` order)."""
Filters = Mapping[str, Collection[str]]
"""dimension -> the canonical values it may take (`dim=value`, repeated = any of)."""


@dataclass
class View:
    """What a merged answer of one metric is composed from (rule 8), as base cells of whole
    events: a base cell ending at or before W comes from the batch side (every valid event
    the run read), any other from the speed side (the events rule 2 did not call late).
    W unknown (`watermark` None, no run served): every cell from the speed side."""

    metric: _Metric
    watermark: int | None
    batch: dict[int, dict[Key, _Acc]]
    """Base cell start -> key -> events, over every valid event of the run's snapshot."""
    speed: dict[int, dict[Key, _Acc]]
    """Base cell start -> key -> events the speed layer applied (empty: Redis unreachable)."""
    _starts: list[int] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self._starts = sorted(
            {s for s in self.batch if self._side(s) is self.batch}
            | {s for s in self.speed if self._side(s) is self.speed}
        )

    def _side(self, cell_start: int) -> dict[int, dict[Key, _Acc]]:
        w = self.watermark
        return self.batch if w is not None and cell_start + self.metric.base_ms <= w else self.speed

    def base_cells(self, start_ms: int, end_ms: int) -> Iterator[tuple[int, Key, _Acc]]:
        """(start, key, events) of every non-empty base cell starting in `[start_ms, end_ms)`,
        each from the side rule 8 takes it from."""
        first = bisect_left(self._starts, start_ms)
        last = bisect_left(self._starts, end_ms)
        for cell_start in self._starts[first:last]:
            for key, acc in self._side(cell_start).get(cell_start, {}).items():
                yield cell_start, key, acc


def view(
    config: dict[str, Any],
    metric_name: str,
    *,
    speed_records: list[Record] | None,
    batch_records: list[Record] | None = None,
    watermark: int | None = None,
) -> View:
    """The `View` of `metric_name` the serving layer should see.

    `speed_records`: every record the speed layer has read (rule 2 applied with `watermark`
    as the W it read), or None when Redis is unreachable (batch-only answers: no speed side).
    `batch_records`: the records of the served run's snapshot and `watermark` its W; both None
    before any run. Each list holds the table records its side joined (rule 11) too."""
    if (batch_records is None) != (watermark is None):
        raise ValueError("a served batch view has both its records and its W, or neither")
    metric = next((m for m in _metrics(config) if m.name == metric_name), None)
    if metric is None:
        raise ValueError(f"no metric {metric_name!r} in the config")

    def by_start(cells: dict[Cell, _Acc]) -> dict[int, dict[Key, _Acc]]:
        out: dict[int, dict[Key, _Acc]] = {}
        for (name, _size, start, key), acc in cells.items():
            if name == metric_name:
                out.setdefault(start, {})[key] = acc
        return out

    batch: dict[int, dict[Key, _Acc]] = {}
    if batch_records is not None:
        cells = _accumulate(
            config, batch_records, late_rule=False, watermarks=None, base_only=True
        )[0]
        batch = by_start(cells)
    speed: dict[int, dict[Key, _Acc]] = {}
    if speed_records is not None:
        watermarks = None if watermark is None else {metric_name: watermark}
        cells = _accumulate(
            config, speed_records, late_rule=True, watermarks=watermarks, base_only=True
        )[0]
        speed = by_start(cells)
    return View(metric, watermark, batch, speed)


def format_duration(ms: int) -> str:
    """`<n><unit>` in the largest unit of d, h, m, s that divides `ms` (else `<n>ms`)."""
    for unit in ("d", "h", "m", "s"):
        if ms and ms % _UNITS_MS[unit] == 0:
            return f"{ms // _UNITS_MS[unit]}{unit}"
    return f"{ms}ms"


def local_date(t_ms: int, tz: str) -> date:
    """The calendar date in zone `tz` at the instant `t_ms`."""
    return datetime.fromtimestamp(t_ms / 1000, ZoneInfo(tz)).date()


def local_midnight(day: date, tz: str) -> int:
    """The first instant (epoch ms) whose local date in `tz` is `day`: its midnight, or the
    first instant after a DST gap that swallows midnight. Found by bisection over the UTC
    instants around it (a zone's offset is within a day of UTC; local dates are taken to
    advance with time, which holds unless a change moves the clock back across midnight)."""
    naive = (datetime.combine(day, datetime.min.time()) - _EPOCH) // timedelta(milliseconds=1)
    lo, hi = naive - DAY_MS, naive + DAY_MS  # local_date(lo) < day <= local_date(hi)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if local_date(mid, tz) < day:
            lo = mid
        else:
            hi = mid
    return hi


def local_day_ms(day: date, tz: str) -> int:
    """How long `day` lasts in `tz` (23 or 25 hours across a DST change)."""
    return local_midnight(day + timedelta(days=1), tz) - local_midnight(day, tz)


def series_windows(
    start_ms: int, end_ms: int, size_ms: int, step_ms: int | None = None, tz: str | None = None
) -> list[tuple[int, int]]:
    """The windows `[start, end)` a series answers, ascending: those whose start lies in
    `[start_ms, end_ms)`. A window lasts `size_ms` and a new one begins every `step_ms`
    (default `size_ms`), aligned to the Unix epoch in UTC: window starts are the multiples of
    the step. With `tz`, windows and steps of whole days are counted in local days instead: a
    window starts at a local midnight, every `step` days counted from 1970-01-01 (local
    date), and lasts `size` local days (a DST day has 23 or 25 hours); any other size or step
    ignores `tz`."""
    step_ms = size_ms if step_ms is None else step_ms
    if size_ms <= 0 or step_ms <= 0:
        raise ValueError("window and step must be positive")
    if tz is None or size_ms % DAY_MS or step_ms % DAY_MS:
        first = -(-start_ms // step_ms) * step_ms
        return [(s, s + size_ms) for s in range(first, end_ms, step_ms)]
    size_days, step_days = size_ms // DAY_MS, step_ms // DAY_MS
    epoch_day = date(1970, 1, 1)
    day = local_date(start_ms, tz) - timedelta(days=1)
    windows = []
    while (begin := local_midnight(day, tz)) < end_ms:
        if begin >= start_ms and (day - epoch_day).days % step_days == 0:
            windows.append((begin, local_midnight(day + timedelta(days=size_days), tz)))
        day += timedelta(days=1)
    return windows


def required_base(windows: Sequence[tuple[int, int]], base_ms: int) -> int | None:
    """None when every bound of `windows` lies on a `base_ms` cell boundary (the windows can
    be composed of stored cells); otherwise the largest window dividing a day and every
    bound's time of day — the base window a metric would need (30m for Asia/Kolkata)."""
    bounds = [b for window in windows for b in window]
    if all(b % base_ms == 0 for b in bounds):
        return None
    need = DAY_MS
    for b in bounds:
        need = math.gcd(need, b % DAY_MS)
    return need


def point_source(start_ms: int, end_ms: int, watermark: int | None) -> str:
    """A window's `source` by its position against W (rule 8)."""
    if watermark is not None and end_ms <= watermark:
        return "batch"
    if watermark is None or start_ms >= watermark:
        return "speed"
    return "mixed"


def _selector(
    metric: _Metric, filters: Filters | None, group_by: Sequence[str]
) -> tuple[Callable[[Key], bool], Callable[[Key], Key]]:
    filters = filters or {}
    for dim in [*filters, *group_by]:
        if dim not in metric.key:
            raise ValueError(f"{dim!r} is not a dimension of {metric.name}'s key {metric.key}")
    if len(set(group_by)) != len(group_by):
        raise ValueError(f"group_by {list(group_by)} repeats a dimension")
    wanted = [(metric.key.index(d), {str(v) for v in values}) for d, values in filters.items()]
    at = [metric.key.index(d) for d in group_by]

    def keep(key: Key) -> bool:
        return all(key[i] in values for i, values in wanted)

    def group(key: Key) -> Key:
        return tuple(key[i] for i in at)

    return keep, group


def _merged(parts: list[_Acc]) -> _Acc:
    out = _Acc()
    for acc in parts:
        out.count += acc.count
        out.values.extend(acc.values)
        for name, values in acc.distinct.items():
            out.distinct.setdefault(name, set()).update(values)
        out.quantile_values.extend(acc.quantile_values)
    return out


def _grouped(
    v: View,
    start_ms: int,
    end_ms: int,
    keep: Callable[[Key], bool],
    group: Callable[[Key], Key],
    fractions: Sequence[Decimal],
) -> dict[Key, dict[str, float | int]]:
    """Each group's outputs over the base cells starting in `[start_ms, end_ms)`: the events of
    every key passing the filters pooled (never per-key answers combined)."""
    parts: dict[Key, list[_Acc]] = {}
    for _start, key, acc in v.base_cells(start_ms, end_ms):
        if keep(key):
            parts.setdefault(group(key), []).append(acc)
    return {g: _finish(v.metric, _merged(accs), fractions) for g, accs in parts.items()}


def sliced_series(
    v: View,
    windows: Sequence[tuple[int, int]],
    filters: Filters | None = None,
    group_by: Sequence[str] = (),
    quantiles: Sequence[str | float | Decimal] = DEFAULT_QUANTILES,
) -> dict[Key, list[dict[str, Any]]]:
    """A series over `windows` (`series_windows`), after the filters, one per group of
    `group_by` (`()` without it: one series, every dimension not fixed merged over), groups
    ascending. A point is `{"start", "end", "source"}` plus the metric's outputs; empty
    windows (and groups) are left out. Raises ValueError when a window does not lie on base
    cell boundaries (`required_base`)."""
    need = required_base(windows, v.metric.base_ms)
    if need is not None:
        raise ValueError(f"the windows need a base window dividing {format_duration(need)}")
    keep, group = _selector(v.metric, filters, group_by)
    fractions = _fractions(quantiles)
    series: dict[Key, list[dict[str, Any]]] = {}
    for start, end in windows:
        source = point_source(start, end, v.watermark)
        for g, outputs in _grouped(v, start, end, keep, group, fractions).items():
            series.setdefault(g, []).append(
                {"start": start, "end": end, "source": source, **outputs}
            )
    return dict(sorted(series.items()))


def sliced_top(
    v: View,
    size_ms: int,
    at_ms: int,
    by: str,
    filters: Filters | None = None,
    group_by: Sequence[str] | None = None,
    quantiles: Sequence[str | float | Decimal] = DEFAULT_QUANTILES,
) -> tuple[int, int, list[tuple[Key, Any]]]:
    """The UTC window of `size_ms` holding `at_ms` and every group's value of output `by` in
    it (groups of `group_by`, default the whole key, after the filters), largest first, ties
    by group ascending. Values are exact (`ExactQuantile` for a quantile)."""
    start = window_start(at_ms, size_ms)
    group_by = v.metric.key if group_by is None else group_by
    keep, group = _selector(v.metric, filters, group_by)
    outputs = _grouped(v, start, start + size_ms, keep, group, _fractions(quantiles))
    if any(by not in o for o in outputs.values()):
        raise ValueError(f"{by!r} is not an output of {v.metric.name}")
    ranked = sorted(((g, o[by]) for g, o in outputs.items()), key=lambda i: (-i[1], i[0]))
    return start, start + size_ms, ranked


def sliced_keys(
    v: View,
    start_ms: int,
    end_ms: int,
    filters: Filters | None = None,
    prefix: str | None = None,
) -> list[Key]:
    """The keys passing the filters with a non-empty base cell starting in
    `[start_ms, end_ms)` (each cell from its rule 8 side), whose first dimension starts with
    `prefix`; ascending."""
    keep, _group = _selector(v.metric, filters, ())
    return sorted(
        {
            key
            for _start, key, _acc in v.base_cells(start_ms, end_ms)
            if keep(key) and (prefix is None or not key or key[0].startswith(prefix))
        }
    )


# --------------------------------------------------------------------------- comparison


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def compare(
    expected: dict[Cell, dict[str, Any]],
    actual: dict[Cell, dict[str, Any]],
    *,
    rel: float = 1e-9,
    distinct_rel: float = 0.05,
    abs_tol: float = 1e-9,
    rank_eps: float = KLL_RANK_EPS,
) -> list[str]:
    """Human-readable differences between two cell maps; empty when they agree.

    `count` must be equal; `distinct_*` within `distinct_rel` relative plus 1 (HLL, lg_k=12);
    an expected `ExactQuantile` (`p50`...) by rank, not value: `a` for fraction q is right iff
    q lies in [rank_lo(a) - rank_eps, rank_hi(a) + rank_eps] over the cell's exact values (KLL,
    k=200); every other field within `rel` relative or `abs_tol` absolute (float sums cancel
    near 0).
    """
    lines = []
    for cell in sorted(expected.keys() - actual.keys()):
        lines.append(f"missing cell {cell}: expected {expected[cell]}")
    for cell in sorted(actual.keys() - expected.keys()):
        lines.append(f"extra cell {cell}: got {actual[cell]}")
    for cell in sorted(expected.keys() & actual.keys()):
        want, got = expected[cell], actual[cell]
        for name in sorted(want.keys() - got.keys()):
            lines.append(f"cell {cell}: field {name} missing (expected {want[name]})")
        for name in sorted(got.keys() - want.keys()):
            lines.append(f"cell {cell}: unexpected field {name} = {got[name]}")
        for name in sorted(want.keys() & got.keys()):
            e, a = want[name], got[name]
            if not _is_number(a):
                ok = False
            elif name == "count":
                ok = a == e
            elif name.startswith("distinct_"):
                ok = abs(a - e) <= distinct_rel * abs(e) + 1
            elif isinstance(e, ExactQuantile):
                if not e.accepts(a, rank_eps):
                    number = finite_number(a)
                    lo, hi = (math.nan,) * 2 if number is None else e.rank_bounds(number)
                    lines.append(
                        f"cell {cell}: {name} expected {e} (q={e.q} ± {rank_eps} of "
                        f"n={len(e.values)}), got {a} (rank {lo:.4f}..{hi:.4f})"
                    )
                continue
            else:
                ok = math.isclose(a, e, rel_tol=rel, abs_tol=abs_tol)
            if not ok:
                lines.append(f"cell {cell}: {name} expected {e}, got {a}")
    return lines


# --------------------------------------------------------------------------- Kafka


def read_topic(bootstrap: str, topic: str, *, timeout_s: float = 60.0) -> list[Record]:
    """Every committed record of `topic`, each partition from its start to its end offset.

    End offsets are taken once, up front (read_committed: the last stable offset). A partition
    is done when the consumer's position reaches its end offset (or the broker reports the
    end there), never by counting records: transaction markers occupy offsets too. Raises
    TimeoutError when no progress is made for `timeout_s` seconds.
    """
    from confluent_kafka import OFFSET_INVALID, Consumer, KafkaError, KafkaException, TopicPartition

    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"oracle-{uuid.uuid4()}",
            "enable.auto.commit": False,
            "enable.auto.offset.store": False,
            "isolation.level": "read_committed",
            "auto.offset.reset": "earliest",
            "enable.partition.eof": True,
        }
    )
    try:
        metadata = consumer.list_topics(topic, timeout=timeout_s).topics[topic]
        if metadata.error is not None:
            raise KafkaException(metadata.error)
        ends: dict[int, int] = {}
        starts: list[TopicPartition] = []
        for partition in sorted(metadata.partitions):
            low, high = consumer.get_watermark_offsets(
                TopicPartition(topic, partition), timeout=timeout_s
            )
            if low < high:
                ends[partition] = high
                starts.append(TopicPartition(topic, partition, low))
        records: list[Record] = []
        if not starts:
            return records
        consumer.assign(starts)
        pending = set(ends)
        deadline = time.monotonic() + timeout_s
        while pending:
            if time.monotonic() > deadline:
                raise TimeoutError(f"{topic}: partitions {sorted(pending)} did not reach the end")
            msg = consumer.poll(0.5)
            if msg is not None:
                error, partition, offset = msg.error(), msg.partition(), msg.offset()
                assert partition is not None and offset is not None
                if error is None:
                    deadline = time.monotonic() + timeout_s
                    if offset < ends[partition]:
                        create_time = msg.timestamp()[1]
                        records.append(
                            Record(topic, partition, offset, create_time, msg.value(), msg.key())
                        )
                elif error.code() != KafkaError._PARTITION_EOF:
                    raise KafkaException(error)
                elif offset >= ends[partition]:
                    pending.discard(partition)
            for tp in consumer.position([TopicPartition(topic, p) for p in pending]):
                if tp.offset != OFFSET_INVALID and tp.offset >= ends[tp.partition]:
                    pending.discard(tp.partition)
        return sorted(records, key=lambda r: (r.partition, r.offset))
    finally:
        consumer.close()
