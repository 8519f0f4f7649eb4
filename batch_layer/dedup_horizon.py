"""De-duplication with a horizon (rule 4 in docs/semantics.md, "The de-dup horizon"): per
partition, in offset order, a copy whose partition's stream time has passed its event time
by more than the source's `dedup_horizon` counts again and is not remembered; among the
others, the first copy of an id counts.

A pure function of the rows a run read (`judge_copies`). It needs the stream time at every
row it judges: exact for a read from offset 0; an incremental run's new rows take the stream
time at the served snapshot as their start; rows an incremental run reads again (rule 11,
rule 13) start from where the read starts, which is right for them because a read starts at
the first offset of an event at or after the time they are judged from, so every event
before it is earlier than each of them and cannot make one lie beyond the horizon. For the
same reason every copy of a re-read id is in the read: copies share their event time."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

IdLookup = Callable[[pa.Table], pa.Table]
"""(partition, offset, event_id) candidates -> the (event_id, partition, offset) of those an
earlier run remembered."""


@dataclass(frozen=True)
class JudgedCopies:
    remembered: pa.Table
    """(partition, offset, event_id, time_ms) of the new copies that count and that a later
    copy may still be a duplicate of (its event time within the horizon of the stream time)."""
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
    `event_id, partition, offset, time_ms`, `judged` (aggregated by this run) and `new` (no
    earlier run read it). `stream_times` are the partitions' stream times before the first
    new row (an incremental run's served snapshot); `seen` finds the ids earlier runs
    remembered (None: the read starts at offset 0 and holds every earlier copy)."""
    rows = rows.take(pc.sort_indices(rows, [("partition", "ascending"), ("offset", "ascending")]))
    partitions = _numpy(rows, "partition").astype(np.int64)
    times = _numpy(rows, "time_ms").astype(np.int64)
    new = _numpy(rows, "new").astype(bool)
    as_of = np.empty_like(times)
    after: dict[int, int] = dict(stream_times)
    cuts = np.flatnonzero(np.diff(partitions)) + 1
    for lo, hi in zip(np.r_[0, cuts], np.r_[cuts, len(times)], strict=True):
        if lo == hi:
            continue
        partition = int(partitions[lo])
        as_of[lo:hi] = np.maximum.accumulate(times[lo:hi])
        before = stream_times.get(partition)
        if before is not None:
            fresh = new[lo:hi]
            as_of[lo:hi][fresh] = np.maximum(as_of[lo:hi][fresh], before)
        after[partition] = max(int(as_of[hi - 1]), after.get(partition, int(as_of[hi - 1])))
    judged = _numpy(rows, "judged").astype(bool)
    within = judged & (as_of - times <= horizon_ms)
    candidates = rows.filter(pa.array(within))
    order = pc.sort_indices(
        candidates,
        [("partition", "ascending"), ("event_id", "ascending"), ("offset", "ascending")],
    )
    candidates = candidates.take(order)
    first = np.ones(candidates.num_rows, bool)
    if candidates.num_rows > 1:
        ids = candidates.column("event_id").combine_chunks()
        same_id = pc.equal(ids[1:], ids[:-1]).to_numpy(zero_copy_only=False)
        cand_partitions = _numpy(candidates, "partition")
        first[1:] = ~(same_id & (cand_partitions[1:] == cand_partitions[:-1]))
    dropped = [candidates.filter(pa.array(~first))]
    firsts = candidates.filter(pa.array(first))
    fresh_firsts = firsts.filter(firsts.column("new"))
    if seen is not None and fresh_firsts.num_rows:
        known = _known(fresh_firsts, seen(_positions(fresh_firsts)))
        dropped.append(fresh_firsts.filter(known))
        fresh_firsts = fresh_firsts.filter(pc.invert(known))
    fresh_partitions = _numpy(fresh_firsts, "partition").astype(np.int64)
    kept_from = np.zeros(int(fresh_partitions.max(initial=0)) + 1, np.int64)
    for partition, stream_time in after.items():
        if partition < len(kept_from):
            kept_from[partition] = stream_time - horizon_ms
    recent = _numpy(fresh_firsts, "time_ms") >= kept_from[fresh_partitions]
    remembered = fresh_firsts.filter(pa.array(recent))
    return JudgedCopies(
        remembered=remembered.select(REMEMBERED_SCHEMA.names).cast(REMEMBERED_SCHEMA),
        dropped=pa.concat_tables([d.select(["partition", "offset"]) for d in dropped]),
        stream_times=after,
    )


def _numpy(table: pa.Table, column: str) -> np.ndarray:
    return table.column(column).combine_chunks().to_numpy(zero_copy_only=False)


def _positions(copies: pa.Table) -> pa.Table:
    return copies.select(["partition", "offset", "event_id"])


def _known(copies: pa.Table, found: pa.Table) -> pa.ChunkedArray | pa.Array:
    """Which of `copies` have their (partition, event_id) among `found`."""
    known = pa.array(np.zeros(copies.num_rows, bool))
    partitions = copies.column("partition")
    for partition in pc.unique(found.column("partition")).to_pylist():
        ids = found.filter(pc.equal(found.column("partition"), partition)).column("event_id")
        here = pc.and_(
            pc.equal(partitions, partition), pc.is_in(copies.column("event_id"), value_set=ids)
        )
        known = pc.or_(known, here)
    return known
