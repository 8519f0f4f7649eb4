"""Rule 8 at query time: W and the batch cells from PostgreSQL in one statement
(`batch_view`), the speed sub-cells after W from Redis in one round trip (`shared.speed_view`),
each window composed from them and rendered by the aggregation registry, with the caches of
`caches` in front."""

from __future__ import annotations

import asyncio
import hashlib
import time
from collections.abc import Hashable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import orjson

from serving_layer.batch_view import SERIES_SQL, SLICE_SQL, TOP_SQL, BatchViewReader
from serving_layer.caches import ReadsInFlight, SpeedPointCache, StampedCache
from serving_layer.errors import TooManyCells
from serving_layer.pools import AsyncDb
from serving_layer.selection import Selection
from serving_layer.timefmt import format_time
from shared.aggregations import (
    CellState,
    Ranking,
    RenderOptions,
    decode_state,
    merge_states,
)
from shared.config import Settings
from shared.db.cells import state_of_columns
from shared.metric_plan import MetricPlan
from shared.speed_view import AsyncRedis, SpeedViewReader, decode_key, encode_key
from shared.windows import CellRef, WindowPlan, plan_window, point_source


def render_merge(
    metric: MetricPlan, parts: Sequence[CellState], options: RenderOptions
) -> dict[str, Any] | None:
    """The outputs of the merge of `parts` (a single stored cell renders from its summaries
    where its aggregations allow)."""
    return metric.aggregations.render(merge_states(metric.kinds, parts), options)


SlicedPoints = dict[tuple[int, int], dict[tuple[str, ...], orjson.Fragment]]
"""Each window's (`[start, end)`) rendered point per group."""


@dataclass
class SlicedResult:
    watermark: int | None
    speed_status: str
    batch_cells: int
    speed_states: int
    groups: dict[tuple[str, ...], list[RenderedPoint]] = field(default_factory=dict)
    """Each group's points, ascending by start."""


@dataclass
class ReadResult:
    watermark: int | None
    speed_status: str
    points: list[RenderedPoint] = field(default_factory=list)
    batch_cells: int = 0
    speed_states: int = 0


Point = dict[str, Any]
"""One answer point as the API renders it: start, end, source and the aggregations."""

RenderedPoint = Point | orjson.Fragment
"""A point, or one already serialized (cached batch points: orjson copies their bytes)."""


class MergedView:
    """The merged batch + speed view of every configured metric (one per app)."""

    def __init__(self, settings: Settings, client: AsyncRedis) -> None:
        self.settings = settings
        self.speed = SpeedViewReader(client)
        self.batch = BatchViewReader()
        self.points = StampedCache(settings.serving.cache_points)
        """Rendered points: of batch-only windows, valid for one served stamp (per series:
        start -> fragment or None); of a window reaching past W, valid for one stamp and the
        digest of the speed states it merges (`_content_stamp`)."""
        self.tops = StampedCache(settings.serving.cache_points)
        """Ranked keys of batch-only `top` windows per (metric, window, start, by)."""
        self.speed_points = SpeedPointCache(settings.serving.speed_cache_bytes)
        self.reads = ReadsInFlight()
        """Sliced reads of batch-only windows in progress, so identical cold requests wait."""

    async def series(
        self,
        db: AsyncDb,
        metric: MetricPlan,
        window_ms: int,
        starts: range,
        key: tuple[str, ...],
        options: RenderOptions,
    ) -> ReadResult:
        """The rendered points of the windows starting at `starts` (a range stepping by
        `window_ms`): batch-only windows from the point cache or PostgreSQL, the window
        straddling W (if any) and the speed windows merged from both stores."""
        base = metric.base_window_ms
        sketched = bool(metric.kinds)
        needs_sketches = metric.aggregations.needs_sketches
        cache_name = (metric.name, window_ms, key, options)
        split = [split_starts(starts, window_ms, None)]
        cached: list[dict[int, orjson.Fragment | None]] = [{}]
        missing: list[int] = []
        plans: dict[int, WindowPlan] = {}

        def params_for(stamp: str | None, watermark: int | None) -> dict[str, Any]:
            split[0] = split_starts(starts, window_ms, watermark)
            batch, mixed, _ = split[0]
            cached[0] = self.points.get(cache_name, stamp) or {}
            missing[:] = [s for s in batch if s not in cached[0]]
            plans.clear()
            refs: dict[CellRef, bool] = {}
            for start in [*missing, *mixed]:
                if window_ms == base and start in batch:
                    refs[CellRef(base, start)] = needs_sketches(1)
                    continue
                plan = plans[start] = plan_window(
                    start, window_ms, base, watermark, metric.windows_ms
                )
                need = needs_sketches(len(plan.batch_cells) + len(plan.speed_cells))
                for ref in plan.batch_cells:
                    refs[ref] = refs.get(ref, False) or need
            return {
                "sizes": [r.size_ms for r in refs],
                "starts": [r.start_ms for r in refs],
                "needs": list(refs.values()),
                "key": list(key),
            }

        served, stamp, rows = await self.batch.guarded(db, metric, SERIES_SQL, params_for)
        watermark = served.watermark
        if watermark is None:  # nothing served: every window comes from the speed view
            split[0] = split_starts(starts, window_ms, None)
            cached[0], missing[:] = {}, []
        batch, mixed, speed_windows = split[0]
        cells = {CellRef(row[3], row[4]): state_of_columns(*row[5:11]) for row in rows if row[3]}
        fresh: dict[int, orjson.Fragment | None] = {}
        for start in missing:
            plan = plans.get(start)
            refs = plan.batch_cells if plan is not None else (CellRef(base, start),)
            parts = [c for c in map(cells.get, refs) if c is not None]
            rendered = _render(render_merge(metric, parts, options), start, window_ms, "batch")
            fresh[start] = None if rendered is None else orjson.Fragment(orjson.dumps(rendered))
        if fresh and stamp is not None:
            entry = {**cached[0], **fresh}
            self.points.put(cache_name, stamp, entry, len(entry))

        speed_bases: list[int] = [s for start in mixed for s in plans[start].speed_cells]
        if speed_windows:
            speed_bases.extend(range(speed_windows[0], speed_windows[-1] + window_ms, base))
        if speed_bases:
            status, speed_raw = await self.speed.read_key(metric, speed_bases, encode_key(key))
        else:
            status, speed_raw = await self.speed.status(), {}
        result = ReadResult(watermark, status)
        result.batch_cells = len(batch) - len(missing) + len(cells)
        result.speed_states = sum(map(len, speed_raw.values()))
        points = result.points
        known = cached[0]
        for start in batch:
            stored = fresh[start] if start in fresh else known[start]
            if stored is not None:
                points.append(stored)
        for start in mixed:
            plan = plans[start]
            states = [s for c in plan.speed_cells for s in speed_raw.get(c, ())]
            content = _content_stamp(stamp, states)
            window_name = (*cache_name, start)
            made: list[orjson.Fragment] | None = None
            if content is not None:
                made = self.points.get(window_name, content)
            if made is None:
                parts = [c for c in map(cells.get, plan.batch_cells) if c is not None]
                parts.extend(decode_state(s, sketched) for s in states)
                data = _window_json(metric, start, window_ms, "mixed", parts, options)
                made = [orjson.Fragment(data)] if data else []
                if content is not None:
                    self.points.put(window_name, content, made, 1)
            points.extend(made)
        for start in speed_windows:
            states = [
                state
                for cell_start in range(start, start + window_ms, base)
                for state in speed_raw.get(cell_start, ())
            ]
            if states:
                merged = self.speed_points.point(
                    (metric.name, start, window_ms, options),
                    states,
                    partial(_speed_point, metric, start, window_ms, states, options),
                )
                if merged is not None:
                    points.append(merged)
        return result

    async def sliced_series(
        self,
        db: AsyncDb,
        metric: MetricPlan,
        windows: Sequence[tuple[int, int]],
        selection: Selection,
        options: RenderOptions,
    ) -> SlicedResult:
        """The points of each group of `selection` (one group, `()`, without `group_by`) over
        the given windows (`[start, end)`, any multiple of the base cell, overlapping when
        hopping): every key passing the filters is read and merged into its group, window by
        window, by rule 8's split at W. Raises TooManyCells past `serving.max_cells` cells."""
        base = metric.base_window_ms
        limit = self.settings.serving.max_cells
        condition, filters = selection.sql_condition("c.key")
        cache_name = _sliced_cache_name(metric, selection, options)
        plans: dict[tuple[int, int], WindowPlan] = {}
        cached: list[SlicedPoints] = [{}]

        def plan_all(watermark: int | None) -> None:
            plans.clear()
            for start, end in windows:
                plans[(start, end)] = plan_window(
                    start, end - start, base, watermark, metric.windows_ms
                )

        leading = deferred = False

        def params_for(stamp: str | None, watermark: int | None) -> dict[str, Any]:
            nonlocal leading, deferred
            plan_all(watermark)
            cached[0] = self.points.get(cache_name, stamp) or {}
            if not leading and any(
                watermark is not None and end <= watermark and (start, end) not in cached[0]
                for start, end in windows
            ):
                leading = self.reads.lead(cache_name)
                deferred = not leading  # another request reads them: only the served row
            refs = (
                ()
                if deferred
                else sorted(
                    {
                        r
                        for window, plan in plans.items()
                        if window not in cached[0]
                        for r in plan.batch_cells
                    }
                )
            )
            return {
                **filters,
                "sizes": [r.size_ms for r in refs],
                "starts": [r.start_ms for r in refs],
                "limit": limit + 1,
            }

        query = SLICE_SQL.format(filters=condition)
        try:
            while True:
                await self.reads.wait(cache_name)
                deferred = False
                served, stamp, rows = await self.batch.guarded(db, metric, query, params_for)
                if not deferred:
                    break
            _check_cells(len(rows), limit)
            watermark = served.watermark
            if watermark is None:
                plan_all(None)
                cached[0] = {}
            return await self._merge_sliced(
                metric, selection, options, plans, cached[0], stamp, watermark, rows
            )
        finally:
            if leading:
                self.reads.done(cache_name)

    async def _merge_sliced(
        self,
        metric: MetricPlan,
        selection: Selection,
        options: RenderOptions,
        plans: dict[tuple[int, int], WindowPlan],
        known: SlicedPoints,
        stamp: str | None,
        watermark: int | None,
        rows: list[tuple[Any, ...]],
    ) -> SlicedResult:
        """`sliced_series`'s points from the batch `rows` it read, the speed cells after W and
        the windows already `known` (cached under `stamp`); caches the windows it merged."""
        limit = self.settings.serving.max_cells
        cache_name = _sliced_cache_name(metric, selection, options)
        rows_at: dict[CellRef, list[tuple[Any, ...]]] = {}
        for row in rows:
            if row[3] is not None:
                rows_at.setdefault(CellRef(row[3], row[4]), []).append(row)
        speed_starts = sorted({s for plan in plans.values() for s in plan.speed_cells})
        status, raw = await self.speed.read_all_by_start(metric, speed_starts)
        speed_states = sum(len(blobs) for cell in raw.values() for blobs in cell.values())
        _check_cells(len(rows) + speed_states, limit)
        cells = _SlicedCells(rows_at, raw, selection, bool(metric.kinds))
        result = SlicedResult(watermark, status, len(rows), speed_states)
        fresh: SlicedPoints = {}
        turns = LoopTurns()
        for window, plan in plans.items():
            await turns.turn()
            batch_only = watermark is not None and window[1] <= watermark
            points = known.get(window)
            content = None
            if points is None and not batch_only:
                speed_cells = [raw.get(c, {}) for c in plan.speed_cells]
                content = _content_stamp(stamp, _keyed_states(speed_cells))
                if content is not None:
                    points = self.points.get((*cache_name, window), content)
            if points is None:
                points = _sliced_window(metric, window, plan, cells, watermark, options)
                if batch_only:
                    fresh[window] = points
                elif content is not None:
                    self.points.put((*cache_name, window), content, points, len(points) + 1)
            for group, point in points.items():
                result.groups.setdefault(group, []).append(point)
        if fresh and stamp is not None:
            entry = {**known, **fresh}
            self.points.put(cache_name, stamp, entry, sum(map(len, entry.values())) + len(entry))
        return result

    async def top(
        self,
        db: AsyncDb,
        metric: MetricPlan,
        window_ms: int,
        start: int,
        ranking: Ranking,
        selection: Selection,
    ) -> tuple[ReadResult, list[tuple[tuple[str, ...], Any]]]:
        """Every group's ranked value over one window (the groups of `selection.group_by`,
        after its filters), best first, ties by group ascending. Raises TooManyCells past
        `serving.max_cells` cells."""
        base = metric.base_window_ms
        sketch_index = ranking.slot + 1
        merges_keys = selection.group_by != metric.key
        limit = self.settings.serving.max_cells
        condition, filters = selection.sql_condition("c.key")
        plan_box: list[WindowPlan] = []
        name = (metric.name, window_ms, start, ranking.by, selection)
        cached: list[Any] = [None]

        def params_for(stamp: str | None, watermark: int | None) -> dict[str, Any]:
            plan_box[:] = [plan_window(start, window_ms, base, watermark, metric.windows_ms)]
            plan = plan_box[0]
            cached[0] = None if plan.speed_cells else self.tops.get(name, stamp)
            refs = () if cached[0] is not None else plan.batch_cells
            parts = len(refs) + len(plan.speed_cells)
            return {
                **filters,
                "sizes": [r.size_ms for r in refs],
                "starts": [r.start_ms for r in refs],
                "sketch": sketch_index,
                # one stored cell per group and no speed cells: its summary may be the answer
                "union": ranking.needs_sketch(parts) or (merges_keys and sketch_index > 0),
                "limit": limit + 1,
            }

        query = TOP_SQL.format(filters=condition)
        served, stamp, rows = await self.batch.guarded(db, metric, query, params_for)
        _check_cells(len(rows), limit)
        watermark = served.watermark
        if watermark is not None and cached[0] is not None:
            ranked, batch_cells = cached[0]
            return ReadResult(watermark, await self.speed.status(), batch_cells=batch_cells), ranked
        plan = (
            plan_window(start, window_ms, base, None, metric.windows_ms)
            if watermark is None
            else plan_box[0]
        )
        parts: dict[tuple[str, ...], list[CellState]] = {}
        batch_cells = 0
        turns = LoopTurns()
        for row in rows:
            if row[3] is None:
                continue
            if not batch_cells % 1024:
                await turns.turn()
            batch_cells += 1
            sketch, summary = row[8], row[9]
            parts.setdefault(selection.group_of(row[3]), []).append(
                state_of_columns(
                    row[4],
                    row[5],
                    row[6],
                    row[7],
                    None if sketch is None else [sketch],
                    None if summary is None else [summary],
                )
            )
        status, speed_raw = await self.speed.read_all(metric, list(plan.speed_cells))
        speed_states = 0
        _check_cells(batch_cells + sum(map(len, speed_raw.values())), limit)
        for encoded, states in speed_raw.items():
            key = decode_key(encoded)
            if not selection.matches(key):
                continue
            cells = parts.setdefault(selection.group_of(key), [])
            for state in states:
                cell = decode_state(state, sketch_index > 0)
                if cell.sketches is not None:
                    cell.sketches = [cell.sketches[sketch_index - 1]]
                cells.append(cell)
                speed_states += 1
        ranked = []
        for key, cells in parts.items():
            value = ranking.value(cells)
            if value is not None:
                ranked.append((key, value))
        ranked.sort(key=lambda item: (-item[1], item[0]))
        if not plan.speed_cells and stamp is not None and watermark is not None:
            self.tops.put(name, stamp, (ranked, batch_cells), len(ranked) + 1)
        result = ReadResult(watermark, status, batch_cells=batch_cells, speed_states=speed_states)
        return result, ranked

    async def keys(
        self,
        db: AsyncDb,
        metric: MetricPlan,
        start: int,
        end: int,
        prefix: str | None,
        selection: Selection,
    ) -> tuple[ReadResult, list[tuple[str, ...]]]:
        """Keys passing the filters with a cell in `[start, end)`: batch cells before W, speed
        sub-cells after."""
        base = metric.base_window_ms
        watermark, found = await self.batch.keys(db, metric, start, end, prefix, selection)
        first_speed = start if watermark is None else max(start, watermark)
        speed_starts = [s for s in range(_ceil(first_speed, base), end, base)]
        status, fields = await self.speed.read_fields(metric, speed_starts)
        for encoded in fields:
            key = decode_key(encoded)
            if (prefix is None or not key or key[0].startswith(prefix)) and selection.matches(key):
                found.add(key)
        return ReadResult(watermark, status), sorted(found)


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


def _check_cells(cells: int, limit: int) -> None:
    if cells > limit:
        raise TooManyCells(limit)


def _ceil(value: int, size: int) -> int:
    return -(-value // size) * size


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


def _speed_point(
    metric: MetricPlan, start: int, window_ms: int, states: list[bytes], options: RenderOptions
) -> bytes:
    """The JSON of a speed-only window merged from its sub-cell states (empty: no events)."""
    parts = [decode_state(state, bool(metric.kinds)) for state in states]
    return _window_json(metric, start, window_ms, "speed", parts, options)


def _window_json(
    metric: MetricPlan,
    start: int,
    window_ms: int,
    source: str,
    parts: Sequence[CellState],
    options: RenderOptions,
) -> bytes:
    """The JSON of one window merged from `parts` (empty: no events)."""
    rendered = _render(render_merge(metric, parts, options), start, window_ms, source)
    return b"" if rendered is None else orjson.dumps(rendered)


def _sliced_cache_name(
    metric: MetricPlan, selection: Selection, options: RenderOptions
) -> tuple[Hashable, ...]:
    """Under which name a sliced answer's windows are cached."""
    return ("sliced", metric.name, selection, options)


def _content_stamp(stamp: str | None, chunks: Iterable[bytes]) -> str | None:
    """What a window reaching past W was merged from: the served row's stamp (its batch
    cells) and a digest of the speed-side bytes, each length-prefixed so that no two
    different sequences feed the same bytes. None when nothing is served (no stamp)."""
    if stamp is None:
        return None
    digest = hashlib.blake2b(digest_size=16)
    for chunk in chunks:
        digest.update(len(chunk).to_bytes(4, "little"))
        digest.update(chunk)
    return f"{stamp}:{digest.hexdigest()}"


def _keyed_states(cells: Iterable[Mapping[bytes, Sequence[bytes]]]) -> Iterator[bytes]:
    """Every key's sub-cell states of the given speed cells as one sequence of chunks: the
    key, its number of states, then the states (so the grouping is part of the content)."""
    for cell in cells:
        for encoded, states in cell.items():
            yield encoded
            yield len(states).to_bytes(4, "little")
            yield from states


def _render(values: dict[str, Any] | None, start: int, window_ms: int, source: str) -> Point | None:
    if values is None:
        return None
    point: Point = {
        "start": format_time(start),
        "end": format_time(start + window_ms),
        "source": source,
    }
    point.update(values)
    return point


class _SlicedCells:
    """The cells a sliced read fetched, decoded into their groups only when a window that
    is not cached needs them (then once per cell)."""

    def __init__(
        self,
        rows_at: Mapping[CellRef, list[tuple[Any, ...]]],
        raw: Mapping[int, Mapping[bytes, list[bytes]]],
        selection: Selection,
        sketched: bool,
    ) -> None:
        self._rows_at = rows_at
        self._raw = raw
        self._selection = selection
        self._sketched = sketched
        self._batch: dict[CellRef, dict[tuple[str, ...], list[CellState]]] = {}
        self._speed: dict[int, dict[tuple[str, ...], list[CellState]]] = {}

    def batch(self, ref: CellRef) -> Mapping[tuple[str, ...], list[CellState]]:
        """A stored cell's states by group (PostgreSQL applied the filters)."""
        groups = self._batch.get(ref)
        if groups is None:
            groups = self._batch[ref] = {}
            group_of = self._selection.group_of
            for row in self._rows_at.get(ref, ()):
                groups.setdefault(group_of(row[5]), []).append(state_of_columns(*row[6:12]))
        return groups

    def speed(self, cell_start: int) -> Mapping[tuple[str, ...], list[CellState]]:
        """A base cell's speed sub-cell states by group, after the filters."""
        groups = self._speed.get(cell_start)
        if groups is None:
            groups = self._speed[cell_start] = {}
            selection = self._selection
            for encoded, blobs in self._raw.get(cell_start, {}).items():
                key = decode_key(encoded)
                if selection.matches(key):
                    groups.setdefault(selection.group_of(key), []).extend(
                        decode_state(blob, self._sketched) for blob in blobs
                    )
        return groups


def _sliced_window(
    metric: MetricPlan,
    window: tuple[int, int],
    plan: WindowPlan,
    cells: _SlicedCells,
    watermark: int | None,
    options: RenderOptions,
) -> dict[tuple[str, ...], orjson.Fragment]:
    """One window's point per group: the group's batch cells and speed sub-cells of the
    window's plan (rule 8) merged and rendered (a group with nothing in it has no point)."""
    start, end = window
    parts: dict[tuple[str, ...], list[CellState]] = {}
    for ref in plan.batch_cells:
        for group, states in cells.batch(ref).items():
            parts.setdefault(group, []).extend(states)
    for cell_start in plan.speed_cells:
        for group, states in cells.speed(cell_start).items():
            parts.setdefault(group, []).extend(states)
    source = point_source(start, end, watermark)
    points = {}
    for group, states in parts.items():
        point = _render(render_merge(metric, states, options), start, end - start, source)
        if point is not None:
            points[group] = orjson.Fragment(orjson.dumps(point))
    return points
