"""De-duplication with a horizon (rule 4 in docs/semantics.md, "The de-dup horizon"): per
partition, in offset order, an id is remembered from the copy that counted for it until the
partition's stream time has passed that copy's event time by more than the source's
`dedup_horizon`; a copy counts unless its id is remembered. A producer retry (same payload,
same event time) that late counts again.

A pure function of the rows a run read (`judge_copies`). It needs the stream time at every
row it judges: exact for a read from offset 0; an incremental run's new rows start from the
stream time at the served snapshot and from the ids earlier runs remembered; rows it reads
again (rules 11 and 13) are judged from the read alone, which is right for them: a read starts
at the first offset of an event at or after the time they are recomputed from, so every
record before it is older than each of them (the stream time there cannot have passed them),
and every copy of their ids is in the read (copies share their event time)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

IdLookup = Callable[[pa.Table], pa.Table]
"""(partition, offset, event_id) of first copies a run read -> the (event_id, partition,
offset) of the copies an earlier run counted for those ids; for a source with a de-dup
horizon, per partition and with their `time_ms`."""


@dataclass(frozen=True)
class JudgedCopies:
    remembered: pa.Table
    """(partition, offset, event_id, time_ms) of each id's last new copy that counted, when
    the stream time after the read has not passed it by more than the horizon."""
    dropped: pa.Table
    """(partition, offset) of the copies that do not count."""
    stream_times: dict[int, int]
    """partition -> stream time after the read."""


REMEMBERED_SCHEMA = pa.schema(
    [
        ("partition", pa.int32()),
        ("offset", pa.int64()),
        ("event_id", pa.string()),
        ("time_ms", pa.int64()),
    ]
)


def judge_copies(
    rows: pa.Table,
    horizon_ms: int,
    stream_times: Mapping[int, int],
    seen: IdLookup | None,
) -> JudgedCopies:
    """Decide every judged copy among `rows` — every source-valid row read, with columns
    `event_id, partition, offset, time_ms, clock_ms` (how far the row moves stream time, rule
    2), `judged` (aggregated by this run) and `new` (no earlier run read it). `stream_times`
    are the partitions' stream times before the first new row (an incremental run's served
    snapshot); `seen` finds the ids earlier runs remembered (None: the read starts at offset
    0 and holds every earlier copy)."""
    rows = rows.take(pc.sort_indices(rows, [("partition", "ascending"), ("offset", "ascending")]))
    partitions = _numpy(rows, "partition").astype(np.int64)
    clocks = _numpy(rows, "clock_ms").astype(np.int64)
    new = _numpy(rows, "new").astype(bool)
    as_of = np.empty_like(clocks)
    after: dict[int, int] = dict(stream_times)
    cuts = np.flatnonzero(np.diff(partitions)) + 1
    for lo, hi in zip(np.r_[0, cuts], np.r_[cuts, len(clocks)], strict=True):
        if lo == hi:
            continue
        partition = int(partitions[lo])
        as_of[lo:hi] = np.maximum.accumulate(clocks[lo:hi])
        before = stream_times.get(partition)
        if before is not None:
            fresh = new[lo:hi]
            as_of[lo:hi][fresh] = np.maximum(as_of[lo:hi][fresh], before)
        after[partition] = max(int(as_of[hi - 1]), after.get(partition, int(as_of[hi - 1])))
    rows = rows.append_column("as_of", pa.array(as_of, pa.int64()))
    rows = rows.filter(pa.array(_numpy(rows, "judged").astype(bool)))
    rows = rows.take(pc.sort_indices(rows, [(c, "ascending") for c in _GROUP_ORDER]))
    starts = _group_starts(rows)
    state, known = _remembered_before(rows, starts, seen)
    counted = _count(rows, starts, state, known, horizon_ms)
    last = _last_counted(starts, counted)
    partitions = _numpy(rows, "partition").astype(np.int64)[last]
    kept_from = np.zeros(int(partitions.max(initial=0)) + 1, np.int64)
    for partition, stream_time in after.items():
        if partition < len(kept_from):
            kept_from[partition] = stream_time - horizon_ms
    recent = _numpy(rows, "time_ms")[last] >= kept_from[partitions]
    remembered = rows.take(pa.array(last[_numpy(rows, "new")[last].astype(bool) & recent]))
    return JudgedCopies(
        remembered=remembered.select(REMEMBERED_SCHEMA.names).cast(REMEMBERED_SCHEMA),
        dropped=rows.filter(pa.array(~counted)).select(["partition", "offset"]),
        stream_times=after,
    )


_GROUP_ORDER = ("partition", "event_id", "offset")
"""The judged copies' order: each (partition, id)'s copies together, in offset order."""


def _group_starts(rows: pa.Table) -> np.ndarray:
    """Where each (partition, id) group of the sorted copies starts."""
    starts = np.ones(rows.num_rows, bool)
    if rows.num_rows > 1:
        ids = rows.column("event_id").combine_chunks()
        same_id = pc.equal(ids[1:], ids[:-1]).to_numpy(zero_copy_only=False)
        partitions = _numpy(rows, "partition")
        starts[1:] = ~(same_id & (partitions[1:] == partitions[:-1]))
    return starts


def _remembered_before(
    rows: pa.Table, starts: np.ndarray, seen: IdLookup | None
) -> tuple[np.ndarray, np.ndarray]:
    """(the event time of the copy an earlier run counted last, whether there is one) at the
    first copy of each group whose first copy is new (an earlier run read none of them)."""
    state = np.zeros(rows.num_rows, np.int64)
    known = np.zeros(rows.num_rows, bool)
    firsts = np.flatnonzero(starts & _numpy(rows, "new").astype(bool))
    if seen is None or not len(firsts):
        return state, known
    found = seen(rows.take(pa.array(firsts)).select(["partition", "offset", "event_id"]))
    latest: dict[tuple[int, str], tuple[int, int]] = {}
    for row in found.to_pylist():
        key = (row["partition"], row["event_id"])
        if key not in latest or row["offset"] > latest[key][0]:
            latest[key] = (row["offset"], row["time_ms"])
    if not latest:
        return state, known
    partitions = rows.column("partition").to_pylist()
    ids = rows.column("event_id").to_pylist()
    for i in firsts.tolist():
        hit = latest.get((partitions[i], ids[i]))
        if hit is not None:
            state[i], known[i] = hit[1], True
    return state, known


def _count(
    rows: pa.Table, starts: np.ndarray, state: np.ndarray, known: np.ndarray, horizon_ms: int
) -> np.ndarray:
    """Which copies count: in each group, in offset order, a copy counts unless the id is
    remembered — the copy that counted last is within the horizon of the stream time as of
    this one. A group of one copy with nothing remembered counts without a loop."""
    counted = np.ones(rows.num_rows, bool)
    ends = np.r_[starts[1:], True] if rows.num_rows else starts
    alone = starts & ends & ~known
    if alone.all():
        return counted
    times = _numpy(rows, "time_ms").astype(np.int64)
    as_of = _numpy(rows, "as_of").astype(np.int64)
    bounds = np.flatnonzero(starts)
    for lo, hi in zip(bounds, np.r_[bounds[1:], rows.num_rows], strict=True):
        if alone[lo]:
            continue
        last = int(state[lo]) if known[lo] else None
        for k in range(lo, hi):
            if last is not None and as_of[k] - last <= horizon_ms:
                counted[k] = False
            else:
                last = int(times[k])
    return counted


def _last_counted(starts: np.ndarray, counted: np.ndarray) -> np.ndarray:
    """The index of each group's last counted copy (groups with none have none)."""
    indices = np.flatnonzero(counted)
    groups = (np.cumsum(starts) - 1)[indices]
    return indices[np.r_[groups[1:] != groups[:-1], True]] if len(indices) else indices


def _numpy(table: pa.Table, column: str) -> np.ndarray:
    return table.column(column).combine_chunks().to_numpy(zero_copy_only=False)
