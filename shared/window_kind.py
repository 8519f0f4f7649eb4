"""A metric's window kind: how its events fall into stored cells, when a cell is late, where W
lies and how a queried window is composed from cells — the one object the speed processor,
the batch aggregation and the serving planner ask, so a kind's arithmetic is written once.

Every metric today is `TumblingWindows` (rules 1, 2, 5 and 8 in docs/semantics.md): epoch-
aligned tumbling cells of the metric's smallest window, the base; every configured window is a
multiple of it and is the merge of its cells, as are hopping and zoned windows the serving
layer composes. The pure definitions stay in `shared.windows` and `shared.lateness`; this
class binds them to a metric's windows.

`SessionWindows` (rule 13) holds a key's sessions instead, bucketed by their first event into
tumbling windows; the session arithmetic itself is `shared.sessions`'."""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

from shared.lateness import batch_watermark, latest_late_start
from shared.sessions import SessionRule
from shared.windows import CellRef, WindowPlan, plan_window, window_start, window_starts


@dataclass(frozen=True, slots=True)
class TumblingWindows:
    """Tumbling windows of `sizes_ms` (ascending, each a multiple of the first: the base
    cell both layers store per key)."""

    sizes_ms: tuple[int, ...]
    retention_ms: tuple[tuple[int, int], ...] = ()
    """(size, how long its cells are kept back from W) of the sizes not kept forever (rule 14
    in docs/semantics.md)."""

    def __post_init__(self) -> None:
        if not self.sizes_ms or any(size % self.sizes_ms[0] for size in self.sizes_ms):
            raise ValueError(f"windows {self.sizes_ms} are not multiples of the smallest")

    @property
    def base_ms(self) -> int:
        """The base cell's size: the smallest window."""
        return self.sizes_ms[0]

    @property
    def aligned_ms(self) -> int:
        """The span every window's boundaries fall on (their least common multiple): a time
        floored to it starts a window of every size, so no cell straddles it."""
        return math.lcm(*self.sizes_ms)

    def cell_start(self, time_ms: int) -> int:
        """The start of the base cell an event at `time_ms` falls in (rule 1)."""
        return time_ms - time_ms % self.sizes_ms[0]

    def cell_end(self, start_ms: int) -> int:
        """The end of the base cell starting at `start_ms`."""
        return start_ms + self.sizes_ms[0]

    def cell_starts(self, start_ms: int, end_ms: int) -> range:
        """The starts of the base cells starting in `[start_ms, end_ms)`."""
        return window_starts(start_ms, end_ms, self.sizes_ms[0])

    def latest_late_start(
        self, grace_ms: int, stream_time_ms: int | None, watermark_ms: int | None
    ) -> int:
        """The latest start of a late base cell (rule 2; `shared.lateness.latest_late_start`)."""
        return latest_late_start(self.sizes_ms[0], grace_ms, stream_time_ms, watermark_ms)

    def watermark(
        self, previous_ms: int | None, stream_times_ms: Iterable[int], grace_ms: int
    ) -> int | None:
        """W after a run that saw the partitions' `stream_times_ms` (rule 5)."""
        return batch_watermark(previous_ms, stream_times_ms, grace_ms, self.sizes_ms[0])

    def compose(self, start_ms: int, size_ms: int, watermark_ms: int | None) -> WindowPlan:
        """The cells the window `[start_ms, start_ms + size_ms)` merges (rule 8): stored
        batch cells up to W, coarsest first, then speed base cells."""
        return plan_window(start_ms, size_ms, self.sizes_ms[0], watermark_ms, self.sizes_ms)

    def kept_from(self, size_ms: int, watermark_ms: int | None) -> int | None:
        """The start of the first cell of `size_ms` retention keeps (rule 14): the one holding
        `W - retention`, and every later one. None when it keeps them all (no retention for
        the size, or no W yet)."""
        for size, retention in self.retention_ms:
            if size == size_ms and watermark_ms is not None:
                return window_start(watermark_ms - retention, size_ms)
        return None

    def retention_bound(self, watermark_ms: int | None) -> int | None:
        """A time from which on no window merges a cell retention removed (the latest
        `kept_from` of the retained sizes); None when retention removes nothing."""
        kept = [self.kept_from(size, watermark_ms) for size, _ in self.retention_ms]
        return max((k for k in kept if k is not None), default=None)

    def expired_cell(self, start_ms: int, size_ms: int, watermark_ms: int | None) -> CellRef | None:
        """The first stored cell the window `[start_ms, start_ms + size_ms)` would merge (rule
        8) that retention removed (rule 14); None when it merges none."""
        for cell in self.compose(start_ms, size_ms, watermark_ms).batch_cells:
            first = self.kept_from(cell.size_ms, watermark_ms)
            if first is not None and cell.start_ms < first:
                return cell
        return None

    def floor_aligned(self, time_ms: int) -> int:
        """`time_ms` floored to a boundary of every window (`aligned_ms`)."""
        return window_start(time_ms, self.aligned_ms)


@dataclass(frozen=True, slots=True)
class SessionWindows:
    """Sessions of `rule`, each in the bucket of `buckets`' windows its first event falls in
    (rule 13 in docs/semantics.md)."""

    rule: SessionRule
    buckets: TumblingWindows

    def bucket_start(self, first_ms: int) -> int:
        """The start of the base bucket a session whose first event is at `first_ms` counts
        in."""
        return self.buckets.cell_start(first_ms)

    def watermark(
        self, previous_ms: int | None, stream_times_ms: Iterable[int], grace_ms: int
    ) -> int | None:
        """The sessions' W after a run that saw the partitions' `stream_times_ms`: rule 5's W
        held back by `max_duration`, so a session starting before it ended before the grace
        began on the most advanced partition, and no later event can join it."""
        return self.buckets.watermark(
            previous_ms, stream_times_ms, grace_ms + self.rule.max_duration_ms
        )

    def is_late(
        self, time_ms: int, grace_ms: int, stream_time_ms: int | None, watermark_ms: int | None
    ) -> bool:
        """Whether the speed layer drops an event at `time_ms`: the grace has passed it on its
        partition (Kafka Streams' rule for a session), or it is so close to W that a session
        the batch view serves could hold it (before W plus `max_duration`)."""
        if stream_time_ms is not None and time_ms + grace_ms <= stream_time_ms:
            return True
        return watermark_ms is not None and time_ms < watermark_ms + self.rule.max_duration_ms
