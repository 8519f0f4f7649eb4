"""A session metric's sessions in the speed view (rule 13 in docs/semantics.md), per source
partition and key: an index of the key's sessions from W on — each one's first and last event
times, its event count and its events' state — after the seed (the session before them whose
events the batch view holds), as one field of the hash `sessions_key`; and each session's
events as JSON arrays in a string of its own (`session_events_key`), appended to as events
join it and read only when the session must be cut again. The speed layer writes them
(`speed_layer.sessions`); the serving layer lists one key's sessions from the index alone."""

from __future__ import annotations

import struct
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from operator import itemgetter
from typing import NamedTuple

import numpy as np
import orjson

from shared.aggregations import CellState, decode_state, encode_state, fold_inputs, merge_states
from shared.metric_plan import MetricPlan, rollup_name, session_part_name
from shared.sessions import Session

HeldEvent = tuple[int, float | None, tuple[str | float, ...]]
"""An accepted event as held: its time, its value (None without a value field) and its sketch
slots' items."""


def event_lines(events: Sequence[HeldEvent]) -> bytes:
    """Events as appended to a session's string: each a JSON array after a comma, so the
    string is a JSON array's inside (one `orjson.dumps` per append)."""
    return b"," + orjson.dumps(events)[1:-1]


def read_event_lines(data: bytes | None) -> list[HeldEvent]:
    """A session's string read back, in time order."""
    if not data:
        return []
    events = [
        (time_ms, value, tuple(items))
        for time_ms, value, items in orjson.loads(b"[" + data[1:] + b"]")
    ]
    events.sort(key=itemgetter(0))
    return events


class HeldSession(NamedTuple):
    """One session in a key's index."""

    first: int
    last: int
    events: int
    state: CellState
    """The metric's aggregations over its events."""

    @property
    def session(self) -> Session:
        return Session(self.first, self.last, self.events)


_SEED = struct.Struct("<qqq")
_SESSION = struct.Struct("<qqqI")
_COUNT = struct.Struct("<I")


class KeyIndex(NamedTuple):
    """A key's sessions (by first event time) after its seed (None: no session before them)."""

    seed: Session | None
    sessions: tuple[HeldSession, ...]

    def encode(self) -> bytes:
        parts = [b"\x01" + _SEED.pack(*self.seed) if self.seed is not None else b"\x00"]
        parts.append(_COUNT.pack(len(self.sessions)))
        for held in self.sessions:
            state = encode_state(held.state)
            parts.append(_SESSION.pack(held.first, held.last, held.events, len(state)))
            parts.append(state)
        return b"".join(parts)

    @classmethod
    def decode(cls, data: bytes | None) -> KeyIndex:
        """A stored field read back (None: nothing held)."""
        if not data:
            return cls(None, ())
        seed = None
        at = 1
        if data[0]:
            seed = Session(*_SEED.unpack_from(data, at))
            at += _SEED.size
        (count,) = _COUNT.unpack_from(data, at)
        at += _COUNT.size
        sessions = []
        for _ in range(count):
            first, last, events, length = _SESSION.unpack_from(data, at)
            at += _SESSION.size
            state = decode_state(data[at : at + length])
            at += length
            sessions.append(HeldSession(first, last, events, state))
        return cls(seed, tuple(sessions))


DURATIONS_PREFIX = b"#"
"""Before a rolled-up key's encoding (`encode_key`, a JSON array: never this byte), the field of
a session metric's `sessions` rollup hash holding that key's `DurationCounts`: what its total
is rebuilt from when a session's duration changes. Readers of every key of a hash skip it."""


class DurationCounts(dict[int, int]):
    """The sessions of one bucket and rolled-up key as a multiset of their durations (ms ->
    how many): exact and retractable, unlike the sketch a total keeps of them."""

    @classmethod
    def of(cls, sessions: Iterable[HeldSession]) -> DurationCounts:
        counts = cls()
        for held in sessions:
            duration = held.last - held.first
            counts[duration] = counts.get(duration, 0) + 1
        return counts

    def encode(self) -> bytes:
        durations = np.fromiter(self.keys(), np.int64, len(self))
        counts = np.fromiter(self.values(), np.int64, len(self))
        return _COUNT.pack(len(self)) + durations.tobytes() + counts.tobytes()

    @classmethod
    def decode(cls, data: bytes | None) -> DurationCounts:
        if not data:
            return cls()
        (n,) = _COUNT.unpack_from(data)
        durations = np.frombuffer(data, np.int64, n, _COUNT.size)
        counts = np.frombuffer(data, np.int64, n, _COUNT.size + 8 * n)
        return cls(zip(durations.tolist(), counts.tolist(), strict=True))

    def durations(self) -> list[float]:
        """Every session's duration, as the `sessions` part folds them."""
        durations = np.fromiter(self.keys(), np.float64, len(self))
        counts = np.fromiter(self.values(), np.int64, len(self))
        return np.repeat(durations, counts).tolist()


class SessionTotals(NamedTuple):
    """One rollup of a session metric (its total: dims `()`) as the rollup plans of the metric
    and of its two parts."""

    metric: MetricPlan
    sessions: MetricPlan
    bounces: MetricPlan


@dataclass(frozen=True)
class SessionPlans:
    """A session metric's plan and its parts' (`compile_session_parts`), whose states are
    built together from the same sessions, and its rollups' (`totals`), kept from them."""

    metric: MetricPlan
    sessions: MetricPlan
    bounces: MetricPlan
    totals: tuple[SessionTotals, ...] = ()

    @classmethod
    def of(cls, metric: MetricPlan, plans: Iterable[MetricPlan]) -> SessionPlans:
        by_name = {p.name: p for p in plans}
        sessions = by_name[session_part_name(metric.name, "sessions")]
        bounces = by_name[session_part_name(metric.name, "bounces")]
        owners = (metric, sessions, bounces)
        totals = tuple(
            SessionTotals(*(by_name[rollup_name(p.name, dims)] for p in owners))
            for dims in metric.rollups
            if rollup_name(metric.name, dims) in by_name
        )
        return cls(metric, sessions, bounces, totals)

    def durations_state(self, counts: DurationCounts) -> CellState | None:
        """The `sessions` part's state of sessions of these durations (None: no session)."""
        if not counts:
            return None
        durations = counts.durations()
        part = self.sessions
        slots = [durations] * len(part.kinds)
        return fold_inputs(part.kinds, None, durations, slots, len(durations))

    def folded(self, state: CellState | None, events: Sequence[HeldEvent]) -> CellState:
        """`state` (None: empty) with the metric's aggregations of `events` folded in."""
        metric = self.metric
        values = None if metric.value is None else [v for _, v, _ in events if v is not None]
        items = list(zip(*(i for _, _, i in events), strict=True)) if metric.kinds else []
        return fold_inputs(metric.kinds, state, values, items, len(events))

    def bucket_states(
        self, sessions: Sequence[HeldSession]
    ) -> tuple[tuple[MetricPlan, CellState | None], ...]:
        """Each plan's state of one key's bucket from the sessions starting in it (None: the
        plan has no cell there): the events' aggregations merged, the sessions and their
        durations, the bounces (sessions of one event)."""
        if not sessions:
            return ((self.metric, None), (self.sessions, None), (self.bounces, None))
        bounces = sum(1 for s in sessions if s.events == 1)
        return (
            (self.metric, merge_states(self.metric.kinds, [s.state for s in sessions])),
            (self.sessions, self.durations_state(DurationCounts.of(sessions))),
            (self.bounces, bounces_state(bounces)),
        )


def bounces_state(bounces: int) -> CellState | None:
    """The `bounces` part's state of that many one-event sessions (None: none)."""
    return fold_inputs((), None, None, [], bounces) if bounces > 0 else None
