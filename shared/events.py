"""Event validity, exactly as docs/semantics.md "Event validity" defines it, used by every layer.

`parse_record` decides source-level validity (malformed records are dead-lettered or counted);
`metric_input` decides metric-level validity (the event is skipped for that metric only).
Neither raises on bad input: a rejection is a value carrying its reason.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta, timezone
from functools import lru_cache
from typing import Any, NamedTuple

import msgspec
import orjson

from shared.config import SourceConfig
from shared.expressions import MISSING, Emitter, split_path
from shared.expressions.syntax import MAX_EVENT_MS, MIN_EVENT_MS, Computed, EventTime
from shared.metric_plan import MetricPlan, SketchInput

MAX_TEXT_BYTES = 1024
"""The longest id or key dimension value, in UTF-8 bytes. Both are stored in PostgreSQL btree
indexes (`dedup_ids`', `horizon_ids`' and `batch_cells`' primary keys), whose entries are at
most 2,704 bytes."""
MAX_KEY_BYTES = 2 * MAX_TEXT_BYTES
"""The longest key, all its dimension values together (same reason as `MAX_TEXT_BYTES`)."""
VALUE_LIMIT = 2.0**63
"""A value (or quantile field) must be smaller than this in magnitude, the range of a 64-bit
integer: then no sum of a cell's values can overflow a double, in either layer."""
_SURELY_SHORT = MAX_TEXT_BYTES // 4
"""A text of at most this many characters fits `MAX_TEXT_BYTES` (UTF-8 spends 4 at most)."""

_RFC3339 = re.compile(
    r"([0-9]{4})-([0-9]{2})-([0-9]{2})[Tt]([0-9]{2}):([0-9]{2}):([0-9]{2})(?:\.([0-9]{1,6}))?"
    r"(?:([Zz])|([+-])([0-9]{2}):([0-9]{2}))"
)
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


_EXACT_INT_LIMIT = 2.0**63
"""orjson reads integers beyond 64 bits as floats; such a document is re-read exactly. Only a
float at or beyond 2**63 can be one (its text has 19+ digits or an exponent)."""

_EXACT_DECODER = msgspec.json.Decoder()
"""Reads integers of any size exactly (orjson reads those beyond 64 bits as floats)."""


def _reject_constant(name: str) -> object:
    raise ValueError(f"{name} is not JSON")


def decode_json(value: bytes) -> object:
    """Decode a record value as strict JSON; raise ValueError when it is not.

    Numbers are read as the standard library reads them: integers of any size exact, `1e400`
    infinite (a skip for a value field). msgspec, the fast path, gives that answer for every
    document it accepts; what it refuses (`1e400`, anything not JSON) the standard library
    reads or refuses. Nesting deeper than msgspec reads under the recursion limit goes to
    orjson (up to 1,024 levels), whose integers beyond 64 bits come back as floats, so a
    document where one may have is re-read by the standard library. `NaN`/`Infinity` and lone
    surrogates are not JSON; nesting too deep for every decoder raises RecursionError.
    (msgspec replaced orjson and the walk for floats beyond 2**63 after every document, ~15%
    of the speed layer's `decide`: docs/performance.md.)"""
    try:
        return _EXACT_DECODER.decode(value)
    except msgspec.DecodeError:
        pass
    except RecursionError:
        try:
            decoded = orjson.loads(value)
        except orjson.JSONDecodeError:
            pass
        else:
            if type(decoded) is not dict or not _may_be_inexact(decoded.values()):
                return decoded
    decoded = json.loads(value.decode("utf-8"), parse_constant=_reject_constant)
    json.dumps(decoded, ensure_ascii=False).encode("utf-8")  # lone surrogates raise here
    return decoded


def _may_be_inexact(values: Iterable[object]) -> bool:
    """Whether orjson may have read an integer beyond 64 bits as a float: a float at or beyond
    2**63 anywhere, nested objects and arrays included (dotted paths reach those). Iterative:
    orjson accepts nesting deeper than Python's recursion limit."""
    limit = _EXACT_INT_LIMIT
    pending = [values]
    while pending:
        for v in pending.pop():
            kind = type(v)
            if kind is float:
                if not -limit < v < limit:  # type: ignore[operator]
                    return True
            elif kind is dict:
                pending.append(v.values())  # type: ignore[attr-defined]
            elif kind is list:
                pending.append(v)  # type: ignore[arg-type]
    return False


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


class Filtered(NamedTuple):
    """An event a metric's `where` does not select (rule 10): not counted by that metric, and
    neither skipped nor late for it."""


FILTERED = Filtered()


class MetricInput(NamedTuple):
    """What one event contributes to one metric: canonical key, value, and one item per
    sketch slot (a canonical text or a finite number, as the slot reads)."""

    key: tuple[str, ...]
    value: float | None
    sketch_items: tuple[str | float, ...]


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


SourceFields = tuple[dict[str, Any], int, str | None]
"""A source-valid event as a plain tuple (fields, time_ms, event_id): `SourceEvent`'s content,
for hot loops that cannot afford an object per event."""

InputFields = tuple[tuple[str, ...], float | None, tuple[str | float, ...]]
"""`MetricInput`'s content as a plain tuple (key, value, sketch items)."""
AsOf = Callable[[str | None, int], "dict[str, Any] | None"]
"""A table's as-of join (rule 11): the fields of a key's version valid at an event time."""


def parse_record(
    value: bytes | None, create_time_ms: int, source: SourceConfig
) -> SourceEvent | Malformed:
    """Source-level validity of one Kafka record of `source`."""
    parsed = parse_fields(value, create_time_ms, source)
    if type(parsed) is Malformed:
        return parsed
    fields, time_ms, event_id = parsed  # type: ignore[misc]
    return SourceEvent(fields, time_ms, event_id)


def decode_object(value: bytes) -> dict[str, Any] | Malformed:
    """A record value as a JSON object, or why it is not one (`not_json`, `not_object`)."""
    try:
        fields = decode_json(value)
    except (ValueError, RecursionError) as exc:
        return Malformed("not_json", f"the value is not JSON: {exc}")
    if type(fields) is not dict:
        return Malformed("not_object", "the value is JSON but not an object")
    return fields


def parse_fields(
    value: bytes | None, create_time_ms: int, source: SourceConfig
) -> SourceFields | Malformed:
    """`parse_record` without the `SourceEvent`: the one definition of source-level validity."""
    if value is None:
        return Malformed("not_json", "the record has no value")
    fields = decode_object(value)
    if type(fields) is Malformed:
        return fields
    assert type(fields) is dict
    time_field = source.time_field
    raw_time = fields.get(time_field)
    if type(raw_time) is int and MIN_EVENT_MS <= raw_time <= MAX_EVENT_MS:
        time_ms: int | None = raw_time
    elif raw_time is None and time_field not in fields:
        return Malformed("time_missing", f"the time field {time_field!r} is missing")
    else:
        time_ms = parse_event_time(raw_time)
        if time_ms is None:
            return Malformed(
                "time_invalid",
                f"the time field {time_field!r} is neither integer epoch-ms nor RFC 3339 "
                "with an offset",
            )
    if time_ms > create_time_ms + source.max_future:  # type: ignore[operator]
        return Malformed(
            "time_in_future",
            f"the time field {time_field!r} ({time_ms}) lies more than max_future "
            f"({source.max_future} ms) after the record's CreateTime {create_time_ms}",
        )
    id_field = source.id_field
    if id_field is None:
        return fields, time_ms, None  # type: ignore[return-value]
    raw_id = fields.get(id_field)
    if type(raw_id) is str:
        event_id = raw_id
    elif type(raw_id) is int:
        event_id = str(raw_id)
    elif id_field not in fields:
        return Malformed("id_missing", f"the id field {id_field!r} is missing")
    else:
        return Malformed("id_invalid", f"the id field {id_field!r} must be str or int")
    if len(event_id) > _SURELY_SHORT or "\x00" in event_id:
        fault = text_fault(event_id)
        if fault is not None:
            return Malformed(f"id_{fault}", f"the id field {id_field!r} {_FAULTS[fault]}")
    return fields, time_ms, event_id  # type: ignore[return-value]


_FAULTS = {
    "invalid": "contains a NUL character (\\u0000), which PostgreSQL text cannot hold",
    "too_long": f"is longer than {MAX_TEXT_BYTES} bytes in UTF-8",
}


def dedup_identity(time_ms: int, event_id: str) -> str:
    """What rule 4 de-duplicates by: the event time and the id, as one text. Copies of one
    event (producer retries) carry the same payload, hence the same time; an id reused for
    an event of another time is another event, in every layer. The time comes first, so
    the text stays unambiguous whatever the id holds."""
    return f"{time_ms}:{event_id}"


def text_fault(text: str) -> str | None:
    """Why an id or key dimension text cannot be stored (`invalid`: it holds a NUL, which
    PostgreSQL text cannot; `too_long`: over `MAX_TEXT_BYTES`), or None when it can."""
    if "\x00" in text:
        return "invalid"
    if len(text) > _SURELY_SHORT and len(text.encode()) > MAX_TEXT_BYTES:
        return "too_long"
    return None


def metric_input(
    event: SourceEvent, metric: MetricPlan, tables: Mapping[str, AsOf] | None = None
) -> MetricInput | Skipped | Filtered:
    """Metric-level validity: the event's canonical key, value and distinct values."""
    for contribution in metric_inputs((event.fields,), metric, (event.time_ms,), tables):
        if type(contribution) is Skipped or type(contribution) is Filtered:
            return contribution
        return MetricInput(*contribution)
    raise AssertionError("metric_inputs yields one result per event")


_SKIPS = {
    reason: Skipped(reason)
    for what in ("key", "value")
    for reason in (f"{what}_missing", f"{what}_invalid", f"{what}_too_long", f"{what}_out_of_range")
}


def _canonical_all(
    fields: dict[str, Any], names: tuple[str, ...], what: str, short: int = _SURELY_SHORT
) -> tuple[str, ...] | Skipped:
    """The canonical texts of the fields `names`, or the first failing one's skip reason."""
    texts = []
    for name in names:
        item = fields.get(name)
        if type(item) is str:
            text = item
        elif type(item) is int:
            text = str(item)
        else:
            return _SKIPS[f"{what}_missing" if name not in fields else f"{what}_invalid"]
        if len(text) > short or "\x00" in text:
            fault = text_fault(text)
            if fault is not None:
                return _SKIPS[f"{what}_{fault}"]
        texts.append(text)
    if len(texts) > 2 and _key_too_long(texts):  # two texts that passed always fit
        return _SKIPS[f"{what}_too_long"]
    return tuple(texts)


def _key_too_long(texts: list[str]) -> bool:
    return (
        sum(map(len, texts)) > MAX_KEY_BYTES // 4 and len("".join(texts).encode()) > MAX_KEY_BYTES
    )


def finite_number(raw: Any) -> float | None:
    """A JSON number as a finite float (booleans, non-numbers and overflows are None)."""
    if type(raw) is float:
        return raw if math.isfinite(raw) else None
    if type(raw) is int:
        try:
            return float(raw)
        except OverflowError:
            return None
    return None


def in_range(value: float) -> bool:
    """Whether a finite value or quantile field is small enough to be summed (`VALUE_LIMIT`)."""
    return -VALUE_LIMIT < value < VALUE_LIMIT


def _sketch_items(
    fields: dict[str, Any], inputs: tuple[SketchInput, ...]
) -> tuple[str | float, ...] | Skipped:
    """Each sketch slot's item (canonical text or finite number), or the first failing one's
    skip reason."""
    items: list[str | float] = []
    for slot in inputs:
        raw = fields.get(slot.field)
        item: str | float | None
        if slot.number:
            item = finite_number(raw)
            if item is not None and not in_range(item):
                return Skipped(slot.out_of_range)
        elif type(raw) is str:
            item = raw
        elif type(raw) is int:
            item = str(raw)
        else:
            item = None
        if item is None:
            return Skipped(slot.missing if slot.field not in fields else slot.invalid)
        items.append(item)
    return tuple(items)


def metric_inputs(
    events_fields: Iterable[dict[str, Any]],
    metric: MetricPlan,
    times: Iterable[int] = (),
    tables: Mapping[str, AsOf] | None = None,
) -> Iterator[InputFields | Skipped | Filtered]:
    """`metric_input` over many events' fields (and times, which a metric with `definitions`
    reads), one result per event, as plain tuples: the one definition of metric-level validity
    (checked in order: `where`, key dimensions, value, sketch fields), shaped for hot loops: no
    object per event, one generator step per event. A metric with lookups (rule 11) joins each
    event with `tables` (by table name), each answering the version valid for a key at a
    time."""
    if metric.definitions is not None:
        joins = tuple(tables[lookup.table.name] for lookup in metric.lookups) if tables else ()
        if len(joins) != len(metric.lookups):
            raise ValueError(f"metric {metric.name!r} joins tables: give them (`tables`)")
        yield from _defined_program(metric)(events_fields, times, joins)
        return
    dims = metric.key
    value_field = metric.value
    inputs = metric.sketch_inputs
    one_dim = dims[0] if len(dims) == 1 else None
    one_text = inputs[0].field if len(inputs) == 1 and not inputs[0].number else None
    value: float | None = None
    low, high, short = -VALUE_LIMIT, VALUE_LIMIT, _SURELY_SHORT
    for fields in events_fields:
        if one_dim is not None:
            item = fields.get(one_dim)
            if type(item) is str:
                text = item
            elif type(item) is int:
                text = str(item)
            else:
                yield _SKIPS["key_missing" if one_dim not in fields else "key_invalid"]
                continue
            if len(text) > short or "\x00" in text:
                fault = text_fault(text)
                if fault is not None:
                    yield _SKIPS[f"key_{fault}"]
                    continue
            key: tuple[str, ...] | Skipped = (text,)
        elif not dims:
            key = ()
        else:
            key = _canonical_all(fields, dims, "key")
            if type(key) is Skipped:
                yield key
                continue
        if value_field is not None:
            value = finite_number(fields.get(value_field))
            if value is None:
                yield _SKIPS["value_missing" if value_field not in fields else "value_invalid"]
                continue
            if not low < value < high:
                yield _SKIPS["value_out_of_range"]
                continue
        if one_text is not None:
            raw = fields.get(one_text)
            if type(raw) is str:
                items: tuple[str | float, ...] | Skipped = (raw,)
            elif type(raw) is int:
                items = (str(raw),)
            else:
                yield Skipped(inputs[0].missing if one_text not in fields else inputs[0].invalid)
                continue
        elif not inputs:
            items = ()
        else:
            items = _sketch_items(fields, inputs)
            if type(items) is Skipped:
                yield items
                continue
        yield key, value, items


def _absent(raw: Any, computed: bool) -> bool:
    """Whether an unusable input is missing (a raw field the event lacks, a computed field that
    is NULL) rather than invalid."""
    return raw is MISSING or (computed and raw is None)


@lru_cache(maxsize=64)
def _defined_program(
    metric: MetricPlan,
) -> Callable[
    [Iterable[dict[str, Any]], Iterable[int], tuple[AsOf, ...]],
    Iterator[InputFields | Skipped | Filtered],
]:
    """`metric_inputs` of a metric with `definitions`, as one generated function
    (`shared.expressions.pycode`): computed fields evaluated once per event, then `where`,
    then each input checked as a raw field is — `canonical` text, `finite_number` numbers,
    in `metric_inputs`' order (a computed field that is NULL is missing; a computed BOOLEAN is
    invalid, and so is a DOUBLE where text is read)."""
    definitions = metric.definitions
    assert definitions is not None
    emit = Emitter()
    emit.namespace.update(
        FILTERED=FILTERED,
        Skipped=Skipped,
        _SKIPS=_SKIPS,
        _absent=_absent,
        _canonical=canonical,
        _finite=finite_number,
        _text_fault=text_fault,
        _key_too_long=_key_too_long,
        _in_range=in_range,
    )

    def read(name: str) -> tuple[str, bool]:
        """Write the read of an input; (its local, whether it is a computed field)."""
        node = definitions.reference(name)
        if isinstance(node, Computed):
            return emit.computed[name], True
        if isinstance(node, EventTime):
            return "t", False
        local = emit.local()
        emit.line(f"{local} = {emit.json(split_path(name))}")
        return local, False

    def skip(reason: str) -> None:
        emit.line(f"yield {reason}")
        emit.line("continue")

    if metric.lookups:
        emit.line(f"{', '.join(f'_as_of{k}' for k in range(len(metric.lookups)))}, = lookups")
    with emit.block("for f, t in zip(events, times, strict=True)"):
        for k, lookup in enumerate(metric.lookups):
            joined = emit.local()
            emit.line(f"{joined} = _as_of{k}(_canonical({emit.value(lookup.on)}), t)")
            emit.lookups[lookup.alias] = joined
        for name, node in definitions.fields:
            value = emit.value(node)
            local = emit.local()
            emit.line(f"{local} = {value}")
            emit.computed[name] = local
        if definitions.where is not None:
            with emit.block(f"if {emit.value(definitions.where)} is not True"):
                skip("FILTERED")
        texts = []
        for name in metric.key:
            raw, computed = read(name)
            text = emit.local()
            texts.append(text)
            emit.line(f"{text} = _canonical({raw})")
            with emit.block(f"if {text} is None"):
                skip(f"_SKIPS['key_missing' if _absent({raw}, {computed}) else 'key_invalid']")
            with emit.block(f"if len({text}) > {_SURELY_SHORT} or '\\x00' in {text}"):
                emit.line(f"_fault = _text_fault({text})")
                with emit.block("if _fault is not None"):
                    skip("_SKIPS['key_' + _fault]")
        if len(texts) > 2:
            with emit.block(f"if _key_too_long([{', '.join(texts)}])"):
                skip("_SKIPS['key_too_long']")
        number = "None"
        if metric.value is not None:
            raw, computed = read(metric.value)
            number = emit.local()
            emit.line(f"{number} = _finite({raw})")
            with emit.block(f"if {number} is None"):
                skip(f"_SKIPS['value_missing' if _absent({raw}, {computed}) else 'value_invalid']")
            with emit.block(f"if not _in_range({number})"):
                skip("_SKIPS['value_out_of_range']")
        items = []
        for slot in metric.sketch_inputs:
            raw, computed = read(slot.field)
            item = emit.local()
            items.append(item)
            emit.line(f"{item} = {'_finite' if slot.number else '_canonical'}({raw})")
            missing, invalid = (
                emit.constant(Skipped(slot.missing)),
                emit.constant(Skipped(slot.invalid)),
            )
            with emit.block(f"if {item} is None"):
                skip(f"{missing} if _absent({raw}, {computed}) else {invalid}")
            if slot.number:
                with emit.block(f"if not _in_range({item})"):
                    skip(emit.constant(Skipped(slot.out_of_range)))
        key = f"({', '.join(texts)},)" if texts else "()"
        sketch = f"({', '.join(items)},)" if items else "()"
        emit.line(f"yield {key}, {number}, {sketch}")
    return emit.function("metric_inputs", "events, times, lookups")
