"""A block of record values as newline-delimited JSON for `pyarrow.json`, when pyarrow reads
it as the shared parser (`shared.events.decode_json`) would, as far as bytes show."""

from __future__ import annotations

from collections.abc import Sequence

NESTING_BOUND = 512
"""A value with at most this many `{`/`[` bytes nests at most this deep, which both parsers
read; deeper nesting is refused by the shared parser (RecursionError) and read by pyarrow."""


def may_nest_deeply(value: bytes) -> bool:
    """Whether a value may nest deeper than `NESTING_BOUND`."""
    return len(value) > NESTING_BOUND and value.count(b"{") + value.count(b"[") > NESTING_BOUND


def json_lines(values: Sequence[bytes | None]) -> bytes | None:
    """The values joined by line breaks, or None when pyarrow may read the block otherwise
    than the shared parser or as another number of rows: a value is missing or holds a line
    break; the block holds `NaN`/`Infinity` (pyarrow accepts them, JSON does not) or a `\\u`
    escape (lone surrogates are rejected by one parser and not always by the other); a value
    may nest deeper than `NESTING_BOUND`."""
    if any(v is None for v in values):
        return None
    data = b"\n".join(values)  # type: ignore[arg-type]
    if (
        data.count(b"\n") != len(values) - 1
        or b"\r" in data
        or b"NaN" in data
        or b"Infinity" in data
        or b"\\u" in data
    ):
        return None
    if max(map(len, values)) > NESTING_BOUND and any(map(may_nest_deeply, values)):  # type: ignore[arg-type]
        return None
    return data
