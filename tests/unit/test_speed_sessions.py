"""The speed layer's sessions (rule 13 in docs/semantics.md) as it keeps them, without Redis:
a key's index and its sessions' event strings, updated batch by batch (`fast_update`, and
`tail_update` when an event changes a cut) and continued from a run's seed (`reseeded`). The
sessions equal the oracle's sessionization, each session's string holds exactly its events,
and the buckets each step names as changed are exactly where the cells must be rebuilt:
buckets kept up to date only through them equal buckets computed from the index."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from shared.config import Settings
from shared.sessions import Session, SessionRule
from shared.speed_view.held import (
    HeldEvent,
    HeldSession,
    KeyIndex,
    SessionPlans,
    event_lines,
    read_event_lines,
)
from shared.window_kind import SessionWindows, TumblingWindows
from speed_layer.sessions import (
    KeyUpdate,
    SlowPath,
    fast_update,
    needs_events,
    reseeded,
    tail_update,
)
from tests.oracle import sessionize

BUCKET = 25


def _plans(rule: SessionRule) -> SessionPlans:
    """A session metric of `rule` with `BUCKET`-ms buckets (the rule set on its plan)."""
    config: dict[str, Any] = {
        "sources": [{"name": "s", "topic": "s", "time_field": "ts"}],
        "metrics": [
            {
                "name": "m",
                "source": "s",
                "key": ["k"],
                "value": "v",
                "aggregations": ["count", "sum"],
                "windows": ["1s"],
                "session": {"gap": "1s", "max_duration": "2s"},
            }
        ],
    }
    settings = Settings(**config)
    metric = settings.plan("m")
    assert metric is not None and metric.sessions is not None
    windows = SessionWindows(rule, TumblingWindows((BUCKET,)))
    plans = SessionPlans.of(metric, settings.plans.values())
    return SessionPlans(
        metric.__class__(**{**_fields(metric), "sessions": windows}),
        plans.sessions,
        plans.bounces,
    )


def _fields(plan: Any) -> dict[str, Any]:
    return {name: getattr(plan, name) for name in plan.__dataclass_fields__}


RULES = st.builds(
    lambda gap, extra: SessionRule(gap, gap + extra), st.integers(1, 60), st.integers(1, 200)
)


def _oracle(times: list[int], rule: SessionRule) -> list[Session]:
    return [Session(*s) for s in sessionize(times, rule.gap_ms, rule.max_duration_ms)]


def _event(time_ms: int) -> HeldEvent:
    return (time_ms, float(time_ms % 7), ())


class Key:
    """One key as the speed view holds it: its index, its sessions' strings, its buckets."""

    def __init__(self, plans: SessionPlans) -> None:
        self.plans = plans
        self.index = KeyIndex(None, ())
        self.strings: dict[int, bytes] = {}
        self.buckets: dict[int, list[Session]] = {}

    def add(self, events: list[HeldEvent]) -> None:
        update = fast_update(self.plans, self.index, events)
        if isinstance(update, SlowPath):
            tail = {
                s.first: read_event_lines(self.strings.get(s.first))
                for s in self.index.sessions[update.start :]
            }
            update = tail_update(self.plans, self.index, update.start, tail, events)
        self.apply(update)

    def reseed(self, seed: Session | None, watermark: int) -> bool:
        events_of = {}
        if needs_events(self.index, seed, watermark):
            events_of = {
                s.first: read_event_lines(self.strings.get(s.first)) for s in self.index.sessions
            }
        update = reseeded(self.plans, self.index, events_of, seed, watermark)
        if update is not None:
            self.apply(update)
        return update is not None

    def apply(self, update: KeyUpdate) -> None:
        self.index = update.index or KeyIndex(None, ())
        for first, events in update.appended.items():
            self.strings[first] = self.strings.get(first, b"") + event_lines(events)
        for first, events in update.written.items():
            self.strings[first] = event_lines(events)
        for first in update.removed:
            del self.strings[first]
        for bucket, sessions in update.buckets.items():
            if sessions:
                self.buckets[bucket] = [s.session for s in sessions]
            else:
                self.buckets.pop(bucket, None)

    def check(self) -> None:
        """Strings, states and buckets agree with the index."""
        assert set(self.strings) == {s.first for s in self.index.sessions}
        for held in self.index.sessions:
            times = [t for t, _, _ in read_event_lines(self.strings[held.first])]
            assert (held.events, held.last) == (len(times), times[-1])
            assert held.first == times[0] or held.first == (self.index.seed or held).first
            assert held.state.count == held.events
            assert held.state.total == sum(t % 7 for t in times)
        windows = self.plans.metric.sessions
        assert windows is not None
        scratch: dict[int, list[Session]] = {}
        for held in self.index.sessions:
            scratch.setdefault(windows.bucket_start(held.first), []).append(held.session)
        assert self.buckets == scratch

    def sessions(self) -> list[Session]:
        return [held.session for held in self.index.sessions]


@settings(max_examples=300, deadline=None)
@given(st.lists(st.lists(st.integers(0, 800), max_size=8), max_size=10), RULES)
def test_batches_in_any_order_keep_sessions_strings_and_buckets_exact(
    batches: list[list[int]], rule: SessionRule
) -> None:
    key = Key(_plans(rule))
    for batch in batches:
        key.add(list(map(_event, batch)))
        key.check()
    assert key.sessions() == _oracle([t for batch in batches for t in batch], rule)


def test_in_order_events_take_the_fast_path() -> None:
    """An event inside a session, after the last one, or alone between two reads no string."""
    plans = _plans(SessionRule(30, 100))
    index = KeyIndex(None, ())
    for events in ([0, 10, 20], [25, 40], [15], [300], [200], [310]):
        update = fast_update(plans, index, list(map(_event, events)))
        assert not isinstance(update, SlowPath), events
        assert update.index is not None
        index = update.index
    assert [h.session for h in index.sessions] == [
        Session(0, 40, 6),
        Session(200, 200, 1),
        Session(300, 310, 2),
    ]
    # 180 starts 200's session earlier: its cuts may move, from the session before it on
    assert fast_update(plans, index, [_event(180)]) == SlowPath(0)


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
    on (any subset before), continues from it (twice: nothing changes the second time) and
    then takes later events. Its sessions from W on plus the run's are the oracle's
    sessionization of all events, and its strings and buckets stay exact throughout."""
    plans = _plans(rule)
    windows = plans.metric.sessions
    assert windows is not None
    w = windows.watermark(None, [max(snapshot)], grace)
    assert w is not None
    later = [w + rule.max_duration_ms + t for t in after]
    assert not any(windows.is_late(t, grace, None, w) for t in later)
    batch = [s for s in _oracle(snapshot, rule) if s.first < w]
    seed = batch[-1] if batch and batch[-1].first >= w - rule.max_duration_ms else None
    held = [t for t in snapshot if t >= w or data.draw(st.booleans())]
    early = data.draw(st.integers(0, len(later)))
    key = Key(plans)
    key.add(list(map(_event, held + later[:early])))
    key.reseed(seed, w)
    key.check()
    assert not key.reseed(seed, w), "the second time changes nothing"
    key.add(list(map(_event, later[early:])))
    key.check()
    speed = key.sessions()
    assert batch + speed == _oracle(snapshot + later, rule)
    assert all(s.first >= w for s in speed)  # nothing continues the seed: all reached W+max


def test_an_index_round_trips() -> None:
    plans = _plans(SessionRule(30, 100))
    state = plans.folded(None, [_event(5), _event(9)])
    index = KeyIndex(Session(-50, -20, 3), (HeldSession(5, 9, 2, state),))
    assert KeyIndex.decode(index.encode()) == index
    assert KeyIndex.decode(None) == KeyIndex(None, ())
