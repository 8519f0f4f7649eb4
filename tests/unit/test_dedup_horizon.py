"""`judge_copies` (rule 4's de-dup horizon) against the rule written out plainly, over random
logs: in one read from offset 0, and split in two runs, the second judging its new copies
from the first one's stream times and remembered ids, as an incremental run does."""

from __future__ import annotations

from collections.abc import Sequence

import pyarrow as pa
import pyarrow.compute as pc
from hypothesis import given, settings
from hypothesis import strategies as st

from batch_layer.dedup_horizon import judge_copies

HORIZON = 10

Row = tuple[int, int, str, int]
"""(partition, offset, event_id, time_ms)"""


@st.composite
def logs(draw: st.DrawFn) -> list[Row]:
    """A few partitions' records in offset order, ids from a small set (many copies), event
    times spread over a few horizons, out of order."""
    rows = []
    for partition in range(draw(st.integers(1, 3))):
        times = draw(st.lists(st.integers(0, 4 * HORIZON), max_size=25))
        ids = draw(st.lists(st.sampled_from("abcdef"), min_size=len(times), max_size=len(times)))
        rows += [
            (partition, offset, i, t) for offset, (i, t) in enumerate(zip(ids, times, strict=True))
        ]
    return rows


def counted_by_the_rule(rows: Sequence[Row]) -> set[tuple[int, int]]:
    """(partition, offset) of the copies that count, by the rule's own words: per partition,
    in offset order, a copy counts unless its id is remembered; an id is remembered from the
    copy that counted until the stream time has passed that copy's time by the horizon."""
    counted = set()
    for partition in {r[0] for r in rows}:
        stream_time = None
        remembered: dict[str, int] = {}
        for _, offset, event_id, t in sorted(r for r in rows if r[0] == partition):
            stream_time = t if stream_time is None else max(stream_time, t)
            last = remembered.get(event_id)
            if last is None or stream_time - last > HORIZON:
                remembered[event_id] = t
                counted.add((partition, offset))
    return counted


def _table(rows: Sequence[Row], new_from: dict[int, int]) -> pa.Table:
    return pa.table(
        {
            "event_id": pa.array([r[2] for r in rows], pa.string()),
            "partition": pa.array([r[0] for r in rows], pa.int32()),
            "offset": pa.array([r[1] for r in rows], pa.int64()),
            "time_ms": pa.array([r[3] for r in rows], pa.int64()),
            "clock_ms": pa.array([r[3] for r in rows], pa.int64()),
            "judged": pa.array([r[1] >= new_from.get(r[0], 0) for r in rows], pa.bool_()),
            "new": pa.array([r[1] >= new_from.get(r[0], 0) for r in rows], pa.bool_()),
        }
    )


def _counted(rows: Sequence[Row], judged: pa.Table) -> set[tuple[int, int]]:
    dropped = set(zip(judged["partition"].to_pylist(), judged["offset"].to_pylist(), strict=True))
    return {(r[0], r[1]) for r in rows} - dropped


@settings(max_examples=300, deadline=None)
@given(logs())
def test_one_read_counts_what_the_rule_counts(rows: list[Row]) -> None:
    judged = judge_copies(_table(rows, {}), HORIZON, {}, None)
    assert _counted(rows, judged.dropped) == counted_by_the_rule(rows)
    for partition in {r[0] for r in rows}:
        assert judged.stream_times[partition] == max(r[3] for r in rows if r[0] == partition)


@settings(max_examples=300, deadline=None)
@given(logs(), st.integers(0, 25))
def test_two_runs_count_what_one_read_counts(rows: list[Row], split: int) -> None:
    first_rows = [r for r in rows if r[1] < split]
    first = judge_copies(_table(first_rows, {}), HORIZON, {}, None)
    remembered = first.remembered

    def seen(candidates: pa.Table) -> pa.Table:
        found = []
        for partition, event_id in zip(
            candidates["partition"].to_pylist(), candidates["event_id"].to_pylist(), strict=True
        ):
            mask = pc.and_(
                pc.equal(remembered["partition"], partition),
                pc.equal(remembered["event_id"], event_id),
            )
            found.append(remembered.filter(mask))
        return pa.concat_tables([remembered.slice(0, 0), *found])

    second_rows = [r for r in rows if r[1] >= split]
    second = judge_copies(
        _table(second_rows, {p: split for p in range(3)}), HORIZON, first.stream_times, seen
    )
    counted = _counted(first_rows, first.dropped) | _counted(second_rows, second.dropped)
    assert counted == counted_by_the_rule(rows)
