"""The runner's schedule: `hourly` and minimal 5-field cron."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from batch_layer.errors import CronError
from batch_layer.schedule import Schedule


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


@pytest.mark.parametrize(
    "expression", ["* * * *", "61 * * * *", "* * 0 * *", "a * * * *", "*/0 * * * *"]
)
def test_invalid(expression: str) -> None:
    with pytest.raises(CronError):
        Schedule(expression)
