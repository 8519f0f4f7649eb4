"""Rule 8 in docs/semantics.md at query time: one pipeline for every shape of answer.

1. plan (`read_plan`): the request against the served row last seen, reusing the batch-only
   points cached for its stamp;
2. read the batch view (`BatchViewReader.guarded`): W and the plan's cells in one PostgreSQL
   statement, the request planned again if a run published meanwhile;
3. read the speed view (`_read_speed`): the plan's base cells after W in one Redis round trip;
4. merge and render (`_merge_windows`): each window composed from both (`compose`), rendered by
   the aggregation registry (`render_window`), then the answer assembled by its shape.

The caches wrap these steps, never live inside them: batch-only points are looked up when
planning and kept after merging (`points`, `tops`), windows past W are kept by content
(`speed_points`), and identical cold sliced reads are coalesced (`reads`)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Hashable, Iterable, Iterator, Mapping, Sequence
from functools import partial
from itertools import chain, groupby
from operator import add, attrgetter
from typing import Any, NamedTuple, TypeVar

from serving_layer.batch_view import BatchViewReader, StoredCell
from serving_layer.caches import (
    BatchParts,
    LiveCells,
    ReadsInFlight,
    SpeedPointCache,
    StampedCache,
)
from serving_layer.errors import BatchViewUnreachable, TooManyCells
from serving_layer.pools import AsyncDb
from serving_layer.read_plan import (
    Answer,
    Group,
    KeySeriesPlan,
    Point,
    RankedGroups,
    SeriesRows,
    SlicedPlan,
    SpeedRead,
    TopPlan,
    Window,
    WindowPoints,
    keys_speed_starts,
)
from serving_layer.selection import Selection
from serving_layer.served_row import ServedRow
from shared.aggregations import CellState, Ranking, RenderOptions, decode_state, merge_states
from shared.config import Settings
from shared.metric_plan import MetricPlan
from shared.speed_view import AsyncRedis, SpeedViewReader, decode_key, encode_key
from shared.windows import CellRef, WindowPlan, point_source

WindowKey = TypeVar("WindowKey", int, Window)
"""How a shape names its windows in its caches: by start (one size), or `[start, end)`."""


def render_merge(
    metric: MetricPlan, parts: Sequence[CellState], options: RenderOptions
) -> dict[str, Any] | None:
    """The outputs of the merge of `parts` (a single stored cell renders from its summaries
    where its aggregations allow)."""
    return metric.aggregations.render(merge_states(metric.kinds, parts), options)


class SpeedCells(NamedTuple):
    """What a plan's speed read found: the status, and per base cell start each key's
    (encoded) sub-cell states."""

    status: str
    by_start: Mapping[int, Mapping[bytes, list[bytes]]]

    @property
    def states(self) -> int:
        return sum([len(states) for cell in self.by_start.values() for states in cell.values()])

    def chunks(self, starts: Iterable[int]) -> list[bytes]:
        """The given base cells' content as one sequence of chunks: per key, the key, its
        number of states, then the states (so which key holds what is part of the content);
        empty when they hold no state."""
        content: list[bytes] = []
        by_start = self.by_start
        for start in starts:
            cell = by_start.get(start)
            if cell:
                for encoded, states in cell.items():
                    content.append(encoded)
                    content.append(len(states).to_bytes(4, "little"))
                    content.extend(states)
        return content


class MergedView:
    """The merged batch + speed view of every configured metric (one per app)."""

    def __init__(self, settings: Settings, client: AsyncRedis) -> None:
        self.settings = settings
        self.speed = SpeedViewReader(client)
        self.batch = BatchViewReader(settings.speed.cleanup_delay_s)
        self.points = StampedCache(settings.serving.cache_points)
        """Rendered points of batch-only windows per answer, valid for one served stamp:
        window -> its point per group."""
        self.tops = StampedCache(settings.serving.cache_points)
        """Rankings of batch-only `top` windows per (metric, window, start, by, selection)."""
        self.cells = LiveCells(settings.serving.live_cells_cache_bytes)
        """Stored cells of windows reaching past W per answer, valid for one served stamp."""
        self.speed_points = SpeedPointCache(settings.serving.speed_cache_bytes)
        """Rendered points of windows reaching past W, by content."""
        self.batch_parts = BatchParts(settings.serving.live_cells_cache_bytes)
        """The batch part of `keys` and of one key's `sessions` per query, for one stamp."""
        self.reads = ReadsInFlight()
        """Sliced reads of batch-only windows in progress, so identical cold requests wait."""

    async def series(
        self,
        db: AsyncDb,
        metric: MetricPlan,
        window_ms: int,
        starts: range,
        key: Group,
        options: RenderOptions,
    ) -> Answer[SeriesRows]:
        """One key's rendered points of the windows starting at `starts` (a range stepping by
        `window_ms`, a configured window)."""
        name = ("series", metric.name, window_ms, key, options)
        plan, stored = await self.batch.guarded(
            db,
            metric,
            lambda served: self.cells.with_cached(
                name,
                KeySeriesPlan.of(metric, key, window_ms, starts, served, self._known(name, served)),
            ),
        )
        stored = self.cells.keep(name, plan, stored)
        read = plan.speed_read
        encoded = encode_key(key)
        if read.starts:
            status, by_start = await self.speed.read_key(metric, read.starts, encoded)
        else:
            status, by_start = await self.speed.status(), {}
        mixed_cells = {s: {encoded: by_start[s]} for s in plan.mixed_speed_cells if s in by_start}
        cells = GroupedCells(
            stored, SpeedCells(status, mixed_cells), Selection(metric.key), bool(metric.kinds)
        )
        merging = list(plan.composed)
        ends = map(partial(add, window_ms), merging)
        merged = await self._merge_windows(
            name,
            metric,
            plan.served,
            plan.known,
            zip(merging, zip(merging, ends, strict=True), plan.composed.values(), strict=True),
            cells,
            options,
        )
        points = {**plan.known, **merged}
        from_batch = map(points.__getitem__, chain(plan.batch, plan.mixed))
        rendered = list(chain.from_iterable(map(dict.values, from_batch)))
        rendered.extend(self._key_speed_points(name, plan, by_start, options))
        return Answer(
            {(): rendered},
            plan.served.watermark,
            status,
            batch_status(plan.served),
            plan.served.stamp,
            batch_cells=len(plan.batch) - len(plan.composed) + len(plan.mixed) + len(stored),
            speed_states=sum(map(len, by_start.values())),
        )

    async def sliced_series(
        self,
        db: AsyncDb,
        metric: MetricPlan,
        windows: Sequence[Window],
        selection: Selection,
        options: RenderOptions,
    ) -> Answer[SeriesRows]:
        """The points of each group of `selection` (one group, `()`, without `group_by`) over
        the given windows (`[start, end)`, any multiple of the base cell, overlapping when
        hopping): every key passing the filters is read and merged into its group, window by
        window, by rule 8's split at W. Raises TooManyCells past `serving.max_cells` cells.
        After a publication, identical requests wait for the first to read the batch-only
        windows (`ReadsInFlight`), then plan again and find them cached."""
        name = ("sliced", metric.name, selection, options)
        max_cells = self.settings.serving.max_cells
        reading = ReadClaim(self.reads, name)

        def plan_for(served: ServedRow) -> SlicedPlan:
            plan = SlicedPlan.of(
                metric, windows, selection, served, self._known(name, served), max_cells
            )
            if plan.misses_batch_points and not reading.claim():
                return plan.deferring()
            return self.cells.with_cached(name, plan)

        try:
            while True:
                await self.reads.wait(name)
                plan, stored = await self.batch.guarded(db, metric, plan_for)
                if not plan.deferred:
                    break
            stored = self.cells.keep(name, plan, stored)
            speed = await self._read_speed(metric, plan.speed_read)
            _check_cells(len(stored) + speed.states, max_cells)
            cells = GroupedCells(stored, speed, selection, bool(metric.kinds))
            uncached = ((w, w, how) for w, how in plan.windows.items() if w not in plan.known)
            merged = await self._merge_windows(
                name, metric, plan.served, plan.known, uncached, cells, options
            )
        finally:
            reading.release()
        groups: SeriesRows = {}
        for window in plan.windows:
            points = plan.known[window] if window in plan.known else merged[window]
            for group, point in points.items():
                groups.setdefault(group, []).append(point)
        return Answer(
            groups,
            plan.served.watermark,
            speed.status,
            batch_status(plan.served),
            plan.served.stamp,
            batch_cells=len(stored),
            speed_states=speed.states,
        )

    async def top(
        self,
        db: AsyncDb,
        metric: MetricPlan,
        window_ms: int,
        start: int,
        ranking: Ranking,
        selection: Selection,
    ) -> Answer[RankedGroups]:
        """Every group's ranked value over one window (the groups of `selection.group_by`,
        after its filters), best first, ties by group ascending. Raises TooManyCells past
        `serving.max_cells` cells."""
        name = (metric.name, window_ms, start, ranking.by, selection)
        max_cells = self.settings.serving.max_cells
        plan, stored = await self.batch.guarded(
            db,
            metric,
            lambda served: self.cells.with_cached(
                name,
                TopPlan.of(
                    metric,
                    ranking,
                    selection,
                    start,
                    window_ms,
                    served,
                    self.tops.get(name, served.stamp),
                    max_cells,
                ),
            ),
        )
        stored = self.cells.keep(name, plan, stored)
        if not plan.served.reachable and plan.window.batch_cells:
            raise BatchViewUnreachable()  # rule 12: a window before W needs the batch view
        speed = await self._read_speed(metric, plan.speed_read)
        watermark = plan.served.watermark
        if plan.known is not None:
            ranked, batch_cells = plan.known
            return Answer(
                ranked, watermark, speed.status, stamp=plan.served.stamp, batch_cells=batch_cells
            )
        _check_cells(len(stored) + speed.states, max_cells)
        cells = GroupedCells(stored, speed, selection, ranking.slot >= 0)
        parts = await compose(WindowPlan(plan.window.batch_cells, ()), cells)
        speed_states = _ranked_speed_states(
            speed, plan.window.speed_cells, selection, ranking, parts
        )
        ranked = []
        for group, states in parts.items():
            value = ranking.value(states)
            if value is not None:
                ranked.append((group, value))
        ranked.sort(key=lambda item: (-item[1], item[0]))
        if not plan.window.speed_cells and plan.served.stamp is not None and watermark is not None:
            self.tops.put(name, plan.served.stamp, (ranked, len(stored)), len(ranked) + 1)
        return Answer(
            ranked,
            watermark,
            speed.status,
            batch_status(plan.served),
            plan.served.stamp,
            batch_cells=len(stored),
            speed_states=speed_states,
        )

    async def keys(
        self,
        db: AsyncDb,
        metric: MetricPlan,
        start: int,
        end: int,
        prefix: str | None,
        selection: Selection,
    ) -> Answer[list[Group]]:
        """Keys passing the filters with a cell in `[start, end)`: batch cells before W, speed
        sub-cells after. One statement reads W and the keys together, so nothing is planned
        against a hinted W; its answer is kept for the served row's stamp."""
        served, stored = await self.batch_parts.read(
            db,
            metric,
            ("keys", metric.name, start, end, prefix, selection),
            partial(self.batch.keys, db, metric, start, end, prefix, selection),
            lambda keys: sum(64 + sum(len(part) + 50 for part in key) for key in keys),
        )
        watermark, found = served.watermark, set(stored)
        speed_starts = keys_speed_starts(metric, start, end, watermark)
        status, fields = await self.speed.read_fields(metric, speed_starts)
        for encoded in fields:
            key = decode_key(encoded)
            if (prefix is None or not key or key[0].startswith(prefix)) and selection.matches(key):
                found.add(key)
        return Answer(sorted(found), watermark, status)

    def _key_speed_points(
        self,
        name: Hashable,
        plan: KeySeriesPlan,
        by_start: Mapping[int, list[bytes]],
        options: RenderOptions,
    ) -> Iterator[Point]:
        """One key's speed-only windows (`plan.speed`, every cell after W), each found by its
        states (the answer's `name` holds the key) or merged and kept by them. The hottest
        loop of the serving layer (a dashboard's last hour): no per-window plan or grouping."""
        metric = plan.metric
        windows, window_ms = metric.windows, plan.window_ms
        sketched = bool(metric.kinds)
        cache = self.speed_points
        for start in plan.speed:
            if window_ms == windows.base_ms:
                states = by_start.get(start, ())
            else:
                cells = windows.cell_starts(start, start + window_ms)
                states = [state for cell in cells for state in by_start.get(cell, ())]
            if not states:
                continue
            content = (name, start, *states)
            point: Point | bool | None = cache.get(content)
            if point is None:
                parts = [decode_state(state, sketched) for state in states]
                values = render_merge(metric, parts, options)
                window = (start, start + window_ms)
                merged = None if values is None else Point.of(window, "speed", values)
                point = False if merged is None else merged  # False: merged, no point
                weight = 0 if merged is None else merged.weight
                cache.put(content, point, weight + sum(map(len, states)))
            if isinstance(point, Point):
                yield point

    def _known(self, name: Hashable, served: ServedRow) -> Mapping[Any, WindowPoints]:
        """The batch-only points cached for answer `name` under the served row's stamp, by
        the shape's window key."""
        known: Mapping[Any, WindowPoints] | None = self.points.get(name, served.stamp)
        return known or {}

    async def _read_speed(self, metric: MetricPlan, read: SpeedRead) -> SpeedCells:
        """The sub-cells of the plan's base cells in one round trip: one key's when the read
        names it, else every key's (the status alone when it reads no cell)."""
        if not read.starts:
            return SpeedCells(await self.speed.status(), {})
        if read.key is None:
            return SpeedCells(*await self.speed.read_all_by_start(metric, read.starts))
        encoded = encode_key(read.key)
        status, by_start = await self.speed.read_key(metric, read.starts, encoded)
        cells = {start: {encoded: states} for start, states in by_start.items() if states}
        return SpeedCells(status, cells)

    async def _merge_windows(
        self,
        name: Hashable,
        metric: MetricPlan,
        served: ServedRow,
        known: Mapping[WindowKey, WindowPoints],
        windows: Iterable[tuple[WindowKey, Window, WindowPlan]],
        cells: GroupedCells,
        options: RenderOptions,
    ) -> dict[WindowKey, WindowPoints]:
        """Each given window's points (by the shape's key of the window), merged from `cells`
        by its plan: a batch-only one rendered and kept with the `known` ones for the served
        stamp, one reaching past W found by its content or rendered and kept by it."""
        merged: dict[WindowKey, WindowPoints] = {}
        fresh: dict[WindowKey, WindowPoints] = {}
        watermark = served.watermark
        turns = cells.turns
        speed: SpeedCells = cells.speed_cells
        edge = -1 if watermark is None else watermark  # batch-only: ending at or before W
        for window_key, window, plan in windows:
            if window[1] <= edge:
                await turns.turn()
                points, _ = await render_window(metric, window, plan, cells, watermark, options)
                merged[window_key] = fresh[window_key] = points
                continue
            chunks: list[bytes] = speed.chunks(plan.speed_cells)
            if not chunks and not plan.batch_cells:  # nothing in it: no point
                merged[window_key] = {}
                continue
            stamp = served.stamp if plan.batch_cells else None
            content = (name, window, stamp, *chunks)
            found: WindowPoints | None = self.speed_points.get(content)
            if found is None:
                await turns.turn()
                found, size = await render_window(metric, window, plan, cells, watermark, options)
                self.speed_points.put(content, found, size + sum(map(len, chunks)))
            merged[window_key] = found
        if fresh and served.stamp is not None:
            entry = {**known, **fresh}
            weight = sum(max(1, len(points)) for points in entry.values())
            self.points.put(name, served.stamp, entry, weight)
        return merged


class ReadClaim:
    """One request's claim to lead the read of answer `name`'s batch-only windows
    (`ReadsInFlight`): claimed at most once, released when the request ends."""

    def __init__(self, reads: ReadsInFlight, name: Hashable) -> None:
        self._reads = reads
        self._name = name
        self._leading = False

    def claim(self) -> bool:
        """True when this request reads (it leads); False when another one does."""
        self._leading = self._leading or self._reads.lead(self._name)
        return self._leading

    def release(self) -> None:
        if self._leading:
            self._reads.done(self._name)
            self._leading = False


class LoopTurns:
    """Gives the event loop a turn once per `slice_s` of a long merge (a day's total over 10k
    keys is ~1.3 s of CPU): meanwhile deadlines (`serving.request_timeout_s`) fire and other
    requests' reads go on, and a merge past its deadline is cancelled at its next turn
    instead of holding the loop, and every other answer, until it ends."""

    def __init__(self, slice_s: float = 0.02) -> None:
        self.slice_s = slice_s
        self.due = time.perf_counter() + slice_s

    async def turn(self) -> None:
        if time.perf_counter() >= self.due:
            await asyncio.sleep(0)
            self.due = time.perf_counter() + self.slice_s


_CELL_REF = attrgetter("window_ms", "start_ms")
"""A stored cell's (window, start), as a plain tuple (equal to its `CellRef`)."""


class GroupedCells:
    """The cells a read fetched, decoded into their groups only when a window that is not
    cached needs them (then once per cell); the merge gives the loop a turn every 1,024
    stored cells decoded (`turns`)."""

    def __init__(
        self,
        stored: Iterable[StoredCell],
        speed_cells: SpeedCells,
        selection: Selection,
        sketched: bool,
    ) -> None:
        self.speed_cells = speed_cells
        self.turns = LoopTurns()
        self._stored: dict[tuple[int, int], list[StoredCell]] = {}
        for ref, run in groupby(stored, _CELL_REF):  # a statement returns a cell's rows together
            self._stored.setdefault(ref, []).extend(run)
        self._selection = selection
        self._sketched = sketched
        self._batch: dict[CellRef, dict[Group, list[CellState]]] = {}
        self._speed: dict[int, dict[Group, list[CellState]]] = {}

    async def batch(self, ref: CellRef) -> Mapping[Group, list[CellState]]:
        """A stored cell's states by group (PostgreSQL applied the filters)."""
        groups = self._batch.get(ref)
        if groups is None:
            groups = self._batch[ref] = {}
            cells = self._stored.get(ref, [])
            grouped = bool(self._selection.group_by)
            group_of = self._selection.group_of
            for at in range(0, len(cells), 1024):
                await self.turns.turn()
                if not grouped:  # one group: no key to look at
                    groups.setdefault((), []).extend([c.state() for c in cells[at : at + 1024]])
                    continue
                for cell in cells[at : at + 1024]:
                    groups.setdefault(group_of(cell.key or ()), []).append(cell.state())
        return groups

    def speed(self, cell_start: int) -> Mapping[Group, list[CellState]]:
        """A base cell's speed sub-cell states by group, after the filters."""
        groups = self._speed.get(cell_start)
        if groups is None:
            groups = self._speed[cell_start] = {}
            selection = self._selection
            for encoded, blobs in self.speed_cells.by_start.get(cell_start, {}).items():
                key = decode_key(encoded)
                if selection.matches(key):
                    groups.setdefault(selection.group_of(key), []).extend(
                        decode_state(blob, self._sketched) for blob in blobs
                    )
        return groups


async def compose(plan: WindowPlan, cells: GroupedCells) -> dict[Group, list[CellState]]:
    """One window's states per group by its plan (rule 8): its batch cells, then its speed
    base cells."""
    parts: dict[Group, list[CellState]] = {}
    for ref in plan.batch_cells:
        for group, states in (await cells.batch(ref)).items():
            parts.setdefault(group, []).extend(states)
    for cell_start in plan.speed_cells:
        for group, states in cells.speed(cell_start).items():
            parts.setdefault(group, []).extend(states)
    return parts


async def render_window(
    metric: MetricPlan,
    window: Window,
    plan: WindowPlan,
    cells: GroupedCells,
    watermark: int | None,
    options: RenderOptions,
) -> tuple[WindowPoints, int]:
    """One window's point per group, its `source` by its position against W (a group with
    nothing in it has no point), and the bytes they hold."""
    source = point_source(*window, watermark)
    points: WindowPoints = {}
    size = 0
    for group, states in (await compose(plan, cells)).items():
        values = render_merge(metric, states, options)
        if values is not None:
            point = points[group] = Point.of(window, source, values)
            size += point.weight
    return points, size


def _ranked_speed_states(
    speed: SpeedCells,
    starts: Sequence[int],
    selection: Selection,
    ranking: Ranking,
    parts: dict[Group, list[CellState]],
) -> int:
    """Adds to `parts` each group's speed states of the given base cells, key by key, each
    carrying only the ranked aggregation's sketch slot; returns how many it added."""
    by_key: dict[bytes, list[bytes]] = {}
    for start in starts:
        for encoded, states in speed.by_start.get(start, {}).items():
            by_key.setdefault(encoded, []).extend(states)
    added = 0
    for encoded, states in by_key.items():
        key = decode_key(encoded)
        if not selection.matches(key):
            continue
        group = parts.setdefault(selection.group_of(key), [])
        for state in states:
            cell = decode_state(state, ranking.slot >= 0)
            if cell.sketches is not None:
                cell.sketches = [cell.sketches[ranking.slot]]
            group.append(cell)
            added += 1
    return added


def batch_status(served: ServedRow) -> str:
    """What an answer says of the batch view: "ok", or "unavailable" when PostgreSQL did not
    answer and only windows from the W last read were merged (rule 12)."""
    return "ok" if served.reachable else "unavailable"


def _check_cells(cells: int, limit: int) -> None:
    if cells > limit:
        raise TooManyCells(limit)
