"""A session metric's held events in the speed view (rule 13 in docs/semantics.md): per source
partition and key, the accepted events its sessions are re-split from, after the seed — the
session before them whose events the batch view holds. The speed layer writes them
(`speed_layer.sessions`); the serving layer reads one key's sessions from them. Both cut them
into sessions here and fold each session's state with the aggregation registry."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import NamedTuple

import orjson

from shared.aggregations import CellState, fold_inputs
from shared.metric_plan import MetricPlan, session_part_name
from shared.sessions import Session, SessionChain, SessionRule

HeldEvent = tuple[int, float | None, tuple[str | float, ...]]
"""An accepted event as held: its time, its value (None without a value field) and its sketch
slots' items."""


class HeldKey(NamedTuple):
    """One key's held events, in time order, after `seed` (None: no session before them)."""

    seed: Session | None
    events: list[HeldEvent]

    def encode(self) -> bytes:
        return orjson.dumps((None if self.seed is None else tuple(self.seed), self.events))

    @classmethod
    def decode(cls, data: bytes | None) -> HeldKey:
        """A stored field read back (None: nothing held)."""
        if data is None:
            return cls(None, [])
        seed, events = orjson.loads(data)
        return cls(
            None if seed is None else Session(*seed),
            [(time_ms, value, tuple(items)) for time_ms, value, items in events],
        )

    def chain(self, rule: SessionRule) -> SessionChain:
        """The held events' `SessionChain` (events in time order: each lands at the end)."""
        chain = SessionChain(rule, self.seed)
        for time_ms, _, _ in self.events:
            chain.add(time_ms)
        return chain


class KeySession(NamedTuple):
    """One session of a key and its held events."""

    session: Session
    events: Sequence[HeldEvent]


def key_sessions(chain: SessionChain, events: Sequence[HeldEvent]) -> list[KeySession]:
    """The chain's sessions, each with its events (`events`: the chain's, in time order). A
    session continuing the seed has the seed's first event and only the held events."""
    sessions = []
    position = 0
    for session in chain.sessions():
        end = position + session.events
        sessions.append(KeySession(session, events[position:end]))
        position = end
    return sessions


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

    def events_state(self, sessions: Sequence[KeySession]) -> CellState:
        """The metric's aggregations over the events of `sessions`."""
        metric = self.metric
        events = [event for _, held in sessions for event in held]
        values = None if metric.value is None else [v for _, v, _ in events if v is not None]
        items = list(zip(*(i for _, _, i in events), strict=True)) if metric.kinds else []
        return fold_inputs(metric.kinds, None, values, items, len(events))

    def bucket_states(
        self, sessions: Sequence[KeySession]
    ) -> tuple[tuple[MetricPlan, CellState | None], ...]:
        """Each plan's state of one key's bucket from the sessions starting in it (None: the
        plan has no cell there): the events' aggregations, the sessions and their durations,
        the bounces (sessions of one event)."""
        if not sessions:
            return ((self.metric, None), (self.sessions, None), (self.bounces, None))
        durations = [float(s.last - s.first) for s, _ in sessions]
        bounces = sum(1 for s, _ in sessions if s.events == 1)
        part, slots = self.sessions, [durations] * len(self.sessions.kinds)
        return (
            (self.metric, self.events_state(sessions)),
            (part, fold_inputs(part.kinds, None, durations, slots, len(durations))),
            (self.bounces, fold_inputs((), None, None, [], bounces) if bounces else None),
        )
