"""Event validity, exactly as DESIGN.md "Event validity" defines it, used by every layer.

`parse_record` decides source-level validity (malformed records are dead-lettered or counted);
`metric_input` decides metric-level validity (the event is skipped for that metric only).
Neither raises on bad input: a rejection is a value carrying its reason.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta, timezone
from typing import Any, NamedTuple

import orjson

from shared.config import MetricConfig, SourceConfig

# Python's datetime range, so every valid event time is also a valid Spark/PostgreSQL timestamp.
MIN_EVENT_MS = -62_135_596_800_000
MAX_EVENT_MS = 253_402_300_799_999

_RFC3339 = re.compile(
    r"([0-9]{4})-([0-9]{2})-([0-9]{2})[Tt]([0-9]{2}):([0-9]{2}):([0-9]{2})(?:\.([0-9]{1,6}))?"
    r"(?:([Zz])|([+-])([0-9]{2}):([0-9]{2}))"
)
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


_EXACT_INT_LIMIT = 2.0**63
"""orjson reads integers beyond 64 bits as floats; such a document is re-read exactly."""
_MAYBE_HUGE_NUMBER = re.compile(rb"[0-9]{19}|[0-9][eE]")
"""Only a 19+ digit run or an exponent can decode to a float beyond 2**63: a cheap bytes test
spares the per-field scan for almost every event."""


def _reject_constant(name: str) -> object:
    raise ValueError(f"{name} is not JSON")


def decode_json(value: bytes) -> object:
    """Decode a record value as strict JSON; raise ValueError when it is not.

    orjson is the fast path. It rejects numbers that overflow a double (`1e400`) and reads
    integers beyond 64 bits as floats; in both cases the text is valid JSON, so the standard
    library re-reads it exactly (`1e400` becomes inf, a skip for the value field; a huge integer
    keeps its digits, a valid dimension). `NaN`/`Infinity` and lone surrogates are not JSON;
    nesting too deep for the decoders raises RecursionError."""
    try:
        decoded = orjson.loads(value)
    except orjson.JSONDecodeError:
        pass
    else:
        if (
            type(decoded) is not dict
            or _MAYBE_HUGE_NUMBER.search(value) is None
            or not any(
                type(v) is float and not -_EXACT_INT_LIMIT < v < _EXACT_INT_LIMIT
                for v in decoded.values()
            )
        ):
            return decoded
    decoded = json.loads(value.decode("utf-8"), parse_constant=_reject_constant)
    json.dumps(decoded, ensure_ascii=False).encode("utf-8")  # lone surrogates raise here
    return decoded


class Malformed(NamedTuple):
    """A record that fails source-level validity; `reason` is a short stable label."""

    reason: str
    detail: str


class Skipped(NamedTuple):
    """An event that a metric cannot use; it still counts for the source's other metrics."""

    reason: str


@dataclass(frozen=True, slots=True)
class SourceEvent:
    """A source-valid event: its JSON object, event time (epoch ms) and canonical id."""

    fields: dict[str, Any]
    time_ms: int
    event_id: str | None


class MetricInput(NamedTuple):
    """What one event contributes to one metric: canonical key, value, canonical distincts."""

    key: tuple[str, ...]
    value: float | None
    distincts: tuple[str, ...]


def canonical(value: object) -> str | None:
    """The canonical text of a dimension, distinct or id value: a string is itself, an integer
    its decimal text (so 7 and "7" are one value, as in Druid); anything else has none."""
    if type(value) is str:
        return value
    if type(value) is int:
        return str(value)
    return None


def parse_event_time(raw: object) -> int | None:
    """Epoch ms from an integer epoch-ms or an RFC 3339 string with an offset; else None."""
    if type(raw) is int:
        return raw if MIN_EVENT_MS <= raw <= MAX_EVENT_MS else None
    if type(raw) is not str:
        return None
    match = _RFC3339.fullmatch(raw)
    if match is None:
        return None
    year, month, day, hour, minute, second, frac, zulu, sign, off_h, off_m = match.groups()
    try:
        offset = timedelta(0)
        if not zulu:
            if int(off_h) > 23 or int(off_m) > 59:
                return None
            offset = timedelta(hours=int(off_h), minutes=int(off_m))
            if sign == "-":
                offset = -offset
        moment = datetime(
            int(year),
            int(month),
            int(day),
            int(hour),
            int(minute),
            int(second),
            int((frac or "0").ljust(6, "0")),
            tzinfo=timezone(offset),
        )
        micros = (moment - _EPOCH) // timedelta(microseconds=1)
    except (ValueError, OverflowError):
        return None
    millis = micros // 1000
    return millis if MIN_EVENT_MS <= millis <= MAX_EVENT_MS else None


def parse_record(
    value: bytes | None, create_time_ms: int, source: SourceConfig
) -> SourceEvent | Malformed:
    """Source-level validity of one Kafka record of `source`."""
    if value is None:
        return Malformed("not_json", "the record has no value")
    try:
        fields = decode_json(value)
    except (ValueError, RecursionError) as exc:
        return Malformed("not_json", f"the value is not JSON: {exc}")
    if type(fields) is not dict:
        return Malformed("not_object", "the value is JSON but not an object")
    raw_time = fields.get(source.time_field)
    if raw_time is None and source.time_field not in fields:
        return Malformed("time_missing", f"the time field {source.time_field!r} is missing")
    time_ms = parse_event_time(raw_time)
    if time_ms is None:
        return Malformed(
            "time_invalid",
            f"the time field {source.time_field!r} is neither integer epoch-ms nor RFC 3339 "
            "with an offset",
        )
    if time_ms > create_time_ms + source.max_future:
        return Malformed(
            "time_in_future",
            f"event time {time_ms} lies more than max_future after the record's CreateTime "
            f"{create_time_ms}",
        )
    event_id = None
    if source.id_field is not None:
        if source.id_field not in fields:
            return Malformed("id_missing", f"the id field {source.id_field!r} is missing")
        event_id = canonical(fields[source.id_field])
        if event_id is None:
            return Malformed("id_invalid", f"the id field {source.id_field!r} must be str or int")
    return SourceEvent(fields, time_ms, event_id)


def metric_input(event: SourceEvent, metric: MetricConfig) -> MetricInput | Skipped:
    """Metric-level validity: the event's canonical key, value and distinct values."""
    fields = event.fields
    key = []
    for dim in metric.key:
        text = canonical(fields.get(dim))
        if text is None:
            return Skipped("key_missing" if dim not in fields else "key_invalid")
        key.append(text)
    value = None
    if metric.value is not None:
        raw = fields.get(metric.value)
        if metric.value not in fields:
            return Skipped("value_missing")
        if type(raw) is int:
            try:
                value = float(raw)
            except OverflowError:
                return Skipped("value_invalid")
        elif type(raw) is float and math.isfinite(raw):
            value = raw
        else:
            return Skipped("value_invalid")
    distincts = []
    for field in metric.distinct_fields:
        text = canonical(fields.get(field))
        if text is None:
            return Skipped("distinct_missing" if field not in fields else "distinct_invalid")
        distincts.append(text)
    return MetricInput(tuple(key), value, tuple(distincts))
