"""The oracle's sessionization (the rule a session metric will be held to in both layers),
by hand-computed cases, and the property both layers will rely on: an event at or after a
horizon changes no session that starts before the last one starting at or before it."""

from __future__ import annotations

import random

from hypothesis import given, settings
from hypothesis import strategies as st

from tests.oracle import Session, sessionize

GAP, MAX = 30, 100


def test_a_gap_of_exactly_gap_starts_a_new_session() -> None:
    assert sessionize([0, 29, 58], GAP, MAX) == [Session(0, 58, 3)]
    assert sessionize([0, 30], GAP, MAX) == [Session(0, 0, 1), Session(30, 30, 1)]


def test_a_session_is_split_at_max_duration_after_its_first_event() -> None:
    times = [0, 20, 40, 60, 80, 100, 120]  # never a gap: split at 100 after 0
    assert sessionize(times, GAP, MAX) == [Session(0, 80, 5), Session(100, 120, 2)]


def test_order_and_equal_times_do_not_matter() -> None:
    times = [50, 10, 10, 0, 90]
    assert sessionize(times, GAP, MAX) == [
        Session(0, 10, 3),
        Session(50, 50, 1),
        Session(90, 90, 1),
    ]


def test_a_late_event_bridges_two_sessions_and_moves_the_later_split() -> None:
    times = [0, 20, 60, 80, 100, 150]
    assert sessionize(times, GAP, MAX) == [
        Session(0, 20, 2),
        Session(60, 100, 3),
        Session(150, 150, 1),
    ]
    # 40 bridges 20 and 60: one session from 0, split at 100 (max duration), not at 60
    assert sessionize([*times, 40], GAP, MAX) == [
        Session(0, 80, 5),
        Session(100, 100, 1),
        Session(150, 150, 1),
    ]


@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.integers(0, 600), max_size=40),
    st.integers(0, 600),
    st.lists(st.integers(0, 200), min_size=1, max_size=5),
)
def test_events_from_a_horizon_on_leave_the_earlier_sessions_alone(
    times: list[int], horizon: int, later: list[int]
) -> None:
    before = sessionize(times, GAP, MAX)
    after = sessionize([*times, *(horizon + t for t in later)], GAP, MAX)
    open_from = max((s.first for s in before if s.first <= horizon), default=None)
    final = [s for s in before if open_from is not None and s.first < open_from]
    assert after[: len(final)] == final


def test_the_oracle_agrees_with_a_second_reading_of_the_rule() -> None:
    """The same rule written as 'where does each session end' over random keys."""
    rng = random.Random(7)
    for _ in range(200):
        times = sorted(rng.randrange(0, 1000) for _ in range(rng.randrange(0, 30)))
        bounds, start = [], 0
        for i in range(1, len(times) + 1):
            if i == len(times) or (
                times[i] - times[i - 1] >= GAP or times[i] - times[start] >= MAX
            ):
                bounds.append(Session(times[start], times[i - 1], i - start))
                start = i
        assert sessionize(times, GAP, MAX) == (bounds if times else [])
