"""Rule 12's two safeguards, without services: only errors saying PostgreSQL cannot be
reached make a speed-only answer, and the row kept for it is the one read by the statement
sent last, dated when that statement was sent."""

from __future__ import annotations

import time

import psycopg
import pytest

from serving_layer.batch_view import _unreachable
from serving_layer.errors import BatchViewUnreachable
from serving_layer.served_row import ServedHints, ServedRow


@pytest.mark.parametrize(
    ("error", "unreachable"),
    [
        (BatchViewUnreachable(), True),
        (psycopg.OperationalError("server closed the connection unexpectedly"), True),
        (psycopg.errors.AdminShutdown("terminating connection"), True),
        (psycopg.errors.CannotConnectNow("the database system is shutting down"), True),
        (psycopg.errors.ConnectionFailure("connection failure"), True),
        (psycopg.errors.QueryCanceled("statement timeout"), False),
        (psycopg.errors.OutOfMemory("out of memory"), False),
        (psycopg.errors.DiskFull("could not extend file"), False),
        (psycopg.errors.DeadlockDetected("deadlock detected"), False),
        (psycopg.errors.SerializationFailure("conflict with recovery"), False),
    ],
)
def test_only_an_unreachable_postgres_makes_a_speed_only_answer(
    error: Exception, unreachable: bool
) -> None:
    assert _unreachable(error) is unreachable


def test_a_slow_read_ending_late_does_not_replace_a_newer_row() -> None:
    hints = ServedHints()
    older, newer = ServedRow("100", 1, 1_000), ServedRow("101", 1, 2_000)
    sent_last = time.monotonic()
    hints.set("m", newer, sent_last)  # sent later, answered first
    hints.set("m", older, sent_last - 1.0)  # sent first, answered last
    assert hints.get("m") == newer
    assert hints.read_within("m", 60.0) == newer
    assert hints.read_within("m", 0.0) is None  # dated when sent: now it is too old
    hints.set("m", older, time.monotonic())
    assert hints.get("m") == older
