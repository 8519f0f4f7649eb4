"""Rule 8 at query time: read W and the batch cells in one statement (one snapshot), the speed
sub-cells after W from Redis in one round trip, and compose each window from them.

The batch read is planned against the W last seen for the metric and guarded by it: the same
statement returns the served row, and cells are only joined when the row still holds that
generation and W. When a run has flipped meanwhile, the plan is redone with the new row — one
round trip in the common case, and never a plan from one W with cells from another."""

from __future__ import annotations

import math
import struct
import threading
import time
from collections import OrderedDict
from collections.abc import Hashable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import datasketches as ds
import orjson
import redis
import redis.asyncio as aioredis

from serving_layer.errors import unavailable
from serving_layer.pools import AsyncDb
from serving_layer.timefmt import format_time
from shared.aggregates import union_sketches
from shared.config import Settings
from shared.metric_plan import MetricPlan
from shared.speed_store import (
    EPOCH_KEY,
    REBUILDING_KEY,
    cell_key,
    cell_key_prefix,
    decode_key,
    encode_key,
)
from shared.windows import CellRef, WindowPlan, plan_window

_HEADER = struct.Struct("<qdddH")
_LENGTH = struct.Struct("<I")
_INF, _NINF = math.inf, -math.inf
_GUARD_RETRIES = 4

# One call: the epoch marker, the rebuilding set and one key's field in every sub-cell. The
# sub-cell names are built here from their prefix (ARGV[1]), the partition count (ARGV[3]) and
# the base cell starts (ARGV[4..]): packing ~60 arguments instead of ~240 names is most of
# what the call costs the client.
_READ_LUA = """
local out = {redis.call('EXISTS', KEYS[1]), redis.call('SCARD', KEYS[2])}
local prefix, field, partitions = ARGV[1], ARGV[2], tonumber(ARGV[3])
for i = 4, #ARGV do
  local cell = prefix .. ARGV[i] .. ':'
  for p = 0, partitions - 1 do out[#out + 1] = redis.call('HGET', cell .. p, field) end
end
return out
"""


@dataclass(slots=True)
class Cell:
    """Plain aggregate columns of one stored cell, sketches as bytes (parsed only to union)."""

    count: int
    total: float
    minimum: float
    maximum: float
    sketches: list[bytes] | None
    estimates: list[float] | None


def parse_state(data: bytes, with_sketches: bool) -> Cell:
    """An `AggState.to_bytes` blob, reading the sketch bytes only when a union needs them."""
    count, total, minimum, maximum, n_sketches = _HEADER.unpack_from(data)
    sketches: list[bytes] | None = None
    if with_sketches:
        sketches = []
        offset = _HEADER.size
        for _ in range(n_sketches):
            (length,) = _LENGTH.unpack_from(data, offset)
            offset += _LENGTH.size
            sketches.append(data[offset : offset + length])
            offset += length
    return Cell(count, total, minimum, maximum, sketches, None)


def merge_cells(metric: MetricPlan, parts: Sequence[Cell]) -> dict[str, Any] | None:
    """The configured outputs of the merge of `parts`; the stored estimate when only one."""
    parts = [p for p in parts if p.count]
    if not parts:
        return None
    count = sum(p.count for p in parts)
    total = math.fsum(p.total for p in parts) if len(parts) > 1 else parts[0].total
    minimum = min(p.minimum for p in parts)
    maximum = max(p.maximum for p in parts)
    values: dict[str, Any] = {
        "count": count,
        "sum": total,
        "min": minimum,
        "max": maximum,
        "avg": total / count,
    }
    for i, field_name in enumerate(metric.distinct_fields):
        values[f"distinct_{field_name}"] = round(_distinct(parts, i))
    return {name: values[name] for name in metric.output_names}


def _distinct(parts: Sequence[Cell], index: int) -> float:
    if len(parts) == 1 and parts[0].estimates is not None:
        return parts[0].estimates[index]
    sketches = []
    for part in parts:
        if part.sketches is None:
            raise AssertionError("a union needs every part's sketch")
        sketches.append(ds.hll_sketch.deserialize(part.sketches[index]))
    return float(union_sketches(sketches).get_estimate())


@dataclass
class Served:
    generation: int | None
    watermark: int | None
    """W of the metric, None when nothing of this metric's version is served."""


@dataclass
class ReadResult:
    watermark: int | None
    speed_status: str
    points: list[RenderedPoint] = field(default_factory=list)
    batch_cells: int = 0
    speed_states: int = 0


def speed_status_of(has_epoch: Any, rebuilding: Any) -> str:
    """ok, or rebuilding when Redis lost its data (no epoch marker) or a rebuild runs."""
    return "ok" if has_epoch and not rebuilding else "rebuilding"


def speed_status(client: redis.Redis) -> str:
    """The speed view's status read with a blocking client (for the operator routes)."""
    try:
        pipe = client.pipeline(transaction=False)
        pipe.exists(EPOCH_KEY)
        pipe.scard(REBUILDING_KEY)
        return speed_status_of(*pipe.execute())
    except redis.RedisError:
        return "unavailable"


class SpeedReader:
    """Reads from Redis (asyncio) with a short circuit breaker: once Redis failed, requests
    answer batch-only (`unavailable`) for `cooldown_s` instead of each waiting for a timeout."""

    def __init__(self, client: aioredis.Redis, cooldown_s: float = 2.0) -> None:
        self.client = client
        self._script = client.register_script(_READ_LUA)
        self._cooldown = cooldown_s
        self._down_until = 0.0

    def _available(self) -> bool:
        return time.monotonic() >= self._down_until

    def _failed(self) -> None:
        self._down_until = time.monotonic() + self._cooldown

    async def status(self) -> str:
        """ok, rebuilding (Redis lost its data or a rebuild runs), or unavailable."""
        if not self._available():
            return "unavailable"
        try:
            pipe = self.client.pipeline(transaction=False)
            pipe.exists(EPOCH_KEY)
            pipe.scard(REBUILDING_KEY)
            has_epoch, rebuilding = await pipe.execute()
        except redis.RedisError:
            self._failed()
            return "unavailable"
        return speed_status_of(has_epoch, rebuilding)

    async def read_key(
        self, metric: str, version: str, starts: Sequence[int], partitions: int, key: bytes
    ) -> tuple[str, dict[int, list[bytes]]]:
        """Status and one key's sub-cell states per base cell start, in one call."""
        if not self._available():
            return "unavailable", {}
        args: list[Any] = [cell_key_prefix(metric, version), key, partitions, *starts]
        try:
            reply = await self._script(keys=[EPOCH_KEY, REBUILDING_KEY], args=args)
        except redis.RedisError:
            self._failed()
            return "unavailable", {}
        states: dict[int, list[bytes]] = {}
        values = iter(reply[2:])
        for start in starts:
            found = [v for v in (next(values) for _ in range(partitions)) if v is not None]
            if found:
                states[start] = found
        return speed_status_of(reply[0], reply[1]), states

    async def _each_sub_cell(
        self, command: str, metric: str, version: str, starts: Sequence[int], partitions: int
    ) -> tuple[str, list[Any]]:
        """Status and the replies of `command` (a Redis hash command) on every sub-cell of
        the given base cells, pipelined in one round trip."""
        status = await self.status()
        if status == "unavailable" or not starts:
            return status, []
        pipe = self.client.pipeline(transaction=False)
        for start in starts:
            for partition in range(partitions):
                getattr(pipe, command)(cell_key(metric, version, start, partition))
        try:
            return status, await pipe.execute()
        except redis.RedisError:
            self._failed()
            return "unavailable", []

    async def read_all(
        self, metric: str, version: str, starts: Sequence[int], partitions: int
    ) -> tuple[str, dict[bytes, list[bytes]]]:
        """Status and every key's sub-cell states over the given base cells."""
        status, replies = await self._each_sub_cell("hgetall", metric, version, starts, partitions)
        by_key: dict[bytes, list[bytes]] = {}
        for reply in replies:
            for encoded, state in reply.items():
                by_key.setdefault(encoded, []).append(state)
        return status, by_key

    async def read_fields(
        self, metric: str, version: str, starts: Sequence[int], partitions: int
    ) -> tuple[str, set[bytes]]:
        """Status and the encoded keys present in the given base cells."""
        status, replies = await self._each_sub_cell("hkeys", metric, version, starts, partitions)
        return status, {name for reply in replies for name in reply}


class ServedHints:
    """The served row's stamp (its `xmin`) and W last seen per metric: what the next batch
    read is planned with. Every publication rewrites the row (rule 6), so a new stamp means
    the served cells may have changed."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._hints: dict[str, tuple[str | None, int | None, int | None]] = {}

    def get(self, metric: str) -> tuple[str | None, int | None, int | None]:
        """(stamp, generation, W)."""
        with self._lock:
            return self._hints.get(metric, (None, None, None))

    def set(
        self, metric: str, stamp: str | None, generation: int | None, watermark: int | None
    ) -> None:
        with self._lock:
            self._hints[metric] = (stamp, generation, watermark)


Point = dict[str, Any]
"""One answer point as the API renders it: start, end, source and the aggregations."""

RenderedPoint = Point | orjson.Fragment
"""A point, or one already serialized (cached batch points: orjson copies their bytes)."""


class StampedCache:
    """Batch-side answers valid for one stamp of the served row only: cells of the served
    generation change only in a transaction that also rewrites that row (rule 6), so an entry
    is never used once the row has changed — it cannot serve a stale answer. Least recently
    used entries go first once their total weight exceeds `max_weight`. Values are shared
    between answers and never mutated."""

    def __init__(self, max_weight: int) -> None:
        self._lock = threading.Lock()
        self._entries: OrderedDict[Hashable, tuple[str, Any, int]] = OrderedDict()
        self._weight = 0
        self._max = max_weight

    def get(self, name: Hashable, stamp: str | None) -> Any:
        """The value stored under `name` for `stamp`, or None."""
        with self._lock:
            entry = self._entries.get(name)
            if entry is None or entry[0] != stamp:
                return None
            self._entries.move_to_end(name)
            return entry[1]

    def put(self, name: Hashable, stamp: str, value: Any, weight: int) -> None:
        with self._lock:
            old = self._entries.pop(name, None)
            if old is not None:
                self._weight -= old[2]
            if weight > self._max:
                return
            self._entries[name] = (stamp, value, weight)
            self._weight += weight
            while self._weight > self._max:
                _, (_, _, evicted) = self._entries.popitem(last=False)
                self._weight -= evicted


class SpeedPointCache:
    """Rendered speed-side points by content: an entry's key holds the metric, the window and
    the exact state bytes of every sub-cell read for it in this request, so a changed sub-cell
    is a different key and an entry can never be stale. Between two polls of a live series
    only the windows that received events miss. Least recently used entries go first once
    the keys and points held exceed `max_bytes`."""

    def __init__(self, max_bytes: int) -> None:
        self._entries: OrderedDict[tuple[Any, ...], tuple[orjson.Fragment | None, int]] = (
            OrderedDict()
        )
        self._bytes = 0
        self._max = max_bytes

    def point(
        self,
        metric: MetricPlan,
        start: int,
        window_ms: int,
        source: str,
        states: list[bytes],
    ) -> orjson.Fragment | None:
        """The rendered merge of `states` (parsed only on a miss)."""
        content = (metric.name, start, window_ms, source, *states)
        entry = self._entries.get(content)
        if entry is not None:
            self._entries.move_to_end(content)
            return entry[0]
        parts = [parse_state(state, bool(metric.distinct_fields)) for state in states]
        rendered = _render(merge_cells(metric, parts), start, window_ms, source)
        data = b"" if rendered is None else orjson.dumps(rendered)
        point = orjson.Fragment(data) if data else None
        size = sum(map(len, states)) + len(data)
        self._entries[content] = (point, size)
        self._bytes += size
        while self._bytes > self._max:
            _, (_, evicted) = self._entries.popitem(last=False)
            self._bytes -= evicted
        return point


_SERVED_CTE = """
WITH s AS (
    SELECT generation, (watermarks ->> %(metric)s)::bigint AS w, versions ->> %(metric)s AS v,
           xmin::text AS x
    FROM served_view WHERE id = 1
)
"""

_SERVED_SQL = _SERVED_CTE + "SELECT s.generation, s.w, s.v, NULL, s.x FROM s"
"""The served row alone, shaped like a cell read that found nothing: when every cell a read
needs is cached, this is the whole statement."""

_SERIES_SQL = (
    _SERVED_CTE
    + """
SELECT s.generation, s.w, s.v, c.window_ms, c.start_ms, c.count, c.sum, c.min, c.max,
       CASE WHEN p.need THEN c.sketches END, c.distinct_estimates, s.x
FROM s
LEFT JOIN unnest(%(sizes)s::bigint[], %(starts)s::bigint[], %(needs)s::boolean[])
    AS p(window_ms, start_ms, need)
    ON s.x = %(x)s AND s.v = %(version)s
LEFT JOIN batch_cells c
    ON c.generation = %(generation)s AND c.metric = %(metric)s AND c.version = %(version)s
   AND c.window_ms = p.window_ms AND c.start_ms = p.start_ms AND c.key = %(key)s
"""
)

_TOP_SQL = (
    _SERVED_CTE
    + """
SELECT s.generation, s.w, s.v, c.key, c.count, c.sum, c.min, c.max,
       CASE WHEN %(sketch)s::int > 0 AND %(union)s THEN c.sketches[%(sketch)s] END,
       CASE WHEN %(sketch)s::int > 0 THEN c.distinct_estimates[%(sketch)s] END, s.x
FROM s
LEFT JOIN unnest(%(sizes)s::bigint[], %(starts)s::bigint[]) AS p(window_ms, start_ms)
    ON s.x = %(x)s AND s.v = %(version)s
LEFT JOIN batch_cells c
    ON c.generation = %(generation)s AND c.metric = %(metric)s AND c.version = %(version)s
   AND c.window_ms = p.window_ms AND c.start_ms = p.start_ms
"""
)

_KEYS_SQL = (
    _SERVED_CTE
    + """
SELECT s.generation, s.w, s.v, k.key
FROM s
LEFT JOIN LATERAL (
    SELECT DISTINCT c.key FROM batch_cells c
    WHERE c.generation = s.generation AND c.metric = %(metric)s AND c.version = %(version)s
      AND s.w IS NOT NULL AND c.window_ms = %(base)s AND c.start_ms >= %(start)s
      AND c.start_ms < LEAST(%(end)s, s.w - %(base)s + 1)
      AND (%(prefix)s::text IS NULL OR left(c.key[1], length(%(prefix)s::text)) = %(prefix)s)
) k ON s.v = %(version)s
"""
)


class MergedView:
    """The merged batch + speed view of every configured metric (one per app)."""

    def __init__(self, settings: Settings, client: aioredis.Redis) -> None:
        self.settings = settings
        self.speed = SpeedReader(client)
        self.hints = ServedHints()
        self.points = StampedCache(settings.serving.cache_points)
        """Rendered batch-only points per (metric, window, key): start -> fragment or None."""
        self.tops = StampedCache(settings.serving.cache_points)
        """Ranked keys of batch-only `top` windows per (metric, window, start, by)."""
        self.speed_points = SpeedPointCache(settings.serving.speed_cache_bytes)

    async def _guarded(
        self,
        db: AsyncDb,
        metric: MetricPlan,
        query: str,
        params_for: Any,
    ) -> tuple[Served, str | None, list[tuple[Any, ...]]]:
        """Run a cell read planned against the hinted row until the served row agrees with it.
        `params_for(stamp, W)` plans the read; the rows are those of its last call."""
        version = metric.version
        stamp, generation, watermark = self.hints.get(metric.name)
        for _ in range(_GUARD_RETRIES):
            params = params_for(stamp, watermark)
            params.update(metric=metric.name, version=version, x=stamp, generation=generation)
            statement = query if params["sizes"] else _SERVED_SQL
            async with db.connection() as conn:
                rows = await (await conn.execute(statement, params)).fetchall()
            if not rows:
                served, row_stamp = Served(None, None), None
            else:
                row_version = rows[0][2]
                served = Served(rows[0][0], rows[0][1] if row_version == version else None)
                row_stamp = rows[0][-1]
            self.hints.set(metric.name, row_stamp, served.generation, served.watermark)
            if served.watermark is None:
                return served, row_stamp, []
            if row_stamp == stamp:
                return served, row_stamp, rows
            stamp, generation, watermark = row_stamp, served.generation, served.watermark
        raise unavailable("the batch view changed during the read several times; retry")

    async def series(
        self,
        db: AsyncDb,
        metric: MetricPlan,
        window_ms: int,
        starts: range,
        key: tuple[str, ...],
    ) -> ReadResult:
        """The rendered points of the windows starting at `starts` (a range stepping by
        `window_ms`): batch-only windows from the point cache or PostgreSQL, the window
        straddling W (if any) and the speed windows merged from both stores."""
        base = metric.base_window_ms
        has_distinct = bool(metric.distinct_fields)
        split = [split_starts(starts, window_ms, None)]
        cached: list[dict[int, orjson.Fragment | None]] = [{}]
        missing: list[int] = []
        plans: dict[int, WindowPlan] = {}

        def params_for(stamp: str | None, watermark: int | None) -> dict[str, Any]:
            split[0] = split_starts(starts, window_ms, watermark)
            batch, mixed, _ = split[0]
            cached[0] = self.points.get((metric.name, window_ms, key), stamp) or {}
            missing[:] = [s for s in batch if s not in cached[0]]
            plans.clear()
            refs: dict[CellRef, bool] = {}
            for start in [*missing, *mixed]:
                if window_ms == base and start in batch:
                    refs[CellRef(base, start)] = False
                    continue
                plan = plans[start] = plan_window(
                    start, window_ms, base, watermark, metric.windows_ms
                )
                need = has_distinct and len(plan.batch_cells) + len(plan.speed_cells) > 1
                for ref in plan.batch_cells:
                    refs[ref] = refs.get(ref, False) or need
            return {
                "sizes": [r.size_ms for r in refs],
                "starts": [r.start_ms for r in refs],
                "needs": list(refs.values()),
                "key": list(key),
            }

        served, stamp, rows = await self._guarded(db, metric, _SERIES_SQL, params_for)
        watermark = served.watermark
        if watermark is None:  # nothing served: every window comes from the speed view
            split[0] = split_starts(starts, window_ms, None)
            cached[0], missing[:] = {}, []
        batch, mixed, speed_windows = split[0]
        cells = {CellRef(row[3], row[4]): _row_cell(row[5:11]) for row in rows if row[3]}
        fresh: dict[int, orjson.Fragment | None] = {}
        for start in missing:
            plan = plans.get(start)
            refs = plan.batch_cells if plan is not None else (CellRef(base, start),)
            values = merge_cells(metric, [c for c in map(cells.get, refs) if c is not None])
            rendered = _render(values, start, window_ms, "batch")
            fresh[start] = None if rendered is None else orjson.Fragment(orjson.dumps(rendered))
        if fresh and stamp is not None:
            entry = {**cached[0], **fresh}
            self.points.put((metric.name, window_ms, key), stamp, entry, len(entry))

        speed_bases: list[int] = [s for start in mixed for s in plans[start].speed_cells]
        if speed_windows:
            speed_bases.extend(range(speed_windows[0], speed_windows[-1] + window_ms, base))
        if speed_bases:
            status, speed_raw = await self.speed.read_key(
                metric.name,
                metric.version,
                speed_bases,
                metric.source.partitions,
                encode_key(key),
            )
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
            parts = [c for c in map(cells.get, plan.batch_cells) if c is not None]
            for cell_start in plan.speed_cells:
                parts.extend(parse_state(s, has_distinct) for s in speed_raw.get(cell_start, ()))
            point = _render(merge_cells(metric, parts), start, window_ms, "mixed")
            if point is not None:
                points.append(point)
        for start in speed_windows:
            states = [
                state
                for cell_start in range(start, start + window_ms, base)
                for state in speed_raw.get(cell_start, ())
            ]
            if states:
                merged = self.speed_points.point(metric, start, window_ms, "speed", states)
                if merged is not None:
                    points.append(merged)
        return result

    async def top(
        self,
        db: AsyncDb,
        metric: MetricPlan,
        window_ms: int,
        start: int,
        by: str,
    ) -> tuple[ReadResult, list[tuple[tuple[str, ...], Any]]]:
        """Every key's `by` over one window, best first, ties by key ascending."""
        base = metric.base_window_ms
        sketch_index = 0
        if by.startswith("distinct_"):
            sketch_index = metric.distinct_fields.index(by.removeprefix("distinct_")) + 1
        plan_box: list[WindowPlan] = []
        name = (metric.name, window_ms, start, by)
        cached: list[Any] = [None]

        def params_for(stamp: str | None, watermark: int | None) -> dict[str, Any]:
            plan_box[:] = [plan_window(start, window_ms, base, watermark, metric.windows_ms)]
            plan = plan_box[0]
            cached[0] = None if plan.speed_cells else self.tops.get(name, stamp)
            refs = () if cached[0] is not None else plan.batch_cells
            return {
                "sizes": [r.size_ms for r in refs],
                "starts": [r.start_ms for r in refs],
                "sketch": sketch_index,
                # one stored cell per key and no speed cells: its estimate is the answer
                "union": len(refs) + len(plan.speed_cells) > 1,
            }

        served, stamp, rows = await self._guarded(db, metric, _TOP_SQL, params_for)
        watermark = served.watermark
        if watermark is not None and cached[0] is not None:
            ranked, batch_cells = cached[0]
            return ReadResult(watermark, await self.speed.status(), batch_cells=batch_cells), ranked
        plan = (
            plan_window(start, window_ms, base, None, metric.windows_ms)
            if watermark is None
            else plan_box[0]
        )
        parts: dict[tuple[str, ...], list[Cell]] = {}
        batch_cells = 0
        for row in rows:
            if row[3] is None:
                continue
            batch_cells += 1
            parts.setdefault(tuple(row[3]), []).append(
                Cell(
                    row[4],
                    row[5],
                    _INF if row[6] is None else row[6],
                    _NINF if row[7] is None else row[7],
                    None if row[8] is None else [bytes(row[8])],
                    None if row[9] is None else [row[9]],
                )
            )
        status, speed_raw = await self.speed.read_all(
            metric.name,
            metric.version,
            list(plan.speed_cells),
            metric.source.partitions,
        )
        speed_states = 0
        for encoded, states in speed_raw.items():
            cells = parts.setdefault(decode_key(encoded), [])
            for state in states:
                cell = parse_state(state, sketch_index > 0)
                if cell.sketches is not None:
                    cell.sketches = [cell.sketches[sketch_index - 1]]
                cells.append(cell)
                speed_states += 1
        ranked = []
        for key, cells in parts.items():
            value = _rank_value(by, cells)
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
    ) -> tuple[ReadResult, list[tuple[str, ...]]]:
        """Keys with a cell in `[start, end)`: batch cells before W, speed sub-cells after."""
        base = metric.base_window_ms
        version = metric.version
        async with db.connection() as conn:
            cursor = await conn.execute(
                _KEYS_SQL,
                {
                    "metric": metric.name,
                    "version": version,
                    "base": base,
                    "start": start,
                    "end": end,
                    "prefix": prefix if metric.key else None,
                },
            )
            rows = await cursor.fetchall()
        watermark = rows[0][1] if rows and rows[0][2] == version else None
        found = {tuple(row[3]) for row in rows if row[3] is not None}
        first_speed = start if watermark is None else max(start, watermark)
        speed_starts = [s for s in range(_ceil(first_speed, base), end, base)]
        status, fields = await self.speed.read_fields(
            metric.name, version, speed_starts, metric.source.partitions
        )
        for encoded in fields:
            key = decode_key(encoded)
            if prefix is None or not key or key[0].startswith(prefix):
                found.add(key)
        return ReadResult(watermark, status), sorted(found)


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


def _row_cell(columns: Sequence[Any]) -> Cell:
    """A batch row's (count, sum, min, max, sketches, estimates) as a `Cell`."""
    count, total, minimum, maximum, sketches, estimates = columns
    return Cell(
        count,
        total,
        _INF if minimum is None else minimum,
        _NINF if maximum is None else maximum,
        None if sketches is None else [bytes(b) for b in sketches],
        estimates,
    )


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


def _rank_value(by: str, cells: Iterable[Cell]) -> float | int | None:
    cells = [c for c in cells if c.count]
    if not cells:
        return None
    if by == "count":
        return sum(c.count for c in cells)
    if by == "sum":
        return math.fsum(c.total for c in cells)
    if by == "min":
        return min(c.minimum for c in cells)
    if by == "max":
        return max(c.maximum for c in cells)
    if by == "avg":
        return math.fsum(c.total for c in cells) / sum(c.count for c in cells)
    return round(_distinct(cells, 0))
