"""The runner's schedule: `hourly` and 5-field cron, refused with the field and its range."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from batch_layer.errors import CronError
from batch_layer.schedule import Schedule
from shared.errors import ConfigError


def at(text: str) -> datetime:
    return datetime.fromisoformat(text).replace(tzinfo=UTC)


@pytest.mark.parametrize(
    ("expression", "after", "expected"),
    [
        ("hourly", "2026-03-01T10:00:00", "2026-03-01T11:00:00"),
        ("hourly", "2026-03-01T10:59:59", "2026-03-01T11:00:00"),
        ("*/15 * * * *", "2026-03-01T10:16:00", "2026-03-01T10:30:00"),
        ("5 3 * * *", "2026-03-01T03:05:00", "2026-03-02T03:05:00"),
        ("0 9 * * 1-5", "2026-02-27T10:00:00", "2026-03-02T09:00:00"),  # Fri -> Mon
        ("0 0 1 * *", "2026-02-15T00:00:00", "2026-03-01T00:00:00"),
        ("30 2 * * 0", "2026-02-28T00:00:00", "2026-03-01T02:30:00"),  # Sunday = 0
        ("30 2 * * 7", "2026-02-28T00:00:00", "2026-03-01T02:30:00"),  # Sunday = 7
        ("0 0 13 * 5", "2026-03-01T00:00:00", "2026-03-06T00:00:00"),  # day OR weekday
        ("0,30 8-9 * * *", "2026-03-01T08:31:00", "2026-03-01T09:00:00"),
    ],
)
def test_next_after(expression: str, after: str, expected: str) -> None:
    assert Schedule(expression).next_after(at(after)) == at(expected)


def test_29_february_fires_in_leap_years_only() -> None:
    schedule = Schedule("0 0 29 2 *")
    assert schedule.next_after(at("2026-03-01T00:00:00")) == at("2028-02-29T00:00:00")
    assert schedule.next_after(at("2096-03-01T00:00:00")) == at("2104-02-29T00:00:00")


@pytest.mark.parametrize(
    ("expression", "why"),
    [
        ("* * * *", "has 4 fields; write 'hourly' or 5 fields"),
        ("", "has 0 fields"),
        ("61 * * * *", "minute field '61': value 61 is outside 0-59"),
        ("0 24 * * *", "hour field '24': value 24 is outside 0-23"),
        ("* * 0 * *", "day-of-month field '0': value 0 is outside 1-31"),
        ("0 0 1 13 *", "month field '13': value 13 is outside 1-12"),
        ("0 0 * * 8", "day-of-week field '8': value 8 is outside 0-7"),
        ("a * * * *", "minute field 'a': 'a' is not *, a number"),
        ("*/0 * * * *", "minute field '*/0': step 0 is outside 1-59"),
        ("*/60 * * * *", "step 60 is outside 1-59"),
        ("5/15 * * * *", "the step in '5/15' needs a range: write 5-59/15 or */15"),
        ("30-10 * * * *", "the range '30-10' runs backwards: write 10-30"),
        ("1,,2 * * * *", "'' is not *, a number"),
        ("\uff11 * * * *", "minute field '\uff11': '\uff11' is not *, a number"),
        ("0 \u0661 * * *", "hour field"),
        ("0 " + "9" * 5000 + " * * *", "is outside 0-23"),
        ("0 0 31 2 *", "'0 0 31 2 *' never fires"),
        ("0 0 30,31 2 *", "never fires"),
        ("0 0 31 4,6,9,11 *", "never fires"),
    ],
)
def test_invalid(expression: str, why: str) -> None:
    with pytest.raises(CronError) as info:
        Schedule(expression)
    assert why in str(info.value)
    assert isinstance(info.value, ConfigError), "the settings refuse it at load"


@pytest.mark.parametrize(
    ("expression", "fires"),
    [
        ("0 0 31 2 1", "2027-02-01T00:00:00"),  # 31 February never; February's Mondays
        ("0 0 31 * *", "2026-03-31T00:00:00"),
        ("0 0 31 1-2 *", "2027-01-31T00:00:00"),
    ],
)
def test_a_day_that_exists_somewhere_fires(expression: str, fires: str) -> None:
    """A day of the month some listed month has fires on it; with a weekday listed too, a
    day matches either field, so 31 February with Monday fires on February's Mondays."""
    assert Schedule(expression).next_after(at("2026-03-01T00:00:00")) == at(fires)
