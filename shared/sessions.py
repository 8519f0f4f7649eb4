"""Session windows (rule 13 in docs/semantics.md) as pure functions: which session each of a
key's events belongs to, computed two ways that must agree — in one vectorized pass over
events sorted by key and time (`session_firsts`, the batch layer's), and event by event in any
arrival order (`SessionChain`, the speed layer's).

The rule (`SessionRule.splits`): in a key's events in time order, an event starts a new
session when at least `gap` has passed since the session's latest event (`t - last >= gap`,
as Spark's `session_window`) or when it is at least `max_duration` after the session's first
event; otherwise it joins the session. A session is named by its first event's time. Since a
split depends on the session's first event, one event arriving out of order can move the
splits of every later session of its key up to the next gap; both ways recompute exactly
that and no more."""

from __future__ import annotations

from bisect import bisect_right
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
import numpy.typing as npt


class Session(NamedTuple):
    """A session of one key: its first and last event times and how many events it holds."""

    first: int
    last: int
    events: int


@dataclass(frozen=True, slots=True)
class SessionRule:
    """When an event starts a new session (milliseconds; `0 < gap_ms < max_duration_ms`)."""

    gap_ms: int
    max_duration_ms: int

    def __post_init__(self) -> None:
        if not 0 < self.gap_ms < self.max_duration_ms:
            raise ValueError(
                f"a session's gap ({self.gap_ms} ms) must be positive and shorter than its "
                f"max_duration ({self.max_duration_ms} ms)"
            )

    def splits(self, first_ms: int, last_ms: int, time_ms: int) -> bool:
        """Whether an event at `time_ms` (not before `last_ms`) starts a new session after the
        session whose first and latest events are at `first_ms` and `last_ms`."""
        return time_ms - last_ms >= self.gap_ms or time_ms - first_ms >= self.max_duration_ms


def session_firsts(
    times: npt.NDArray[np.int64], new_key: npt.NDArray[np.bool_], rule: SessionRule
) -> npt.NDArray[np.int64]:
    """Each event's session (the time of its first event), for events sorted by key and then
    time; `new_key[i]` is True where row `i` holds a different key than row `i - 1` (row 0
    always starts one).

    Gaps are found for every row at once; only a run of events without a gap that spans at
    least `max_duration` is split further, one session at a time by a binary search for the
    first event `max_duration` after the session's first."""
    count = len(times)
    if count == 0:
        return np.empty(0, dtype=np.int64)
    starts = np.empty(count, dtype=np.bool_)
    starts[0] = True
    starts[1:] = new_key[1:] | (np.diff(times) >= rule.gap_ms)
    run_begins = np.flatnonzero(starts)
    run_ends = np.append(run_begins[1:], count)
    firsts = np.repeat(times[run_begins], run_ends - run_begins)
    spans = times[run_ends - 1] - times[run_begins]
    for run in np.flatnonzero(spans >= rule.max_duration_ms):
        position, end = int(run_begins[run]), int(run_ends[run])
        while position < end:
            first = times[position]
            ends_at = first + rule.max_duration_ms
            split = position + int(np.searchsorted(times[position:end], ends_at))
            firsts[position:split] = first
            position = split
    return firsts


class SessionChain:
    """One key's sessions as the speed layer cuts them again: events in time order, each with
    its session's first event time, after an optional `seed` — the session just before them
    (its first and latest event times) whose own events are held elsewhere.

    `add` takes events in any order and re-splits only from the new event to the first later
    event whose session is unchanged (after it nothing can change)."""

    __slots__ = ("_firsts", "_times", "rule", "seed")

    def __init__(self, rule: SessionRule, seed: Session | None = None) -> None:
        self.rule = rule
        self.seed = seed
        self._times: list[int] = []
        self._firsts: list[int] = []

    def __len__(self) -> int:
        return len(self._times)

    def add(self, time_ms: int) -> set[int]:
        """Hold an event at `time_ms`; the sessions (by first event time) that gained, lost or
        changed an event, including any that no longer exist. A ValueError for an event
        before the seed's latest event: it belongs to events this chain no longer holds."""
        if self.seed is not None and time_ms < self.seed.last:
            raise ValueError(
                f"event at {time_ms} precedes the chain's seed (latest event {self.seed.last})"
            )
        position = bisect_right(self._times, time_ms)
        self._times.insert(position, time_ms)
        self._firsts.insert(position, time_ms)
        return self._resplit(position)

    def sessions(self) -> list[Session]:
        """The held events' sessions in time order; one continuing the seed is named by the
        seed's first event and counts only the held events."""
        sessions: list[Session] = []
        for time_ms, first in zip(self._times, self._firsts, strict=True):
            if sessions and sessions[-1].first == first:
                sessions[-1] = Session(first, time_ms, sessions[-1].events + 1)
            else:
                sessions.append(Session(first, time_ms, 1))
        return sessions

    def _resplit(self, position: int) -> set[int]:
        """Re-split from the new event at `position` (its placeholder session is no session)
        on, up to the first later event whose session is unchanged."""
        changed: set[int] = set()
        if position > 0:
            first: int | None = self._firsts[position - 1]
            last = self._times[position - 1]
        elif self.seed is not None:
            first, last = self.seed.first, self.seed.last
        else:
            first, last = None, 0
        for index in range(position, len(self._times)):
            time_ms = self._times[index]
            if first is None or self.rule.splits(first, last, time_ms):
                first = time_ms
            old = self._firsts[index]
            if index > position:
                if old == first:
                    break
                changed.add(old)
            changed.add(first)
            self._firsts[index] = first
            last = time_ms
        return changed
