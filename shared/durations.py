"""Durations as written in the config (`30s`, `1m`, `1h`, `1d`), held as integer milliseconds."""

import re

_UNITS_MS = {"s": 1_000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}
_DURATION = re.compile(r"^\s*(\d+)\s*([smhd])\s*$")


def parse_duration(text: str | int) -> int:
    """Return milliseconds for `<n><unit>` with unit s, m, h or d (an int is taken as ms)."""
    if isinstance(text, bool):
        raise ValueError("expected a duration such as '30s', '1m', '1h' or '1d'")
    if isinstance(text, int):
        if text < 0:
            raise ValueError("a duration cannot be negative")
        return text
    match = _DURATION.match(text)
    if not match:
        raise ValueError(
            f"{text!r} is not a duration: write <number><unit>, unit one of s, m, h, d"
        )
    return int(match.group(1)) * _UNITS_MS[match.group(2)]


def format_duration(ms: int) -> str:
    """The shortest `<n><unit>` that equals `ms` (falls back to `<n>ms`)."""
    for unit in ("d", "h", "m", "s"):
        size = _UNITS_MS[unit]
        if ms and ms % size == 0:
            return f"{ms // size}{unit}"
    return f"{ms}ms"
