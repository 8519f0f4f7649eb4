"""A session metric's rollups in the speed view (rule 13 in docs/semantics.md): per source
partition, bucket and rolled-up key (always the total, `()`), the metric's aggregations over
the events of the sessions starting in the bucket, its sessions and its bounces, kept as the
keys' sessions change and written in the same fenced apply as the keys' own cells. A total then
reads one cell per bucket and partition instead of one per key.

Each part is kept by what it can give back:
- bounces: a count, moved by each key's change exactly;
- sessions: rebuilt from the bucket's multiset of durations (`DurationCounts`, stored beside
  it), from which a changed key's old durations are taken and its new ones added: the sketch
  of the durations gives nothing back, the multiset does;
- the metric's aggregations: the events a key's sessions gain fold into the total (on the
  fast path a session only gains events, nothing leaves its bucket); when a key's sessions
  were cut again (events may have left a bucket), the bucket's total is rebuilt from its keys'
  cells as the batch leaves them. That costs a read of every key of the bucket, and only a
  re-cut (an event starting a session early, bridging two, moving a cut; a run's
  continuation) pays it."""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple, Protocol

from shared.aggregations import CellState, decode_state, encode_state, merge_states
from shared.speed_view import ApplyBatch, cell_key, decode_key, encode_key
from shared.speed_view.held import (
    DURATIONS_PREFIX,
    DurationCounts,
    HeldEvent,
    HeldSession,
    KeyIndex,
    SessionPlans,
    bounces_state,
)
from speed_layer.sessions import KeyUpdate


class KeyChange(NamedTuple):
    """What a batch did to one key of a session metric: its index before, and its update."""

    key: tuple[str, ...]
    before: KeyIndex
    update: KeyUpdate


class TotalsView(Protocol):
    """The reads keeping the totals takes (Redis, or the rejoin's `MemoryView`)."""

    def read_fields(
        self, requests: Mapping[str, Sequence[bytes]]
    ) -> dict[str, list[bytes | None]]: ...

    def read_hashes(self, names: Sequence[str]) -> dict[str, dict[bytes, bytes]]: ...


@dataclass
class _Delta:
    """What the changed keys do to one (rollup, bucket, rolled-up key)."""

    appended: list[HeldEvent] = field(default_factory=list)
    rebuilt: bool = False
    durations: Counter[int] = field(default_factory=Counter)
    bounces: int = 0


def _deltas(
    plans: SessionPlans, changes: Sequence[KeyChange]
) -> dict[tuple[int, int, tuple[str, ...]], _Delta]:
    """(rollup index, bucket start, rolled-up key) -> what the changes do there."""
    windows = plans.metric.sessions
    assert windows is not None
    bucket_of = windows.bucket_start
    deltas: defaultdict[tuple[int, int, tuple[str, ...]], _Delta] = defaultdict(_Delta)
    for key, before, update in changes:
        old: defaultdict[int, list[HeldSession]] = defaultdict(list)
        for held in before.sessions:
            old[bucket_of(held.first)].append(held)
        appended: defaultdict[int, list[HeldEvent]] = defaultdict(list)
        for first, events in update.appended.items():
            appended[bucket_of(first)].extend(events)
        for bucket, now in update.buckets.items():
            was = old.get(bucket, ())
            bounces = sum(s.events == 1 for s in now) - sum(s.events == 1 for s in was)
            for r, totals in enumerate(plans.totals):
                rollup = totals.metric.rollup
                assert rollup is not None
                delta = deltas[(r, bucket, rollup.project(key))]
                delta.bounces += bounces
                delta.durations.update(s.last - s.first for s in now)
                delta.durations.subtract(s.last - s.first for s in was)
                if update.recut:
                    delta.rebuilt = True
                else:
                    delta.appended.extend(appended.get(bucket, ()))
    return deltas


def write_totals(
    plans: SessionPlans,
    topic: str,
    partition: int,
    changes: Sequence[KeyChange],
    view: TotalsView,
    batch: ApplyBatch,
) -> None:
    """The totals of every bucket `changes` touched, written into `batch` after the keys' own
    cells (which a rebuilt total reads from it): one round trip reads the stored totals and
    the multisets, and the keys of buckets to rebuild."""
    deltas = _deltas(plans, changes)
    if not deltas:
        return

    def name(plan_of: int, r: int, bucket: int) -> str:
        plan = plans.totals[r][plan_of]
        return cell_key(topic, partition, plan.name, plan.version, bucket)

    metric = plans.metric
    requests: defaultdict[str, list[bytes]] = defaultdict(list)
    rebuilt: set[str] = set()
    for (r, bucket, key), delta in deltas.items():
        encoded = encode_key(key)
        requests[name(2, r, bucket)].append(encoded)
        requests[name(1, r, bucket)].append(DURATIONS_PREFIX + encoded)
        if delta.rebuilt:
            rebuilt.add(cell_key(topic, partition, metric.name, metric.version, bucket))
        else:
            requests[name(0, r, bucket)].append(encoded)
    replies = view.read_fields(requests)
    stored = {
        (hash_name, f): value
        for hash_name, fields in requests.items()
        for f, value in zip(fields, replies[hash_name], strict=True)
    }
    keys_of = view.read_hashes(sorted(rebuilt)) if rebuilt else {}
    for (r, bucket, key), delta in deltas.items():
        encoded = encode_key(key)
        data = stored.get((name(0, r, bucket), encoded))
        if delta.rebuilt:
            own = cell_key(topic, partition, metric.name, metric.version, bucket)
            state = _rebuilt(plans, r, key, _after(keys_of.get(own, {}), own, batch))
        elif delta.appended:
            state = plans.folded(None if data is None else decode_state(data), delta.appended)
        else:
            state = None if data is None else decode_state(data)
        _put(batch, name(0, r, bucket), encoded, state)
        durations = name(1, r, bucket)
        counts = _moved(
            DurationCounts.decode(stored[(durations, DURATIONS_PREFIX + encoded)]), delta
        )
        _put(batch, durations, encoded, plans.durations_state(counts))
        multiset = counts.encode() if counts else None
        _put_bytes(batch, durations, DURATIONS_PREFIX + encoded, multiset)
        data = stored[(name(2, r, bucket), encoded)]
        before = 0 if data is None else decode_state(data).count
        _put(batch, name(2, r, bucket), encoded, bounces_state(before + delta.bounces))


def _moved(counts: DurationCounts, delta: _Delta) -> DurationCounts:
    """`counts` less the changed keys' old durations, with their new ones."""
    for duration, n in delta.durations.items():
        left = counts.get(duration, 0) + n
        if left > 0:
            counts[duration] = left
        else:
            counts.pop(duration, None)
    return counts


def _after(stored: Mapping[bytes, bytes], name: str, batch: ApplyBatch) -> dict[bytes, bytes]:
    """A hash's fields as `batch` leaves them."""
    fields = dict(stored)
    fields.update(batch.cells.get(name, {}))
    for removed in batch.deleted.get(name, ()):
        fields.pop(removed, None)
    return fields


def _rebuilt(
    plans: SessionPlans, r: int, key: tuple[str, ...], fields: Mapping[bytes, bytes]
) -> CellState | None:
    """The metric's total of the keys among `fields` (a bucket's) that roll up onto `key`."""
    rollup = plans.totals[r].metric.rollup
    assert rollup is not None
    states = [
        decode_state(data)
        for encoded, data in sorted(fields.items())
        if rollup.project(decode_key(encoded)) == key
    ]
    return merge_states(plans.metric.kinds, states) if states else None


def _put(batch: ApplyBatch, name: str, encoded: bytes, state: CellState | None) -> None:
    _put_bytes(batch, name, encoded, None if state is None else encode_state(state))


def _put_bytes(batch: ApplyBatch, name: str, encoded: bytes, data: bytes | None) -> None:
    """A field written, or removed when there is nothing to hold."""
    if data is None:
        batch.deleted.setdefault(name, []).append(encoded)
    else:
        batch.cells.setdefault(name, {})[encoded] = data
