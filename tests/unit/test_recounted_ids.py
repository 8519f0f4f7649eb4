"""Which copies count when an incremental run re-reads events an earlier run counted, to
recompute cells a table change touched (rules 4 and 11): each id still counts once."""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from batch_layer.aggregate import IdLookup, SourceRead, _Copies, _positions, _uncounted


def _copies(rows: list[tuple[int, int, str]]) -> pa.Table:
    partitions, offsets, ids = zip(*rows, strict=True) if rows else ((), (), ())
    return pa.table(
        {
            "partition": pa.array(partitions, pa.int32()),
            "offset": pa.array(offsets, pa.int64()),
            "event_id": pa.array(ids, pa.string()),
        }
    )


def _id_table(counted: dict[str, tuple[int, int]]) -> IdLookup:
    """The id table's lookup over `counted` (id -> the position of its counted copy)."""

    def lookup(candidates: pa.Table) -> pa.Table:
        known = [i for i in candidates.column("event_id").to_pylist() if i in counted]
        return _copies([(*counted[i], i) for i in known])

    return lookup


def _at(*positions: tuple[int, int]) -> set[int]:
    return set(_positions(_copies([(p, o, "x") for p, o in positions])).tolist())


def test_each_id_counts_once_when_counted_copies_are_read_again() -> None:
    copies = _Copies(
        # new first copies: "new" never seen, "dup" counted by an earlier run
        firsts=_copies([(0, 20, "dup"), (0, 21, "new")]),
        # re-read first copies: "kept" is its counted copy, "moved" stands for its counted copy
        # at (1, 5) (read again too), "gone" was counted before the read's first offset
        counted_before=_copies([(0, 3, "kept"), (0, 4, "moved"), (0, 6, "gone")]),
        later=_positions(_copies([(1, 5, "moved"), (0, 22, "kept"), (0, 23, "gone")])),
    )
    lookup = _id_table({"dup": (0, 1), "kept": (0, 3), "moved": (1, 5), "gone": (0, 0)})
    new, dropped = _uncounted(copies, lookup, SourceRead(starts={0: 2, 1: 0}))
    assert new.column("event_id").to_pylist() == ["new"]
    assert set(dropped.tolist()) == _at((1, 5), (0, 22), (0, 23), (0, 20), (0, 6))
    counted = _at((0, 20), (0, 21), (0, 3), (0, 4), (0, 6)) - set(dropped.tolist())
    assert counted == _at((0, 21), (0, 3), (0, 4))  # new, kept, moved: once each


def test_a_read_from_offset_0_needs_no_lookup_of_copies_read_again() -> None:
    copies = _Copies(
        firsts=_copies([]),
        counted_before=_copies([(0, 3, "kept")]),
        later=np.array([], np.int64),
    )

    def refuse(_: pa.Table) -> pa.Table:
        raise AssertionError("the whole history was read: its first copies are the counted ones")

    new, dropped = _uncounted(copies, refuse, SourceRead(starts={}))
    assert new.num_rows == 0 and len(dropped) == 0
