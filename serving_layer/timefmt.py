"""Times at the API edge: RFC 3339 UTC with `Z` out; RFC 3339 with offset or epoch ms in."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from functools import lru_cache

from shared.events import MAX_EVENT_MS, MIN_EVENT_MS, parse_event_time

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_CYCLE_MS = 146_097 * 86_400_000
"""400 Gregorian years: the calendar repeats, so a time outside datetime's years 1-9999 is
written as the one a whole number of cycles inwards, with the year moved back."""


@lru_cache(maxsize=1 << 16)
def format_time(ms: int) -> str:
    """Cached: the same window starts recur across requests (1,440 per one-day query).
    Defined for every `ms`: the end of year 9999, the exclusive end of its last windows, is
    `10000-01-01T00:00:00Z`."""
    cycles = 0 if MIN_EVENT_MS <= ms <= MAX_EVENT_MS else (ms - MIN_EVENT_MS) // _CYCLE_MS
    moment = _EPOCH + timedelta(milliseconds=ms - cycles * _CYCLE_MS)
    text = moment.isoformat(timespec="milliseconds" if ms % 1000 else "seconds")
    text = text.replace("+00:00", "Z")
    return f"{int(text[:4]) + 400 * cycles:04d}{text[4:]}" if cycles else text


def parse_time(text: str) -> int | None:
    """Epoch ms from `2024-05-01T00:00:00Z` (any offset) or from integer epoch milliseconds,
    exactly as written: ASCII digits (`int` would also read other scripts' digits) and no
    space around them (`int` would skip it)."""
    if text.isascii() and text.lstrip("-").isdigit():
        return parse_event_time(int(text))
    return parse_event_time(text)
