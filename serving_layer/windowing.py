"""The windows a query asks for, as pure functions: any multiple of the base cell, hopping by
`step` (a multiple of the base cell too), and — for windows of whole days — aligned to local
midnight in an IANA time zone (`tz`), so a day across a DST change lasts 23 or 25 hours.
Windows are half-open `[start, end)` in UTC epoch milliseconds; every bound must fall on a
base cell boundary, since a window is composed from stored cells. How many windows a range
holds, and where they begin and end, is arithmetic (`WindowSpec.extent`): a query is bounded
before any list of windows is built."""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import UTC, date, datetime
from typing import NamedTuple
from zoneinfo import ZoneInfo

from shared.durations import format_duration

DAY_MS = 86_400_000
_EPOCH_DAY = date(1970, 1, 1).toordinal()
_CYCLE_DAYS = 146_097
"""400 Gregorian years (a whole number of weeks): dates and weekdays repeat, and so does a
zone's offset before its first transition (local mean time) and after its last one (a yearly
rule), so a local day beyond datetime's years 1-9999 is computed 400 years inwards."""
_CYCLE_MS = _CYCLE_DAYS * DAY_MS
_COMPUTABLE_DAYS = range(
    date(2, 1, 1).toordinal() - _EPOCH_DAY, date(9999, 1, 1).toordinal() - _EPOCH_DAY
)
"""Days (from 1970-01-01) datetime and ZoneInfo compute with directly: a year inside their
range, whatever the zone's offset, and no zone has a transition outside it."""


class WindowError(ValueError):
    """The windows asked for cannot be composed from the metric's cells (says why)."""


class WindowExtent(NamedTuple):
    """Where the windows starting in a range lie, found without building them."""

    windows: int
    """How many windows start in the range (exact, except that a local day a zone skipped
    entirely counts, though it has no window)."""
    first_ms: int
    """Where the first of them starts (where it would, when there is none)."""
    end_ms: int
    """Where the last of them ends (`first_ms` when there is none)."""


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

    def extent(self, start_ms: int, end_ms: int) -> WindowExtent:
        """How many windows start in `[start_ms, end_ms)`, where the first starts and the last
        ends: a few divisions (in local days, a few local midnights)."""
        first, stop = self._slot_at(start_ms), self._slot_at(end_ms)
        begin = self._bounds(first)[0]
        if stop <= first:
            return WindowExtent(0, begin, begin)
        return WindowExtent(stop - first, begin, self._bounds(stop - 1)[1])

    def nth_start(self, start_ms: int, n: int) -> int:
        """Where the window `n` steps after the first one starting at or after `start_ms`
        starts: the `end` that keeps `n` windows."""
        return self._bounds(self._slot_at(start_ms) + n)[0]

    def windows(self, start_ms: int, end_ms: int) -> list[tuple[int, int]]:
        """The windows whose start lies in `[start_ms, end_ms)`, ascending (bound their
        number with `extent` first: this builds them all)."""
        first, stop = self._slot_at(start_ms), self._slot_at(end_ms)
        if not self.local_days:
            step = self.step_ms
            return [(s, s + self.size_ms) for s in range(first * step, stop * step, step)]
        bounds = map(self._bounds, range(first, stop))
        return [(s, e) for s, e in bounds if e > s]  # a local day a zone skipped has no window

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

    def _slot_at(self, at_ms: int) -> int:
        """The first slot whose window starts at or after `at_ms`. Slot k is the window k steps
        from the epoch: starting at k * step in UTC, or at the local midnight of day k * step
        in local days."""
        if not self.local_days:
            return -(-at_ms // self.step_ms)
        step = self.step_ms // DAY_MS
        slot = self._local_day(at_ms) // step
        return slot if self._midnight(slot * step) >= at_ms else slot + 1

    def _bounds(self, slot: int) -> tuple[int, int]:
        """Slot `slot`'s window `[start, end)` (empty for a local day a zone skipped)."""
        if not self.local_days:
            start = slot * self.step_ms
            return start, start + self.size_ms
        day = slot * (self.step_ms // DAY_MS)
        return self._midnight(day), self._midnight(day + self.size_ms // DAY_MS)

    def _local_day(self, at_ms: int) -> int:
        cycles = _cycles_outside(at_ms // DAY_MS)
        moment = datetime.fromtimestamp((at_ms - cycles * _CYCLE_MS) / 1000, UTC)
        return moment.astimezone(self.tz).date().toordinal() - _EPOCH_DAY + cycles * _CYCLE_DAYS

    def _midnight(self, day: int) -> int:
        """Where local day `day` begins: its midnight, or — when a change of offset skipped
        that midnight — the first instant whose local date is `day` or later (the end of the
        gap; for a day a zone skipped entirely, the next day's start)."""
        cycles = _cycles_outside(day)
        if cycles:
            return self._midnight(day - cycles * _CYCLE_DAYS) + cycles * _CYCLE_MS
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


def _cycles_outside(day: int) -> int:
    """How many 400-year cycles day `day` lies after `_COMPUTABLE_DAYS` (negative: before
    it); moved by that many it lands inside, on the same side of every zone's transitions."""
    if day < _COMPUTABLE_DAYS.start:
        return (day - _COMPUTABLE_DAYS.start) // _CYCLE_DAYS
    if day >= _COMPUTABLE_DAYS.stop:
        return (day - _COMPUTABLE_DAYS.stop) // _CYCLE_DAYS + 1
    return 0
