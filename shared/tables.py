"""Lookup tables (rule 11 in docs/semantics.md): what a table record is, and the as-of join
both layers apply.

A table is a Kafka topic of JSON records, each a version of its key's row valid from its time.
An event is joined with the version of its lookup key whose valid-from time is the greatest at
or before the event time, ties broken by offset (then partition); a version that deletes the
key, or no version at all, joins nothing (the table's fields are NULL). `parse_table_record`
decides a record's validity (an invalid one goes to the table's `.dlq` topic), `TableVersions`
holds a table's versions for the speed layer, `lookup_key` is the text a key compares by.
"""

from __future__ import annotations

from collections.abc import Iterable
from heapq import heappop, heappush
from typing import Any, NamedTuple

from shared.config import TableConfig
from shared.events import (
    MAX_EVENT_MS,
    MIN_EVENT_MS,
    Malformed,
    canonical,
    decode_object,
    parse_event_time,
    text_fault,
)
from shared.expressions import MISSING, read_path

DELETED_FLAG = "deleted"
"""A record whose `deleted` field is `true` ends its key from its valid-from time on."""


class TableRecord(NamedTuple):
    """One valid table record: a version of `key`'s row from `valid_from` (epoch ms) on."""

    key: str
    valid_from: int
    fields: dict[str, Any] | None
    """The record's fields; None: the key is deleted (a tombstone or the `deleted` flag)."""


def lookup_key(value: object) -> str | None:
    """The text a table key or a lookup's `on` value compares by: a string is itself, an
    integer its decimal text; anything else (NULL, a number with a fraction, a boolean) matches
    no key."""
    return canonical(value)


def parse_table_record(
    key: bytes | None, value: bytes | None, timestamp_ms: int, table: TableConfig
) -> TableRecord | Malformed:
    """A table record's validity. A tombstone (no value) deletes the key its record key names
    from the record's timestamp on; a JSON object is a version of the key in `key_field`, valid
    from `time_field` (or the record's timestamp)."""
    if value is None:
        try:
            text = None if key is None else key.decode("utf-8")
        except UnicodeDecodeError:
            text = None
        if text is None or text_fault(text) is not None:
            return Malformed("key_missing", "a tombstone names its key by the record key (UTF-8)")
        return TableRecord(text, timestamp_ms, None)
    fields = decode_object(value)
    if isinstance(fields, Malformed):
        return fields
    raw_key = fields.get(table.key_field)
    text = lookup_key(raw_key)
    if text is None:
        if table.key_field not in fields:
            return Malformed("key_missing", f"the key field {table.key_field!r} is missing")
        return Malformed("key_invalid", f"the key field {table.key_field!r} must be str or int")
    fault = text_fault(text)
    if fault is not None:
        return Malformed(f"key_{fault}", f"the key field {table.key_field!r} cannot be stored")
    valid_from = timestamp_ms
    if table.time_field is not None:
        if table.time_field not in fields:
            return Malformed("time_missing", f"the time field {table.time_field!r} is missing")
        parsed = parse_event_time(fields[table.time_field])
        if parsed is None:
            return Malformed(
                "time_invalid",
                f"the time field {table.time_field!r} is neither integer epoch-ms nor RFC 3339 "
                "with an offset (years 1-9999)",
            )
        valid_from = parsed
    elif not MIN_EVENT_MS <= valid_from <= MAX_EVENT_MS:
        return Malformed("time_invalid", "the record's timestamp is outside the years 1-9999")
    if fields.get(DELETED_FLAG) is True:
        return TableRecord(text, valid_from, None)
    return TableRecord(text, valid_from, fields)


def project(fields: dict[str, Any], paths: Iterable[tuple[str, ...]]) -> dict[str, Any]:
    """Only the paths the metrics read of a record's fields (as nested objects), so a table's
    versions keep what a lookup can answer and nothing else."""
    kept: dict[str, Any] = {}
    for path in paths:
        value = read_path(fields, path)
        if value is MISSING:
            continue
        node = kept
        for step in path[:-1]:
            node = node.setdefault(step, {})
        node[path[-1]] = value
    return kept


_SHARED_FIELDS = 65_536
"""Distinct projected fields a table's versions share at most (`TableVersions._share`)."""

Version = tuple[int, int, int, "dict[str, Any] | None"]
"""(valid_from, offset, partition, fields or None when deleted), in join order."""


class TableVersions:
    """One table's versions by key, for joining events as of their time (the speed layer keeps
    one per table, fed by every record of the table's topic).

    Memory, measured with `bench/tables.py` (1M keys x 3 versions, one field of 8 values
    read): ~311 bytes a version, equal projected fields sharing one dict (568 without).
    `prune` costs what it drops: the keys are kept in a heap by the time their first version
    is superseded (or their deletion takes effect), so a call finds its work without
    scanning every key."""

    def __init__(self) -> None:
        self._versions: dict[str, list[Version]] = {}
        self._due: list[tuple[int, str]] = []
        """(time from which `prune` can shorten a key, key), a heap; stale entries (the key
        changed since) are checked again when popped."""
        self._count = 0
        self._shared: dict[tuple[Any, ...], dict[str, Any]] = {}
        """Projected fields by content, so equal versions hold one dict (see `_share`)."""

    def __len__(self) -> int:
        return self._count

    @property
    def keys(self) -> int:
        return len(self._versions)

    def add(self, record: TableRecord, partition: int, offset: int) -> int | None:
        """Add a version; the valid-from time of the key's next version, which ends the range
        of event times this one joins (None: it joins every later event time)."""
        fields = None if record.fields is None else self._share(record.fields)
        version: Version = (record.valid_from, offset, partition, fields)
        self._count += 1
        versions = self._versions.get(record.key)
        if versions is None:
            versions = self._versions[record.key] = [version]
            at = 0
        else:
            at = len(versions)
            while at and versions[at - 1][:3] > version[:3]:
                at -= 1
            versions.insert(at, version)
        due = _prunable_from(versions)
        if due is not None:
            heappush(self._due, (due, record.key))
        return versions[at + 1][0] if at + 1 < len(versions) else None

    def _share(self, fields: dict[str, Any]) -> dict[str, Any]:
        """The one dict kept for fields equal to `fields`: what lookups read of a table is
        mostly a few distinct values (a section, a country, a plan) repeated over millions of
        versions. Equal means same names, types and values (`1`, `1.0` and `True` differ, as
        do `0.0` and `-0.0`); fields holding an object or a list are kept as they are. The
        dicts are never changed once kept (joins only read them). At most `_SHARED_FIELDS`
        are remembered, then the memory starts afresh, so high-cardinality fields cost one
        dict each as before and no more."""
        try:
            content = tuple(
                (name, type(value), value.hex() if type(value) is float else value)
                for name, value in fields.items()
            )
            kept = self._shared.get(content)
        except TypeError:  # an object or a list: not hashable
            return fields
        if kept is not None:
            return kept
        if len(self._shared) >= _SHARED_FIELDS:
            self._shared.clear()
        self._shared[content] = fields
        return fields

    def as_of(self, key: str | None, time_ms: int) -> dict[str, Any] | None:
        """The fields of `key`'s version valid at `time_ms` (None: no version, or deleted)."""
        versions = self._versions.get(key)  # type: ignore[arg-type]
        if versions is None:
            return None
        for valid_from, _, _, fields in reversed(versions):
            if valid_from <= time_ms:
                return fields
        return None

    def prune(self, before_ms: int, keys: int | None = None) -> int:
        """Forget the versions no event at or after `before_ms` can join (each superseded by
        one valid from then at the latest), and keys deleted by then, for at most `keys` keys
        (the rest at the next call); how many versions were dropped."""
        dropped = 0
        while self._due and self._due[0][0] <= before_ms and keys != 0:
            keys = None if keys is None else keys - 1
            _, key = heappop(self._due)
            versions = self._versions.get(key)
            if versions is None:
                continue
            first = 0
            while first + 1 < len(versions) and versions[first + 1][0] <= before_ms:
                first += 1
            del versions[:first]
            dropped += first
            if versions[0][3] is None and versions[0][0] <= before_ms:
                del versions[0]
                dropped += 1
            if not versions:
                del self._versions[key]
                continue
            due = _prunable_from(versions)
            if due is not None and due > before_ms:
                heappush(self._due, (due, key))
        self._count -= dropped
        return dropped


def _prunable_from(versions: list[Version]) -> int | None:
    """From when `prune` can shorten a key's versions: its second version's valid-from (the
    first is superseded then), or its only version's when that deletes the key."""
    if len(versions) > 1:
        return versions[1][0]
    return versions[0][0] if versions[0][3] is None else None
