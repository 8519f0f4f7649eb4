"""Riding out an outage of a store (Redis, PostgreSQL, Kafka): a long-running process never
exits because a store went away; it retries with a capped exponential backoff and says so once
when the store goes down and once when it is back, not once per attempt (a 30 s outage would
otherwise bury the log in identical tracebacks)."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable


class Backoff:
    """The state of one store as a process sees it: up, or down since some time with a next
    attempt due after a delay that doubles from `initial_s` up to `max_s`.

    `failed` records a failed attempt and returns how long to wait; `recovered` records a
    success; `due` says whether an optional attempt (a periodic refresh, a cleanup) should be
    made now. `on_change(down)` is called on each change of state (e.g. to set a gauge),
    `on_failure()` on each failed attempt (e.g. to count it)."""

    def __init__(
        self,
        store: str,
        initial_s: float,
        max_s: float,
        log: logging.Logger,
        on_change: Callable[[bool], None] | None = None,
        on_failure: Callable[[], None] | None = None,
    ) -> None:
        self.store = store
        self.initial_s = initial_s
        self.max_s = max(max_s, initial_s)
        self._log = log
        self._on_change = on_change
        self._on_failure = on_failure
        self.attempts = 0
        """Failed attempts since the store was last reachable."""
        self._down_since: float | None = None
        self._next_at = 0.0

    @property
    def down(self) -> bool:
        return self._down_since is not None

    def delay(self) -> float:
        """The wait after the current number of failed attempts."""
        if not self.attempts:
            return 0.0
        return float(min(self.max_s, self.initial_s * 2 ** min(self.attempts - 1, 32)))

    def failed(self, error: BaseException) -> float:
        """Record a failed attempt; returns the seconds to wait before the next one."""
        now = time.monotonic()
        self.attempts += 1
        wait = self.delay()
        self._next_at = now + wait
        if self._on_failure is not None:
            self._on_failure()
        if self._down_since is None:
            self._down_since = now
            self._log.warning(
                "event=store_down store=%s error=%s: %s; retrying with backoff up to %.0f s",
                self.store,
                type(error).__name__,
                _one_line(error),
                self.max_s,
            )
            if self._on_change is not None:
                self._on_change(True)
        return wait

    def recovered(self) -> None:
        """Record a successful attempt (cheap when the store was up anyway)."""
        if self._down_since is None:
            return
        outage = time.monotonic() - self._down_since
        self._log.info(
            "event=store_recovered store=%s after_s=%.1f failed_attempts=%d",
            self.store,
            outage,
            self.attempts,
        )
        self._down_since = None
        self.attempts = 0
        self._next_at = 0.0
        if self._on_change is not None:
            self._on_change(False)

    def due(self) -> bool:
        """Whether an attempt may be made now (always, unless backing off)."""
        return self._down_since is None or time.monotonic() >= self._next_at


def _one_line(error: BaseException) -> str:
    text = str(error).strip().replace("\n", " ")
    return text[:300] or "(no message)"
