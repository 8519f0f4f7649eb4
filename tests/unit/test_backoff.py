"""The outage backoff: capped doubling, one log line per change of state, `due` gating."""

from __future__ import annotations

import logging
import time

import pytest

from shared.backoff import Backoff


def test_delays_double_up_to_the_cap_and_reset_on_recovery(
    caplog: pytest.LogCaptureFixture,
) -> None:
    changes: list[bool] = []
    failures: list[int] = []
    backoff = Backoff(
        "redis",
        0.5,
        3.0,
        logging.getLogger("test"),
        on_change=changes.append,
        on_failure=lambda: failures.append(1),
    )
    assert not backoff.down and backoff.due()
    with caplog.at_level(logging.INFO, logger="test"):
        delays = [backoff.failed(ConnectionError("refused")) for _ in range(6)]
        assert delays == [0.5, 1.0, 2.0, 3.0, 3.0, 3.0]
        assert backoff.down and not backoff.due()
        backoff.recovered()
        backoff.recovered()
        assert backoff.failed(ConnectionError("again")) == 0.5
    downs = [r for r in caplog.records if "event=store_down" in r.getMessage()]
    ups = [r for r in caplog.records if "event=store_recovered" in r.getMessage()]
    assert len(downs) == 2 and len(ups) == 1
    assert "ConnectionError" in downs[0].getMessage() and "refused" in downs[0].getMessage()
    assert changes == [True, False, True] and len(failures) == 7


def test_due_after_the_delay() -> None:
    backoff = Backoff("postgres", 0.05, 0.05, logging.getLogger("test"))
    backoff.failed(OSError("down"))
    assert not backoff.due()
    time.sleep(0.06)
    assert backoff.due() and backoff.down
