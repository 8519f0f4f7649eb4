"""Planning a read of the merged view, without I/O: from a request and the served row it is
planned against, which windows come from the batch view alone, which straddle W and which come
from the speed view alone (rule 8 in docs/semantics.md); which batch cells the one PostgreSQL
statement fetches (`cell_query`), which speed base cells the one Redis round trip reads
(`speed_read`), and which cached batch-only points it reuses (`known`). A plan is immutable:
when the served row changes under a read, the request is planned again
(`BatchViewReader.guarded`), it is never patched.

One plan class per shape of answer: one key's series (`KeySeriesPlan`), a sliced series
(`SlicedPlan`), a ranking (`TopPlan`). A new shape is a new plan class here and its statement
in `batch_view`; `merged_view` reads, merges and caches every shape the same way."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Generic, NamedTuple, Protocol, TypeVar

import orjson

from serving_layer.batch_view import BatchPlan, CellQuery, StoredCell
from serving_layer.errors import RetentionExpired
from serving_layer.selection import Selection
from serving_layer.served_row import ServedRow
from serving_layer.timefmt import format_time
from shared.aggregations import Ranking
from shared.durations import format_duration
from shared.metric_plan import MetricPlan
from shared.windows import CellRef, WindowPlan

Window = tuple[int, int]
"""`[start, end)` in epoch milliseconds."""

Group = tuple[str, ...]
"""A group's values of the `group_by` dimensions (`()` without `group_by`)."""


class Point(NamedTuple):
    """One window's point of one group: its outputs as the aggregations render them and,
    rendered once when it was merged, its JSON (an HTTP body embeds it as is)."""

    window: Window
    source: str
    """Where its cells came from by the window's position against W (`point_source`)."""
    values: dict[str, Any]
    json: orjson.Fragment
    weight: int
    """About the bytes it holds: its JSON and, beside it, the values it was rendered from
    (taken as twice the JSON's length)."""

    @classmethod
    def of(cls, window: Window, source: str, values: dict[str, Any]) -> Point:
        head = {"start": format_time(window[0]), "end": format_time(window[1]), "source": source}
        data = orjson.dumps({**head, **values})
        return cls(window, source, values, orjson.Fragment(data), 3 * len(data))


WindowPoints = dict[Group, Point]
"""One window's point per group (a group without events has none)."""


SeriesRows = dict[Group, list[Point]]
"""Each group's points, ascending by start."""

RankedGroups = list[tuple[Group, Any]]
"""Groups and their ranked values, best first."""

CachedCells = Mapping[CellRef, Sequence[StoredCell]]
"""Stored cells read for an earlier request under the same served stamp, by cell: the batch
part of windows reaching past W, which a plan then does not read again (`MergedView.cells`)."""

Rows = TypeVar("Rows")


@dataclass
class Answer(Generic[Rows]):
    """What a read of the merged view found, of every shape (`serving_layer.query`): its rows
    and their provenance."""

    rows: Rows
    watermark: int | None
    """W of the served row the answer was planned against."""
    speed_status: str
    batch_status: str = "ok"
    """"unavailable": PostgreSQL did not answer; only windows from W on (rule 12)."""
    stamp: str | None = None
    """The served row the batch cells were read under (its `xmin`)."""
    batch_cells: int = 0
    """Batch cells merged (a cached window counts its cells)."""
    speed_states: int = 0
    """Speed sub-cell states merged."""


class SpeedRead(NamedTuple):
    """The speed base cells a plan reads in its one Redis round trip: one key's sub-cells
    (`key`) or every key's."""

    starts: tuple[int, ...]
    key: Group | None = None


class ReadPlan(BatchPlan, Protocol):
    """What the read pipeline (`merged_view`) asks of every plan: besides what the batch
    view's guarded read asks (`BatchPlan`: the served row and the cells), its speed read and
    what it keeps or reuses of the batch part."""

    @property
    def speed_read(self) -> SpeedRead: ...

    @property
    def live_refs(self) -> Sequence[CellRef]:
        """The batch cells of the windows reaching past W: their merge changes with every
        speed write, their rows only with the served stamp (kept in `MergedView.cells`)."""
        ...

    @property
    def cached(self) -> CachedCells: ...


def split_starts(
    starts: range, window_ms: int, watermark: int | None
) -> tuple[range, range, range]:
    """`starts` (stepping by `window_ms`) cut by position against W (rule 8): windows ending
    at or before W (batch), the one straddling W (mixed; empty when W is on a boundary) and
    windows starting at or after W (speed)."""
    if watermark is None:
        return starts[:0], starts[:0], starts
    if not starts:
        return starts, starts, starts
    first = starts[0]
    batch = min(len(starts), max(0, (watermark - first) // window_ms))
    speed = min(len(starts), max(0, -(-(watermark - first) // window_ms)))
    return starts[:batch], starts[batch:speed], starts[speed:]


def check_retained(metric: MetricPlan, windows: Iterable[Window], watermark: int | None) -> None:
    """RetentionExpired when a window would merge a stored cell retention removed (rule 14):
    the message says from when each window size is kept. `windows` ascending."""
    kinds = metric.windows
    bound = kinds.retention_bound(watermark)
    if bound is None:
        return
    for start, end in windows:
        if start >= bound:
            return
        cell = kinds.expired_cell(start, end - start, watermark)
        if cell is not None:
            kept = ", ".join(
                f"{format_duration(size)} from {format_time(first)}"
                if (first := kinds.kept_from(size, watermark)) is not None
                else f"{format_duration(size)} always"
                for size in kinds.sizes_ms
            )
            raise RetentionExpired(
                f"{metric.name} keeps its {format_duration(cell.size_ms)} cells back to "
                f"{format_time(kinds.kept_from(cell.size_ms, watermark) or 0)} (retention, "
                f"counted from W {format_time(watermark or 0)}), and the window starting "
                f"{format_time(start)} needs one from {format_time(cell.start_ms)}. Kept: "
                f"{kept}; start later, or ask for a coarser window"
            )


def batch_only(window: Window, watermark: int | None) -> bool:
    """Whether a window ends at or before W: its points are cached for one served stamp."""
    return watermark is not None and window[1] <= watermark


@dataclass(frozen=True)
class KeySeriesPlan:
    """One key's windows of a configured size (`window_ms`), starts split at W: batch-only
    windows from `known` points or merged from the batch cells alone, the window straddling
    W and the speed-only windows merged with the speed view."""

    metric: MetricPlan
    key: Group
    window_ms: int
    served: ServedRow
    batch: range
    mixed: range
    speed: range
    known: Mapping[int, WindowPoints]
    """The batch-only points cached for the served stamp, by window start."""
    composed: Mapping[int, WindowPlan]
    """How each window that is merged from the batch view is composed, by start: the
    batch-only windows not `known`, then the one straddling W."""
    cached: CachedCells = field(default_factory=dict)

    @classmethod
    def of(
        cls,
        metric: MetricPlan,
        key: Group,
        window_ms: int,
        starts: range,
        served: ServedRow,
        known: Mapping[int, WindowPoints],
    ) -> KeySeriesPlan:
        check_retained(metric, ((s, s + window_ms) for s in starts), served.watermark)
        batch, mixed, speed = split_starts(starts, window_ms, served.watermark)
        if not served.reachable:  # rule 12: the windows from W on only, all speed
            batch = mixed = starts[:0]
        windows, watermark = metric.windows, served.watermark
        missing = [start for start in batch if start not in known]
        composed: dict[int, WindowPlan] = (
            {start: WindowPlan((CellRef(window_ms, start),), ()) for start in missing}
            if window_ms == windows.base_ms
            else {start: windows.compose(start, window_ms, watermark) for start in missing}
        )
        for start in mixed:
            composed[start] = windows.compose(start, window_ms, watermark)
        return cls(metric, key, window_ms, served, batch, mixed, speed, known, composed)

    @property
    def cell_query(self) -> CellQuery:
        needs: dict[CellRef, bool] = {}
        needs_sketches = self.metric.aggregations.needs_sketches
        for plan in self.composed.values():
            need = needs_sketches(len(plan.batch_cells) + len(plan.speed_cells))
            for ref in plan.batch_cells:
                if ref not in self.cached:
                    needs[ref] = needs.get(ref, False) or need
        return CellQuery.one_key(self.key, needs)

    @property
    def live_refs(self) -> list[CellRef]:
        return [ref for start in self.mixed for ref in self.composed[start].batch_cells]

    @property
    def mixed_speed_cells(self) -> list[int]:
        """The speed base cells of the window straddling W (none when W is on a boundary)."""
        return [s for start in self.mixed for s in self.composed[start].speed_cells]

    @property
    def speed_read(self) -> SpeedRead:
        starts = self.mixed_speed_cells
        if self.speed:
            end = self.speed[-1] + self.window_ms
            starts.extend(self.metric.windows.cell_starts(self.speed[0], end))
        return SpeedRead(tuple(starts), self.key)


@dataclass(frozen=True)
class SlicedPlan:
    """Every group's points of `selection` over any windows (of any multiple of the base
    cell, hopping, aligned to a time zone): each window composed by rule 8, the batch-only
    ones `known` reused. `deferred`: another request reads the same batch-only windows, so
    this one reads the served row alone and waits for it (`ReadsInFlight`)."""

    metric: MetricPlan
    selection: Selection
    served: ServedRow
    windows: Mapping[Window, WindowPlan]
    known: Mapping[Window, WindowPoints]
    max_cells: int
    deferred: bool = False
    cached: CachedCells = field(default_factory=dict)

    @classmethod
    def of(
        cls,
        metric: MetricPlan,
        windows: Sequence[Window],
        selection: Selection,
        served: ServedRow,
        known: Mapping[Window, WindowPoints],
        max_cells: int,
    ) -> SlicedPlan:
        watermark = served.watermark
        check_retained(metric, windows, watermark)
        if not served.reachable and watermark is not None:  # rule 12: from W on, all speed
            windows = [window for window in windows if window[0] >= watermark]
        plans = {
            (start, end): metric.windows.compose(start, end - start, watermark)
            for start, end in windows
        }
        return cls(metric, selection, served, plans, known, max_cells)

    @property
    def misses_batch_points(self) -> bool:
        """Whether a batch-only window is not cached (its cells must be read and merged)."""
        watermark = self.served.watermark
        return any(batch_only(w, watermark) and w not in self.known for w in self.windows)

    def deferring(self) -> SlicedPlan:
        return replace(self, deferred=True)

    @property
    def cell_query(self) -> CellQuery:
        refs: Sequence[CellRef] = ()
        if not self.deferred:
            refs = sorted(
                {
                    ref
                    for window, plan in self.windows.items()
                    if window not in self.known
                    for ref in plan.batch_cells
                    if ref not in self.cached
                }
            )
        return CellQuery.sliced(self.selection, refs, self.max_cells)

    @property
    def live_refs(self) -> list[CellRef]:
        watermark = self.served.watermark
        live = (p.batch_cells for w, p in self.windows.items() if not batch_only(w, watermark))
        return sorted({ref for refs in live for ref in refs})

    @property
    def speed_read(self) -> SpeedRead:
        """The speed base cells of every window: one key's sub-cells alone when the selection
        names one key (a window that is not configured, hopping or in a time zone)."""
        starts = tuple(sorted({s for p in self.windows.values() for s in p.speed_cells}))
        return SpeedRead(starts, self.selection.exact_key)


@dataclass(frozen=True)
class TopPlan:
    """Every group's ranked value over one window; a batch-only window's ranking `known`
    for the served stamp is reused whole."""

    metric: MetricPlan
    ranking: Ranking
    selection: Selection
    start: int
    window_ms: int
    served: ServedRow
    window: WindowPlan
    known: tuple[RankedGroups, int] | None
    """The cached ranking and the batch cells it was merged from."""
    max_cells: int
    cached: CachedCells = field(default_factory=dict)

    @classmethod
    def of(
        cls,
        metric: MetricPlan,
        ranking: Ranking,
        selection: Selection,
        start: int,
        window_ms: int,
        served: ServedRow,
        known: tuple[RankedGroups, int] | None,
        max_cells: int,
    ) -> TopPlan:
        check_retained(metric, [(start, start + window_ms)], served.watermark)
        window = metric.windows.compose(start, window_ms, served.watermark)
        known = None if window.speed_cells or served.watermark is None else known
        return cls(metric, ranking, selection, start, window_ms, served, window, known, max_cells)

    @property
    def cell_query(self) -> CellQuery:
        refs = () if self.known is not None else self.window.batch_cells
        parts = len(refs) + len(self.window.speed_cells)
        unread = [ref for ref in refs if ref not in self.cached]
        sketch = self.ranking.slot + 1
        merges_keys = self.selection.group_by != self.metric.key
        return CellQuery.ranked(
            self.selection,
            unread,
            self.max_cells,
            sketch=sketch,
            # one stored cell per group and no speed cells: its summary may be the answer
            union=self.ranking.needs_sketch(parts) or (merges_keys and sketch > 0),
        )

    @property
    def live_refs(self) -> Sequence[CellRef]:
        return self.window.batch_cells if self.window.speed_cells else ()

    @property
    def speed_read(self) -> SpeedRead:
        return SpeedRead(self.window.speed_cells)


def keys_speed_starts(metric: MetricPlan, start: int, end: int, watermark: int | None) -> range:
    """The speed base cells whose keys `keys` lists: those of `[start, end)` after W."""
    return metric.windows.cell_starts(start if watermark is None else max(start, watermark), end)
