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

import orjson

from shared.aggregations import CellState, decode_state, encode_state, fold_inputs, merge_states
from shared.metric_plan import MetricPlan, session_part_name
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


@dataclass(frozen=True)
class SessionPlans:
    """A session metric's plan and its parts' (`compile_session_parts`), whose states are
    built together from the same sessions."""

    metric: MetricPlan
    sessions: MetricPlan
    bounces: MetricPlan

    @classmethod
    def of(cls, metric: MetricPlan, plans: Iterable[MetricPlan]) -> SessionPlans:
        by_name = {p.name: p for p in plans}
        return cls(
            metric,
            by_name[session_part_name(metric.name, "sessions")],
            by_name[session_part_name(metric.name, "bounces")],
        )

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
        durations = [float(s.last - s.first) for s in sessions]
        bounces = sum(1 for s in sessions if s.events == 1)
        part, slots = self.sessions, [durations] * len(self.sessions.kinds)
        return (
            (self.metric, merge_states(self.metric.kinds, [s.state for s in sessions])),
            (part, fold_inputs(part.kinds, None, durations, slots, len(durations))),
            (self.bounces, fold_inputs((), None, None, [], bounces) if bounces else None),
        )
