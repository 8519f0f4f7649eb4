"""The served-generation row (rule 6): one row naming the generation readers use, the offset
snapshot it was computed from, W per metric, `rebuild_from` per partition and the index that
finds the next `rebuild_from` (rule 5)."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import psycopg


@dataclass(frozen=True)
class ServedView:
    generation: int
    snapshot: dict[str, dict[str, int]]
    """topic -> partition (as text) -> first offset not read."""
    watermarks: dict[str, int]
    """metric -> W in epoch ms."""
    rebuild_from: dict[str, dict[str, int]]
    """topic -> partition (as text) -> smallest offset whose event time is >= W."""
    versions: dict[str, str]
    """metric -> version of the metric definition the cells were computed with."""
    rebuild_index: dict[str, dict[str, list[list[int]]]] = field(default_factory=dict)
    """topic -> partition (as text) -> `[bucket_start_ms, smallest offset]` of the source-valid
    events in each time bucket at or after the source's smallest W, in bucket order (empty
    when unknown: then an incremental run re-reads from `rebuild_from`)."""
    history_index: dict[str, dict[str, list[list[int]]]] | None = None
    """topic -> partition (as text) -> `[day_start_ms, smallest offset]` of the source-valid
    events of each UTC day of the whole history (None, or a topic absent: unknown until a full
    run builds it)."""
    stream_times: dict[str, dict[str, int]] = field(default_factory=dict)
    """topic -> partition (as text) -> the partition's stream time (rule 2) at the snapshot:
    the latest event time read from it (empty: published before it was kept)."""
    published_at: datetime | None = field(default=None, compare=False)
    """When the row was last published (not part of what is served: a run that changes no cell
    still stamps it)."""

    def watermark(self, metric: str, version: str) -> int | None:
        """W of a metric, or None when the served cells are of another version (or none)."""
        if self.versions.get(metric) != version:
            return None
        return self.watermarks.get(metric)


CHANNEL = "lp_served"
"""The channel every write of the served row is announced on (migration 0010's trigger on
`served_view`), with the row's new stamp (`xmin`) as the payload, '' when no row is left.
NOTIFY is delivered when the writing transaction commits, so only committed publications are
announced; a listener that was not connected then hears nothing of it (re-read the row after
`LISTEN`)."""

STAMPED_SQL = "SELECT xmin::text, generation, watermarks, versions FROM served_view WHERE id = 1"
"""What a reader holding the row keeps of it: its stamp (every publication rewrites the row,
rule 6), the generation, W and the version of every metric."""


_SELECT = (
    "SELECT generation, snapshot, watermarks, rebuild_from, versions, rebuild_index, "
    "history_index, stream_times, published_at "
    "FROM served_view WHERE id = 1"
)


def read_served(conn: psycopg.Connection[Any]) -> ServedView | None:
    """The served row as seen by `conn`'s current snapshot; None before the first batch run."""
    row = conn.execute(_SELECT).fetchone()
    return None if row is None else ServedView(*row)


_REPLAY_LAG = """
SELECT CASE WHEN pg_last_wal_receive_lsn() = pg_last_wal_replay_lsn() THEN 0
            ELSE extract(epoch FROM now() - pg_last_xact_replay_timestamp()) END
"""


def replay_lag_s(conn: psycopg.Connection[Any]) -> float | None:
    """How far a streaming replica's replay is behind: 0 when it has replayed all it
    received, else the seconds since the commit it replayed last; None on a primary."""
    row = conn.execute(_REPLAY_LAG).fetchone()
    return None if row is None or row[0] is None else float(row[0])
