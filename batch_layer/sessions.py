"""Sessions in the batch layer (rule 13 in docs/semantics.md): every event's session, found by
one sort-based pass over each key's events — Spark shuffles the events by (metric, key) and
sorts each task's rows by key and time, and `shared.sessions.session_firsts` reads them as
Arrow batches, so no Python code runs per event.

Spark's own `session_window` cuts only at a pause; the cut at `max_duration` depends on each
session's first event, which a window function cannot carry from row to row."""

from __future__ import annotations

from collections.abc import Iterator, Mapping

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.sql.types import LongType, StructField, StructType

from shared.sessions import SessionRule, session_firsts

SESSION_COLUMN = "session_ms"
"""A column `with_sessions` adds: the time of the first event of the row's session."""
DURATION_COLUMN = "session_duration_ms"
"""A column `with_sessions` adds: the row's session's duration (last event time minus first)
on one row of each session, null on the others, so an aggregate over it sees each session
once."""

_GROUP = "_session_group"
SEPARATOR = "\x00"
"""Joins a row's metric and key dimensions into one text that names its group exactly: no
metric name or key dimension holds a NUL (rule 1's validity, `shared.events`)."""


def with_sessions(inputs: DataFrame, rules: Mapping[str, SessionRule], tasks: int) -> DataFrame:
    """`inputs` (rows with `metric`, `key` and `time_ms`, of the metrics in `rules` only) with
    `session_ms` and `session_duration_ms` added, in `tasks` partitions by (metric, key)."""
    if not rules:
        raise ValueError("no session metric to sessionize")
    grouped = inputs.withColumn(
        _GROUP, F.concat_ws(SEPARATOR, F.col("metric"), F.array_join(F.col("key"), SEPARATOR))
    )
    schema = StructType(
        [
            *grouped.schema.fields,
            StructField(SESSION_COLUMN, LongType(), nullable=False),
            StructField(DURATION_COLUMN, LongType(), nullable=True),
        ]
    )
    sessionize = _Sessionize(dict(rules))
    return (
        grouped.repartition(tasks, _GROUP)
        .sortWithinPartitions(_GROUP, "time_ms")
        .mapInArrow(sessionize, schema)
        .drop(_GROUP)
    )


class _Sessionize:
    """The pass over one task's sorted batches. A group's rows may continue in the next
    batch, so the last group of a batch is held back until the group after it (or the
    task's end) shows it complete; a group is thus read whole, once."""

    def __init__(self, rules: dict[str, SessionRule]) -> None:
        self.rules = rules

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        held: pa.Table | None = None
        for batch in batches:
            rows = pa.Table.from_batches([batch])
            if held is not None:
                rows = pa.concat_tables([held, rows])
            if not len(rows):
                continue
            complete = self._first_of_last_group(rows.column(_GROUP))
            if complete:
                yield from self._sessionized(rows.slice(0, complete)).to_batches()
            held = rows.slice(complete)
        if held is not None and len(held):
            yield from self._sessionized(held).to_batches()

    @staticmethod
    def _first_of_last_group(groups: pa.ChunkedArray) -> int:
        """The position of the first row of the last group (rows sorted by group)."""
        last = groups[len(groups) - 1]
        return len(groups) - int(pc.sum(pc.equal(groups, last)).as_py())

    def _sessionized(self, rows: pa.Table) -> pa.Table:
        groups = rows.column(_GROUP).combine_chunks()
        times = rows.column("time_ms").to_numpy().astype(np.int64)
        metrics = rows.column("metric").to_numpy(zero_copy_only=False)
        new_group = np.ones(len(rows), dtype=np.bool_)
        if len(rows) > 1:
            same = pc.equal(groups.slice(1), groups.slice(0, len(rows) - 1))
            new_group[1:] = ~same.to_numpy(zero_copy_only=False)
        firsts = np.empty(len(rows), dtype=np.int64)
        for name, rule in self.rules.items():
            mine = metrics == name
            if mine.any():
                firsts[mine] = session_firsts(times[mine], new_group[mine], rule)
        ends = np.ones(len(rows), dtype=np.bool_)  # the last row of its session
        ends[:-1] = new_group[1:] | (firsts[1:] != firsts[:-1])
        durations = pa.array(times - firsts, pa.int64(), mask=~ends)
        return rows.append_column(SESSION_COLUMN, pa.array(firsts, pa.int64())).append_column(
            DURATION_COLUMN, durations
        )
