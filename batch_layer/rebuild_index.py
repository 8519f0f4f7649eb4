"""The rebuild index (rule 5): where the next `rebuild_from` can point, kept from run to run so
an incremental run finds it from its new events alone (cost follows new data)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

RebuildIndex = dict[int, list[list[int]]]
"""partition -> `[bucket_start_ms, smallest offset]` of the source-valid events in each time
bucket at or after the source's smallest W, in bucket order. The history index has the same
shape: buckets of `HISTORY_BUCKET_MS` over the whole history (kept with `next_rebuild_index`
and no threshold)."""

HISTORY_BUCKET_MS = 86_400_000
"""The history index's bucket, a UTC day: ~365 entries a partition a year."""


def next_rebuild_index(
    previous: Mapping[int, Sequence[Sequence[int]]],
    found: Iterable[tuple[int, int, int]],
    threshold: int | None,
) -> RebuildIndex:
    """Merge the previous index with the `(partition, bucket_start, smallest offset)` found
    among the events read now, keeping the buckets at or after `threshold` (the new smallest W,
    a bucket boundary; it never decreases, so the dropped buckets are never needed again).

    Every event at or after the old W lies at or after the old `rebuild_from`, so an index kept
    from run to run holds every event a later `rebuild_from` can point at (rule 5), and an
    incremental run need not re-read the events after the old W."""
    smallest: dict[tuple[int, int], int] = {}
    entries = [(p, b, o) for p, pairs in previous.items() for b, o in pairs]
    for partition, bucket, offset in [*entries, *found]:
        if threshold is None or bucket >= threshold:
            key = (partition, bucket)
            smallest[key] = min(offset, smallest.get(key, offset))
    index: RebuildIndex = {}
    for (partition, bucket), offset in sorted(smallest.items()):
        index.setdefault(partition, []).append([bucket, offset])
    return index


def first_offsets_since(
    index: Mapping[int, Sequence[Sequence[int]]], since: int, threshold: int | None
) -> dict[int, int] | None:
    """partition -> the smallest offset of a source-valid event at or after `since` (a bucket
    boundary), by an index kept from `threshold` on (None: from the beginning); partitions with
    none are absent. None when the index does not reach back to `since`."""
    if threshold is not None and since < threshold:
        return None
    firsts = {p: [o for bucket, o in pairs if bucket >= since] for p, pairs in index.items()}
    return {p: min(offsets) for p, offsets in firsts.items() if offsets}
