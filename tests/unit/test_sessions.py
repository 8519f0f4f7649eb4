"""Session windows (rule 13 in docs/semantics.md): the batch layer's vectorized pass
(`session_firsts`) and the speed layer's event-by-event chain (`SessionChain`) each equal the
brute-force sessionization of the oracle (`tests.oracle.sessionize`, the rule as written), in
any arrival order (across the batch view's W: `test_speed_sessions`)."""

from __future__ import annotations

import numpy as np
import numpy.typing as npt
import pytest
from hypothesis import given
from hypothesis import strategies as st

from shared.sessions import Session, SessionChain, SessionRule, session_firsts
from shared.window_kind import SessionWindows, TumblingWindows
from tests.oracle import sessionize

GAP = 30
MAX = 100
RULE = SessionRule(GAP, MAX)

RULES = st.builds(
    lambda gap, extra: SessionRule(gap, gap + extra), st.integers(1, 60), st.integers(1, 200)
)
TIMES = st.lists(st.integers(-500, 1_500), max_size=60)


def sessions_of(times: npt.NDArray[np.int64], firsts: npt.NDArray[np.int64]) -> list[Session]:
    """One key's sessions from its time-sorted events and their `session_firsts`."""
    if len(times) == 0:
        return []
    begins = np.flatnonzero(np.diff(firsts, prepend=firsts[0] - 1))
    ends = np.append(begins[1:], len(times))
    return [
        Session(int(times[b]), int(times[e - 1]), int(e - b))
        for b, e in zip(begins, ends, strict=True)
    ]


def _oracle(times: list[int], rule: SessionRule) -> list[Session]:
    return [Session(*s) for s in sessionize(times, rule.gap_ms, rule.max_duration_ms)]


def test_a_gap_of_exactly_gap_splits_and_max_duration_splits_a_busy_key() -> None:
    times = np.array([0, 29, 59, 80, 100, 129], dtype=np.int64)
    firsts = session_firsts(times, np.zeros(len(times), dtype=np.bool_), RULE)
    # 59 - 29 = 30 = gap: a new session; 100 - 0 would reach max_duration, but 100 is in
    # 59's session, 41 after its first; 129 - 100 < gap and 129 - 59 < max: it joins too.
    assert firsts.tolist() == [0, 0, 59, 59, 59, 59]
    busy = np.arange(0, 250, 10, dtype=np.int64)
    assert sessions_of(busy, session_firsts(busy, np.zeros(25, np.bool_), RULE)) == [
        Session(0, 90, 10),
        Session(100, 190, 10),
        Session(200, 240, 5),
    ]


@given(st.dictionaries(st.integers(0, 5), TIMES, max_size=6), RULES)
def test_the_vectorized_pass_over_many_keys_equals_the_oracle(
    events: dict[int, list[int]], rule: SessionRule
) -> None:
    rows = sorted((key, t) for key, times in events.items() for t in times)
    keys = np.array([key for key, _ in rows], dtype=np.int64)
    times = np.array([t for _, t in rows], dtype=np.int64)
    new_key = np.ones(len(rows), dtype=np.bool_)
    new_key[1:] = keys[1:] != keys[:-1]
    firsts = session_firsts(times, new_key, rule)
    for key, key_times in events.items():
        mine = keys == key
        assert sessions_of(times[mine], firsts[mine]) == _oracle(key_times, rule)


def test_a_late_event_bridges_two_sessions_and_moves_the_later_splits() -> None:
    chain = SessionChain(RULE)
    for t in (0, 20, 50, 70, 90, 115):
        chain.add(t)
    assert chain.sessions() == [Session(0, 20, 2), Session(50, 115, 4)]
    # 35 bridges: one session from 0, so max_duration now splits at 100, not 150.
    changed = chain.add(35)
    assert chain.sessions() == [Session(0, 90, 6), Session(115, 115, 1)]
    assert changed == {0, 50, 115}


@given(st.lists(st.integers(-500, 1_500), max_size=60).flatmap(st.permutations), RULES)
def test_the_chain_in_any_arrival_order_equals_the_oracle_and_names_every_change(
    arrivals: list[int], rule: SessionRule
) -> None:
    chain = SessionChain(rule)
    for t in arrivals:
        before = set(chain.sessions())
        changed = chain.add(t)
        after = set(chain.sessions())
        assert {s.first for s in before ^ after} <= changed
    assert chain.sessions() == _oracle(arrivals, rule)


def test_an_event_before_the_seed_is_refused() -> None:
    chain = SessionChain(RULE, Session(0, 50, 3))
    chain.add(50)
    assert chain.sessions() == [Session(0, 50, 1)]
    with pytest.raises(ValueError, match="precedes the chain's seed"):
        chain.add(49)


@pytest.mark.parametrize(("gap", "longest"), [(0, 10), (10, 10), (20, 10), (-1, 10)])
def test_a_gap_not_shorter_than_max_duration_is_refused(gap: int, longest: int) -> None:
    with pytest.raises(ValueError, match="shorter than its max_duration"):
        SessionRule(gap, longest)


@given(RULES, st.integers(0, 500), st.lists(st.integers(-(10**12), 10**12), min_size=1))
def test_w_for_sessions_lags_the_cells_w_by_max_duration(
    rule: SessionRule, grace: int, stream_times: list[int]
) -> None:
    buckets = TumblingWindows((60_000, 3_600_000))
    windows = SessionWindows(rule, buckets)
    w = windows.watermark(None, stream_times, grace)
    assert w is not None
    assert w % 60_000 == 0
    assert w + rule.max_duration_ms <= max(stream_times) - grace
    assert w + rule.max_duration_ms + 60_000 > max(stream_times) - grace
    assert windows.watermark(w + 60_000, stream_times, grace) == w + 60_000
