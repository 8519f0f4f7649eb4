"""The windows a query asks for, as pure functions: any multiple of the base cell, hopping by
`step` (a multiple of the base cell too), and — for windows of whole days — aligned to local
midnight in an IANA time zone (`tz`), so a day across a DST change lasts 23 or 25 hours.
Windows are half-open `[start, end)` in UTC epoch milliseconds; every bound must fall on a
base cell boundary, since a window is composed from stored cells."""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import UTC, date, datetime
from zoneinfo import ZoneInfo

from shared.durations import format_duration

DAY_MS = 86_400_000
_EPOCH_DAY = date(1970, 1, 1).toordinal()


class WindowError(ValueError):
    """The windows asked for cannot be composed from the metric's cells (says why)."""


@dataclass(frozen=True)
class WindowSpec:
    size_ms: int
    step_ms: int
    tz: ZoneInfo | None = None
    """Aligns windows (and steps) of whole days to local midnight; None: UTC."""

    @property
    def local_days(self) -> bool:
        """Whether windows are counted in local days (a zone and whole-day sizes)."""
        return self.tz is not None and self.size_ms % DAY_MS == 0 and self.step_ms % DAY_MS == 0

    def windows(self, start_ms: int, end_ms: int) -> list[tuple[int, int]]:
        """The windows whose start lies in `[start_ms, end_ms)`, ascending."""
        if not self.local_days:
            first = -(-start_ms // self.step_ms) * self.step_ms
            return [(s, s + self.size_ms) for s in range(first, end_ms, self.step_ms)]
        size, step = self.size_ms // DAY_MS, self.step_ms // DAY_MS
        day = self._local_day(start_ms)
        day -= day % step
        out: list[tuple[int, int]] = []
        while True:
            start = self._midnight(day)
            if start >= end_ms:
                return out
            end = self._midnight(day + size)
            if start >= start_ms and end > start:  # a local day a zone skipped has no window
                out.append((start, end))
            day += step

    def window_at(self, at_ms: int) -> tuple[int, int]:
        """The window of this size (stepping by its size) that holds `at_ms`."""
        if not self.local_days:
            start = at_ms - at_ms % self.size_ms
            return start, start + self.size_ms
        size = self.size_ms // DAY_MS
        day = self._local_day(at_ms)
        day -= day % size
        return self._midnight(day), self._midnight(day + size)

    def check_cells(self, windows: list[tuple[int, int]], base_ms: int) -> None:
        """Raise WindowError unless every bound lies on a base cell boundary."""
        for bound in (b for window in windows for b in window):
            if bound % base_ms:
                offset = bound % DAY_MS
                raise WindowError(
                    f"tz={self.tz} puts local midnight at {format_duration(offset)} past UTC "
                    f"midnight, not on a {format_duration(base_ms)} cell boundary; this metric "
                    f"would need a base window dividing {format_duration(math.gcd(offset, DAY_MS))}"
                )

    def _local_day(self, at_ms: int) -> int:
        local = datetime.fromtimestamp(at_ms / 1000, UTC).astimezone(self.tz)
        return local.date().toordinal() - _EPOCH_DAY

    def _midnight(self, day: int) -> int:
        """Where local day `day` begins: its midnight, or — when a change of offset skipped
        that midnight — the first instant whose local date is `day` or later (the end of the
        gap; for a day a zone skipped entirely, the next day's start)."""
        local = datetime.combine(date.fromordinal(day + _EPOCH_DAY), datetime.min.time(), self.tz)
        after = int(local.timestamp())  # a skipped midnight read with the earlier offset
        if self._local_day(after * 1000) == day:
            return after * 1000
        before = int(local.replace(fold=1).timestamp())  # ... and with the later one
        while before < after:  # the gap's end: the first second at or past local day `day`
            middle = (before + after) // 2
            if self._local_day(middle * 1000) >= day:
                after = middle
            else:
                before = middle + 1
        return after * 1000
