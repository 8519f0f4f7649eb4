"""The speed layer's sessions (rule 13 in docs/semantics.md), without I/O: what one batch does
to one key of a session metric on one source partition.

The layer holds each key's accepted events in Redis (`shared.speed_view.held`), beside the
cells and under the same fenced apply (rule 3). A batch adds the key's new events to a
`SessionChain` of the held ones, which says which sessions changed; every base bucket such a
session started in, before or after, is rebuilt whole from the key's sessions starting there
now (`SessionPlans.bucket_states`), and a bucket no session starts in any more loses its
fields. Buckets are rebuilt rather than folded into: an event arriving out of order can move
events from one session to another, and a state cannot give events back.

A key's sessions are per source partition: the speed view's sessions of a key are exact when
all its events are on one partition (the source's records keyed by the session key), as in
Kafka Streams, whose sessions are per task."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from operator import itemgetter
from typing import NamedTuple

from shared.sessions import Session
from shared.speed_view.held import HeldEvent, HeldKey, KeySession, key_sessions
from shared.window_kind import SessionWindows


def resplit(
    windows: SessionWindows, held: HeldKey, added: Iterable[HeldEvent]
) -> tuple[HeldKey, dict[int, list[KeySession]]]:
    """A key's held events with `added` (any order), and per base bucket a changed session
    started in (before or after), the sessions starting there now (empty: none does any
    more)."""
    chain = held.chain(windows.rule)
    new = list(added)
    changed: set[int] = set()
    for time_ms, _, _ in new:
        changed |= chain.add(time_ms)
    now = HeldKey(held.seed, sorted([*held.events, *new], key=itemgetter(0)))
    buckets: dict[int, list[KeySession]] = {windows.bucket_start(f): [] for f in changed}
    for session in key_sessions(chain, now.events):
        bucket = buckets.get(windows.bucket_start(session.session.first))
        if bucket is not None:
            bucket.append(session)
    return now, buckets


class SessionSeeds(NamedTuple):
    """What a published run gives the speed layer to continue a session metric from: the
    generation, its W and, per key, the last session it serves that may reach W (the seed)."""

    generation: int
    watermark: int
    by_key: Mapping[tuple[str, ...], Session]


def reseeded(
    windows: SessionWindows, held: HeldKey, seed: Session | None, watermark: int
) -> tuple[HeldKey, dict[int, list[KeySession]]]:
    """A key's held events continued from a run's `seed` at its W: events before W are the
    batch view's, and so are those up to the seed's latest event; the rest are re-split after
    the seed. Also, per base bucket whose sessions changed, the sessions starting there now.
    Doing it twice with the same seed and W changes nothing the second time."""
    rule = windows.rule
    before = key_sessions(held.chain(rule), held.events)
    bound = watermark if seed is None else max(watermark, seed.last + 1)
    now = HeldKey(seed, [event for event in held.events if event[0] >= bound])
    after = key_sessions(now.chain(rule), now.events)
    old, new = _by_bucket(windows, before), _by_bucket(windows, after)
    changed = {
        bucket: new.get(bucket, [])
        for bucket in old.keys() | new.keys()
        if [s.session for s in old.get(bucket, [])] != [s.session for s in new.get(bucket, [])]
    }
    return now, changed


def _by_bucket(
    windows: SessionWindows, sessions: Iterable[KeySession]
) -> dict[int, list[KeySession]]:
    buckets: dict[int, list[KeySession]] = {}
    for session in sessions:
        buckets.setdefault(windows.bucket_start(session.session.first), []).append(session)
    return buckets
