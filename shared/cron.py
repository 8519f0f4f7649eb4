"""When the batch runner queues its scheduled incremental runs: `hourly` (at minute 0) or a
5-field cron expression (minute hour day-of-month month day-of-week; `*`, `a`, `a-b`, `*/n`,
`a-b/n` and comma lists, ASCII digits; day-of-week 0-7 with 0 and 7 = Sunday; when both day
fields are restricted a day matches either, as in Vixie cron). Times are UTC.

It lives in `shared` so that loading the settings refuses a bad `batch.schedule`, instead of
the runner failing on it when it starts."""

from __future__ import annotations

import re
from datetime import datetime, timedelta
from typing import NamedTuple

from shared.errors import CronError


class _Field(NamedTuple):
    name: str
    lo: int
    hi: int


_FIELDS = (
    _Field("minute", 0, 59),
    _Field("hour", 0, 23),
    _Field("day-of-month", 1, 31),
    _Field("month", 1, 12),
    _Field("day-of-week", 0, 7),
)
_PART = re.compile(r"(\*|([0-9]+)(?:-([0-9]+))?)(?:/([0-9]+))?", re.ASCII)
_LONGEST_MONTH = (31, 29, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31)
_SEARCH_DAYS = 366 * 9
"""Long enough to reach the next 29 February across a skipped leap year (2096 to 2104)."""


class _Refusal(Exception):
    """One field's problem; `Schedule` adds the expression and the field's rules."""


def _number(digits: str, lo: int, hi: int, what: str) -> int:
    if len(digits.lstrip("0")) > len(str(hi)) or not lo <= int(digits) <= hi:
        raise _Refusal(f"{what} {digits} is outside {lo}-{hi}")
    return int(digits)


def _values(text: str, field: _Field) -> frozenset[int]:
    values: set[int] = set()
    for part in text.split(","):
        match = _PART.fullmatch(part)
        if match is None:
            raise _Refusal(f"{part!r} is not *, a number, a range a-b or a step */n or a-b/n")
        body, first_text, last_text, step_text = match.groups()
        step = 1 if step_text is None else _number(step_text, 1, field.hi, "step")
        if body == "*":
            first, last = field.lo, field.hi
        else:
            first = _number(first_text, field.lo, field.hi, "value")
            last = first if last_text is None else _number(last_text, field.lo, field.hi, "value")
            if step_text is not None and last_text is None:
                raise _Refusal(
                    f"the step in {part!r} needs a range: write {first}-{field.hi}/{step} "
                    f"or */{step}"
                )
            if first > last:
                raise _Refusal(f"the range {part!r} runs backwards: write {last}-{first}")
        values.update(range(first, last + 1, step))
    return frozenset(values)


class Schedule:
    """A parsed schedule; `next_after(t)` is the first firing time strictly after `t`."""

    def __init__(self, expression: str) -> None:
        self.expression = expression
        text = "0 * * * *" if expression.strip() == "hourly" else expression
        parts = text.split()
        if len(parts) != len(_FIELDS):
            raise CronError(
                f"cron {expression!r} has {len(parts)} fields; write 'hourly' or 5 fields "
                "(minute hour day-of-month month day-of-week, UTC), e.g. '0 * * * *'"
            )
        fields: list[frozenset[int]] = []
        for part, field in zip(parts, _FIELDS, strict=True):
            try:
                fields.append(_values(part, field))
            except _Refusal as exc:
                raise CronError(
                    f"cron {expression!r}, {field.name} field {part!r}: {exc}; the "
                    f"{field.name} takes {field.lo}-{field.hi} as *, n, a-b, */n or a-b/n "
                    "(ASCII digits), comma-separated"
                ) from None
        self.minutes, self.hours, self.days, self.months, weekdays = fields
        self.weekdays = frozenset(d % 7 for d in weekdays)
        self.any_day = parts[2] == "*"
        self.any_weekday = parts[4] == "*"
        if self.any_weekday and not any(
            day <= _LONGEST_MONTH[month - 1] for month in self.months for day in self.days
        ):
            raise CronError(
                f"cron {expression!r} never fires: no day-of-month it lists exists in the "
                "months it lists; pick days that exist in those months (29 February fires in "
                "leap years only)"
            )

    def _day_matches(self, moment: datetime) -> bool:
        if moment.month not in self.months:
            return False
        dom = moment.day in self.days
        dow = (moment.weekday() + 1) % 7 in self.weekdays
        if self.any_day or self.any_weekday:
            return dom and dow
        return dom or dow

    def next_after(self, moment: datetime) -> datetime:
        candidate = moment.replace(second=0, microsecond=0) + timedelta(minutes=1)
        limit = candidate + timedelta(days=_SEARCH_DAYS)
        while candidate < limit:
            if not self._day_matches(candidate):
                candidate = (candidate + timedelta(days=1)).replace(hour=0, minute=0)
            elif candidate.hour not in self.hours:
                candidate = (candidate + timedelta(hours=1)).replace(minute=0)
            elif candidate.minute not in self.minutes:
                candidate += timedelta(minutes=1)
            else:
                return candidate
        raise CronError(f"cron {self.expression!r} does not fire within {_SEARCH_DAYS} days")
