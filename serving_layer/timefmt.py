"""Times at the API edge: RFC 3339 UTC with `Z` out; RFC 3339 with offset or epoch ms in."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from functools import lru_cache

from shared.events import parse_event_time

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


@lru_cache(maxsize=1 << 16)
def format_time(ms: int) -> str:
    """Cached: the same window starts recur across requests (1,440 per one-day query)."""
    moment = _EPOCH + timedelta(milliseconds=ms)
    text = moment.isoformat(timespec="milliseconds" if ms % 1000 else "seconds")
    return text.replace("+00:00", "Z")


def parse_time(text: str) -> int | None:
    """Epoch ms from `2024-05-01T00:00:00Z` (any offset) or from integer epoch milliseconds."""
    stripped = text.strip()
    if stripped.lstrip("-").isdigit():
        return parse_event_time(int(stripped))
    return parse_event_time(stripped)
