"""The rebuild index kept from run to run gives the same `rebuild_from` as re-reading every
event: the smallest offset per partition whose event time is at or after W (rule 5); and where
an incremental run re-reads from to recompute the cells from a time on (rule 11)."""

from __future__ import annotations

from itertools import pairwise

from hypothesis import given, settings
from hypothesis import strategies as st

from batch_layer.rebuild_index import first_offsets_since, next_rebuild_index

BUCKET = 60_000

events = st.lists(
    st.tuples(st.integers(0, 2), st.integers(0, 30 * BUCKET)),  # (partition, event time)
    max_size=60,
)
thresholds = st.lists(st.integers(0, 30).map(lambda k: k * BUCKET), min_size=1, max_size=4)


def _runs(log: list[tuple[int, int]], cuts: list[int], ws: list[int]) -> list[list[tuple]]:
    """The log's (partition, time, offset) records split into consecutive runs."""
    offsets: dict[int, int] = {}
    records = []
    for partition, time in log:
        records.append((partition, time, offsets.get(partition, 0)))
        offsets[partition] = offsets.get(partition, 0) + 1
    bounds = [0, *sorted(c % (len(records) + 1) for c in cuts), len(records)]
    return [records[lo:hi] for lo, hi in pairwise(bounds)][: len(ws)]


def _found(records: list[tuple]) -> list[tuple[int, int, int]]:
    return [(p, t - t % BUCKET, o) for p, t, o in records]


@settings(max_examples=200, deadline=None)
@given(events, st.lists(st.integers(0, 100), min_size=3, max_size=3), thresholds)
def test_kept_index_equals_rereading_everything(
    log: list[tuple[int, int]], cuts: list[int], ws: list[int]
) -> None:
    ws = sorted(ws)  # W never decreases
    index: dict[int, list[list[int]]] = {}
    seen: list[tuple] = []
    for records, w in zip(_runs(log, cuts, ws), ws, strict=False):
        seen += records
        index = next_rebuild_index(index, _found(records), w)
        rebuild_from = {p: min(o for _, o in pairs) for p, pairs in index.items()}
        expected: dict[int, int] = {}
        for p, t, o in seen:
            if t >= w:
                expected[p] = min(o, expected.get(p, o))
        assert rebuild_from == expected
        assert index == next_rebuild_index({}, _found(seen), w)  # as a full run computes it


@settings(max_examples=200, deadline=None)
@given(
    events,
    st.lists(st.integers(0, 100), min_size=3, max_size=3),
    thresholds,
    st.integers(0, 31).map(lambda k: k * BUCKET),
)
def test_index_says_where_events_since_a_time_begin(
    log: list[tuple[int, int]], cuts: list[int], ws: list[int], since: int
) -> None:
    ws = sorted(ws)
    index: dict[int, list[list[int]]] = {}
    seen: list[tuple] = []
    for records, w in zip(_runs(log, cuts, ws), ws, strict=False):
        seen += records
        index = next_rebuild_index(index, _found(records), w)
        firsts = first_offsets_since(index, since, w)
        if since < w:
            assert firsts is None  # the index forgot the buckets before W: read from offset 0
            continue
        expected: dict[int, int] = {}
        for p, t, o in seen:
            if t >= since:
                expected[p] = min(o, expected.get(p, o))
        assert firsts == expected
