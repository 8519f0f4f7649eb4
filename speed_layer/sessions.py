"""The speed layer's sessions (rule 13 in docs/semantics.md), without I/O: what one batch, or
a run's seeds, do to one key of a session metric on one source partition.

A key is held as an index of its sessions, each with its events' state, and each session's
events in a string of its own (`shared.speed_view.held`). Most events change no cut: one
inside a session's span, after the last session, or alone between two sessions at least `gap`
from both (`fast_update`): it is appended to its session's string and folded into its state,
reading nothing but the index. Any other event — one that starts a session early, bridges two
sessions or moves a cut at `max_duration` — makes the key's sessions from the one before it on
be read and cut again with a `SessionChain` (`tail_update`), writing the sessions that changed
whole. Either way every base bucket a changed session started in, before or after, is rebuilt
from the key's sessions starting there now (`SessionPlans.bucket_states`): a state cannot give
events back.

After a run the key continues from the seed the run gives it (`reseeded`): events before W and
those up to the seed's last event are the batch view's; what is left is cut again after the
seed, only for keys holding such events or given a seed.

A key's sessions are per source partition: the speed view's sessions of a key are exact when
all its events are on one partition (the source's records keyed by the session key), as in
Kafka Streams, whose sessions are per task."""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from operator import itemgetter
from typing import NamedTuple

from shared.sessions import Session, SessionChain, SessionRule
from shared.speed_view.held import HeldEvent, HeldSession, KeyIndex, SessionPlans
from shared.window_kind import SessionWindows


class SessionSeeds(NamedTuple):
    """What a published run gives the speed layer to continue a session metric from: the
    served row's stamp (its `xmin`: every publication rewrites the row, an incremental one in
    the same generation), its W and, per key, the last session it serves that may reach W (the
    seed)."""

    stamp: str
    watermark: int
    by_key: Mapping[tuple[str, ...], Session]


@dataclass
class KeyUpdate:
    """What to write for one key: its index (None: remove it), events appended to sessions'
    strings, strings written whole or removed (by session first), and per base bucket whose
    sessions changed, the sessions starting there now."""

    index: KeyIndex | None
    appended: dict[int, list[HeldEvent]] = field(default_factory=dict)
    written: dict[int, list[HeldEvent]] = field(default_factory=dict)
    removed: set[int] = field(default_factory=set)
    buckets: dict[int, list[HeldSession]] = field(default_factory=dict)
    recut: bool = False
    """The key's sessions were cut again (`_recut`): events may have left a bucket. Else its
    sessions only gained events (`fast_update`)."""


class SlowPath(NamedTuple):
    """A batch needs the key's sessions from `start` (a position in the index) on cut again:
    their events must be read first."""

    start: int


@dataclass
class _Placing:
    """A session while a batch's events are placed: as indexed, plus the events it gains."""

    first: int
    last: int
    held: HeldSession | None
    gained: list[HeldEvent] = field(default_factory=list)


def fast_update(
    plans: SessionPlans, index: KeyIndex, added: Sequence[HeldEvent]
) -> KeyUpdate | SlowPath:
    """The key's update when none of `added` changes a cut; else where the sessions to cut
    again begin: at the session holding, or before, the earliest added event."""
    windows = plans.metric.sessions
    assert windows is not None
    rule = windows.rule
    placing = [_Placing(s.first, s.last, s) for s in index.sessions]
    ordered = sorted(added, key=itemgetter(0))
    for event in ordered:
        time_ms = event[0]
        at = bisect_right([s.first for s in placing], time_ms) - 1
        joins = _joins(rule, index.seed, placing, at, time_ms)
        if joins is None:
            firsts = [s.first for s in index.sessions]
            return SlowPath(max(0, bisect_right(firsts, ordered[0][0]) - 1))
        if joins:
            placing[at].last = max(placing[at].last, time_ms)
            placing[at].gained.append(event)
        else:
            placing.insert(at + 1, _Placing(time_ms, time_ms, None, [event]))
    update = KeyUpdate(None)
    sessions = []
    for s in placing:
        if s.gained:
            before = s.held
            state = plans.folded(None if before is None else before.state, s.gained)
            count = len(s.gained) + (0 if before is None else before.events)
            sessions.append(HeldSession(s.first, s.last, count, state))
            update.appended[s.first] = s.gained
            update.buckets.setdefault(windows.bucket_start(s.first), [])
        else:
            assert s.held is not None
            sessions.append(s.held)
    update.index = KeyIndex(index.seed, tuple(sessions))
    _fill_buckets(windows, update)
    return update


def _joins(
    rule: SessionRule,
    seed: Session | None,
    sessions: Sequence[_Placing],
    at: int,
    time_ms: int,
) -> bool | None:
    """Whether an event at `time_ms` joins the session at `at` (the last one starting at or
    before it; -1: none) or starts one of its own right after it, changing no cut; None
    when it would change one (start a session early, bridge two, move a cut)."""
    following = sessions[at + 1].first if at + 1 < len(sessions) else None
    if at >= 0:
        held = sessions[at]
        if time_ms <= held.last:
            return True  # inside its span: no pause grows, no first moves
        if not rule.splits(held.first, held.last, time_ms):  # it extends the session
            return (
                True if following is None or rule.splits(held.first, time_ms, following) else None
            )
    elif seed is not None and not rule.splits(seed.first, seed.last, time_ms):
        return None  # it would continue the seed
    if following is None or following - time_ms >= rule.gap_ms:
        return False  # a session of its own, and still a pause before the next one
    return None


def tail_update(
    plans: SessionPlans,
    index: KeyIndex,
    start: int,
    tail_events: Mapping[int, Sequence[HeldEvent]],
    added: Iterable[HeldEvent],
) -> KeyUpdate:
    """The key's sessions from position `start` on cut again with `added`: `tail_events` are
    those sessions' events (by first). Sessions the cut leaves alone keep their strings."""
    windows = plans.metric.sessions
    assert windows is not None
    head, tail = index.sessions[:start], index.sessions[start:]
    seed = head[-1].session if head else index.seed
    events = sorted(
        [*(e for s in tail for e in tail_events.get(s.first, ())), *added], key=itemgetter(0)
    )
    return _recut(plans, index.seed, head, tail, seed, events)


def reseeded(
    plans: SessionPlans,
    index: KeyIndex,
    events_of: Mapping[int, Sequence[HeldEvent]],
    seed: Session | None,
    watermark: int,
) -> KeyUpdate | None:
    """The key continued from a run's `seed` at its W: events before W are the batch view's,
    and so are those up to the seed's last event; the rest are cut again after the seed.
    `events_of` holds the events of the sessions `needs_events` names. None: nothing changes
    (doing it twice with the same seed and W changes nothing the second time)."""
    if not needs_events(index, seed, watermark):
        return None
    bound = watermark if seed is None else max(watermark, seed.last + 1)
    events = [e for s in index.sessions for e in events_of.get(s.first, ()) if e[0] >= bound]
    events.sort(key=itemgetter(0))
    update = _recut(plans, seed, (), index.sessions, seed, events)
    if update.index is not None and update.index == index:
        return None
    return update


def needs_events(index: KeyIndex, seed: Session | None, watermark: int) -> bool:
    """Whether continuing the key from `seed` at W may change it (then every held session's
    events are read): it is given another seed, or holds a session starting before W."""
    if seed != index.seed:
        return True
    return bool(index.sessions) and index.sessions[0].first < watermark


def _recut(
    plans: SessionPlans,
    index_seed: Session | None,
    head: Sequence[HeldSession],
    old_tail: Sequence[HeldSession],
    predecessor: Session | None,
    events: Sequence[HeldEvent],
) -> KeyUpdate:
    """`events` (in time order) cut into sessions after `predecessor`, replacing `old_tail`
    after `head`: a session equal to an old one (same first, last and count: the same events)
    keeps its string and state, the others are written whole."""
    windows = plans.metric.sessions
    assert windows is not None
    chain = SessionChain(windows.rule, predecessor)
    for time_ms, _, _ in events:
        chain.add(time_ms)
    old = {s.session: s for s in old_tail}
    update = KeyUpdate(None, recut=True)
    new_tail: list[HeldSession] = []
    position = 0
    for session in chain.sessions():
        mine = events[position : position + session.events]
        position += session.events
        kept = old.pop(session, None)
        if kept is None:
            kept = HeldSession(*session, plans.folded(None, mine))
            update.written[session.first] = list(mine)
            update.buckets.setdefault(windows.bucket_start(session.first), [])
        new_tail.append(kept)
    for gone in old.values():
        if gone.first not in update.written:
            update.removed.add(gone.first)
        update.buckets.setdefault(windows.bucket_start(gone.first), [])
    sessions = (*head, *new_tail)
    update.index = KeyIndex(index_seed, sessions) if sessions else None
    _fill_buckets(windows, update)
    return update


def _fill_buckets(windows: SessionWindows, update: KeyUpdate) -> None:
    """Each changed bucket's sessions from the update's index."""
    if update.index is None:
        return
    for held in update.index.sessions:
        sessions = update.buckets.get(windows.bucket_start(held.first))
        if sessions is not None:
            sessions.append(held)
