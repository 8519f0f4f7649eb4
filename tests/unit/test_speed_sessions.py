"""The speed layer's sessions (rule 13 in docs/semantics.md) as it keeps them, without Redis:
a key's held events re-split batch by batch (`resplit`) and continued from a run's seed
(`reseeded`). Their sessions equal the oracle's sessionization, and the buckets each step
names as changed are exactly where the cells must be rebuilt: buckets kept up to date only
through them equal buckets computed from scratch."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from shared.sessions import Session, SessionRule
from shared.speed_view.held import HeldEvent, HeldKey, KeySession, key_sessions
from shared.window_kind import SessionWindows, TumblingWindows
from speed_layer.sessions import reseeded, resplit
from tests.oracle import sessionize

RULES = st.builds(
    lambda gap, extra: SessionRule(gap, gap + extra), st.integers(1, 60), st.integers(1, 200)
)
BUCKET = 25


def _oracle(times: list[int], rule: SessionRule) -> list[Session]:
    return [Session(*s) for s in sessionize(times, rule.gap_ms, rule.max_duration_ms)]


def _event(time_ms: int) -> HeldEvent:
    return (time_ms, float(time_ms), ())


class Buckets:
    """A key's bucket cells as the speed view keeps them: only the changed ones rewritten."""

    def __init__(self, windows: SessionWindows) -> None:
        self.windows = windows
        self.cells: dict[int, list[Session]] = {}

    def write(self, changed: dict[int, list[KeySession]]) -> None:
        for bucket, sessions in changed.items():
            if sessions:
                self.cells[bucket] = [s.session for s in sessions]
            else:
                self.cells.pop(bucket, None)

    def from_scratch(self, held: HeldKey) -> dict[int, list[Session]]:
        cells: dict[int, list[Session]] = {}
        for s in key_sessions(held.chain(self.windows.rule), held.events):
            cells.setdefault(self.windows.bucket_start(s.session.first), []).append(s.session)
        return cells


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.lists(st.integers(0, 800), max_size=8), max_size=10),
    RULES,
)
def test_batches_in_any_order_keep_every_bucket_exact(
    batches: list[list[int]], rule: SessionRule
) -> None:
    windows = SessionWindows(rule, TumblingWindows((BUCKET,)))
    held = HeldKey(None, [])
    buckets = Buckets(windows)
    for batch in batches:
        held, changed = resplit(windows, held, map(_event, batch))
        buckets.write(changed)
        assert buckets.cells == buckets.from_scratch(held)
    times = [t for batch in batches for t in batch]
    assert [s.session for s in key_sessions(held.chain(rule), held.events)] == _oracle(times, rule)
    assert sorted(e[0] for e in held.events) == [e[0] for e in held.events] == sorted(times)


@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.integers(0, 1_000), min_size=1, max_size=50),
    st.lists(st.integers(0, 300), max_size=30),
    st.data(),
    RULES,
    st.integers(0, 100),
)
def test_continued_from_a_runs_seed_the_views_are_the_sessionization_of_all_events(
    snapshot: list[int],
    after: list[int],
    data: st.DataObject,
    rule: SessionRule,
    grace: int,
) -> None:
    """A run serves its snapshot's sessions starting before W and gives each key its last
    one that may reach W as the seed; the speed layer, holding every snapshot event from W
    on (any subset before), continues from it (twice: it changes nothing the second time)
    and then takes later events. Its sessions from W on plus the run's are the oracle's
    sessionization of all events, and its buckets stay exact throughout."""
    windows = SessionWindows(rule, TumblingWindows((BUCKET,)))
    w = windows.watermark(None, [max(snapshot)], grace)
    assert w is not None
    later = [w + rule.max_duration_ms + t for t in after]
    batch = [s for s in _oracle(snapshot, rule) if s.first < w]
    seed = batch[-1] if batch and batch[-1].first >= w - rule.max_duration_ms else None
    held_events = [t for t in snapshot if t >= w or data.draw(st.booleans())]
    early = data.draw(st.integers(0, len(later)))
    held, changed = resplit(windows, HeldKey(None, []), map(_event, held_events + later[:early]))
    buckets = Buckets(windows)
    buckets.write(changed)
    for _ in range(2):
        held, changed = reseeded(windows, held, seed, w)
        buckets.write(changed)
        assert buckets.cells == buckets.from_scratch(held)
    assert not changed  # the second time
    held, changed = resplit(windows, held, map(_event, later[early:]))
    buckets.write(changed)
    assert buckets.cells == buckets.from_scratch(held)
    speed = [s.session for s in key_sessions(held.chain(rule), held.events)]
    assert batch + [s for s in speed if s.first >= w] == _oracle(snapshot + later, rule)
    assert all(s.first >= w for s in speed)  # nothing continues the seed: all reached W+max
