"""Durations as written in the config (`30s`, `1m`, `1h`, `1d`), held as integer milliseconds."""

import re

_UNITS_MS = {"s": 1_000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}
_DURATION = re.compile(r"\s*([0-9]+)\s*([smhd])\s*", re.ASCII)
MAX_DURATION_MS = 36_500 * _UNITS_MS["d"]
"""100 years: longer than any window, grace or query range means anything, and small enough
that window arithmetic on epoch milliseconds stays far inside 64-bit integers."""
_TOO_LONG = "longer than the maximum 36500d (100 years); write a shorter duration"


def parse_duration(text: str | int) -> int:
    """Return milliseconds for `<n><unit>` with unit s, m, h or d (an int is taken as ms)."""
    if isinstance(text, bool) or not isinstance(text, str | int):
        raise ValueError("expected a duration such as '30s', '1m', '1h' or '1d'")
    if isinstance(text, int):
        if text < 0:
            raise ValueError("a duration cannot be negative")
        if text > MAX_DURATION_MS:
            raise ValueError(f"{text} ms is {_TOO_LONG}")
        return text
    match = _DURATION.fullmatch(text)
    if not match:
        raise ValueError(
            f"{text!r} is not a duration: write <number><unit> with ASCII digits 0-9, "
            "unit one of s, m, h, d (e.g. 30s, 5m)"
        )
    digits, unit = match.groups()
    huge = len(digits.lstrip("0")) > len(str(MAX_DURATION_MS))  # int() refuses 4300+ digits
    if huge or int(digits) * _UNITS_MS[unit] > MAX_DURATION_MS:
        raise ValueError(f"{text!r} is {_TOO_LONG}")
    return int(digits) * _UNITS_MS[unit]


def format_duration(ms: int) -> str:
    """The shortest `<n><unit>` that equals `ms` (falls back to `<n>ms`)."""
    for unit in ("d", "h", "m", "s"):
        size = _UNITS_MS[unit]
        if ms and ms % size == 0:
            return f"{ms // size}{unit}"
    return f"{ms}ms"
