"""When the runner queues its scheduled incremental runs: `hourly` (at minute 0) or a 5-field
cron expression (minute hour day-of-month month day-of-week; `*`, `a`, `a-b`, `*/n`, `a-b/n`
and comma lists; day-of-week 0-7 with 0 and 7 = Sunday; when both day fields are restricted a
day matches either, as in Vixie cron). Times are UTC."""

from __future__ import annotations

from datetime import datetime, timedelta

from batch_layer.errors import CronError

_RANGES = ((0, 59), (0, 23), (1, 31), (1, 12), (0, 7))


def _field(text: str, lo: int, hi: int) -> frozenset[int]:
    values: set[int] = set()
    for part in text.split(","):
        body, _, step_text = part.partition("/")
        step = int(step_text) if step_text else 1
        if body == "*":
            first, last = lo, hi
        elif "-" in body:
            a, b = body.split("-", 1)
            first, last = int(a), int(b)
        else:
            first = last = int(body)
            if step_text:
                last = hi
        if step < 1 or first < lo or last > hi or first > last:
            raise CronError(f"cron field {text!r} is outside {lo}-{hi}")
        values.update(range(first, last + 1, step))
    return frozenset(values)


class Schedule:
    """A parsed schedule; `next_after(t)` is the first firing time strictly after `t`."""

    def __init__(self, expression: str) -> None:
        text = "0 * * * *" if expression.strip() == "hourly" else expression
        parts = text.split()
        if len(parts) != 5:
            raise CronError("schedule must be 'hourly' or a 5-field cron expression")
        try:
            fields = [_field(p, lo, hi) for p, (lo, hi) in zip(parts, _RANGES, strict=True)]
        except ValueError as exc:
            raise CronError(f"invalid cron expression {expression!r}: {exc}") from exc
        self.minutes, self.hours, self.days, self.months, weekdays = fields
        self.weekdays = frozenset(d % 7 for d in weekdays)
        self.any_day = parts[2] == "*"
        self.any_weekday = parts[4] == "*"

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
        limit = candidate + timedelta(days=366 * 5)
        while candidate < limit:
            if not self._day_matches(candidate):
                candidate = (candidate + timedelta(days=1)).replace(hour=0, minute=0)
            elif candidate.hour not in self.hours:
                candidate = (candidate + timedelta(hours=1)).replace(minute=0)
            elif candidate.minute not in self.minutes:
                candidate += timedelta(minutes=1)
            else:
                return candidate
        raise CronError("the cron expression never fires")
