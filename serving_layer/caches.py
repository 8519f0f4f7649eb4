"""The serving layer's caches. Batch-side entries are valid for one stamp of the served row
(rule 6: cells change only with it); speed-side entries are keyed by the very state bytes they
were rendered from. Neither can serve a stale answer."""

from __future__ import annotations

import asyncio
import threading
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Hashable
from dataclasses import replace
from typing import Any, TypeVar

from serving_layer.batch_view import StoredCell
from serving_layer.pools import AsyncDb
from serving_layer.read_plan import CachedCells, ReadPlan
from serving_layer.served_row import ServedRow
from shared.metric_plan import MetricPlan
from shared.windows import CellRef

PlanT = TypeVar("PlanT", bound=ReadPlan)
T = TypeVar("T")


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


class BatchParts:
    """The batch part of answers read with their served row in one statement (`keys`, one
    key's `sessions`), kept for that row's stamp: while the process holds the row
    (`HeldServedRow.row_for`) and a part is kept for its stamp, nothing is read."""

    def __init__(self, max_weight: int) -> None:
        self._parts = StampedCache(max_weight)

    async def read(
        self,
        db: AsyncDb,
        metric: MetricPlan,
        name: Hashable,
        read: Callable[[], Awaitable[tuple[ServedRow, T]]],
        weight: Callable[[T], int],
    ) -> tuple[ServedRow, T]:
        """The served row and the part of answer `name`: kept, or read (then kept)."""
        held = None if db.served is None else await db.served.row_for(metric)
        if held is not None and held.stamp is not None:
            kept: T | None = self._parts.get(name, held.stamp)
            if kept is not None:
                return held, kept
        served, part = await read()
        if served.stamp is not None:
            self._parts.put(name, served.stamp, part, weight(part))
        return served, part


class LiveCells:
    """The stored cells of windows reaching past W (`ReadPlan.live_refs`) per answer, as
    read, for one served stamp: their merge changes with every speed write, their rows only
    with a publication, so a plan reads none of them again under the same stamp. Kept rows
    merge in the order a cold read gives them (the same answer to the bit). Weighed in
    bytes, least recently used answers first."""

    def __init__(self, max_bytes: int) -> None:
        self._cells = StampedCache(max_bytes)

    def with_cached(self, name: Hashable, plan: PlanT) -> PlanT:
        """`plan` reading none of its live cells that an earlier read of answer `name` under
        the same served stamp kept."""
        held: CachedCells | None = self._cells.get(name, plan.served.stamp)
        if not held:
            return plan
        cached = {ref: held[ref] for ref in plan.live_refs if ref in held}
        return replace(plan, cached=cached) if cached else plan  # type: ignore[type-var]

    def keep(self, name: Hashable, plan: ReadPlan, stored: list[StoredCell]) -> list[StoredCell]:
        """Every row of the plan's cells: those read now and those cached; the live cells
        read now kept for the plan's stamp (a cell without a row too: none is stored)."""
        stamp, live = plan.served.stamp, plan.live_refs
        if stamp is None or not plan.served.reachable or not live:
            return stored
        fresh = [ref for ref in live if ref not in plan.cached]
        if fresh:
            by_ref: dict[CellRef, list[StoredCell]] = {ref: [] for ref in fresh}
            for row in stored:
                rows = by_ref.get(row.ref)
                if rows is not None:
                    rows.append(row)
            held: CachedCells = self._cells.get(name, stamp) or {}
            entry = {**held, **by_ref}
            weight = sum(_row_bytes(row) for rows in entry.values() for row in rows)
            self._cells.put(name, stamp, entry, weight + 64 * len(entry))
        if not plan.cached:
            return stored
        return [*stored, *(row for rows in plan.cached.values() for row in rows)]


def _row_bytes(row: StoredCell) -> int:
    """About what a stored cell's row holds in memory: its tuple and numbers, its sketches'
    bytes and its key."""
    size = 200 + sum(map(len, row.sketches or ()))
    return size + (0 if row.key is None else sum(len(part) + 50 for part in row.key))


class SpeedPointCache:
    """Rendered points of windows reaching past W, by content: an entry's key holds what
    names the answer and the window, the served stamp when the window also has batch cells,
    and the exact state bytes of every speed sub-cell read for it in this request (with the
    keys they belong to), so a changed sub-cell is a different key and an entry can never be
    stale. Between two polls of a live series only the windows that received events miss.
    Least recently used entries go first once the keys and points held exceed `max_bytes`."""

    def __init__(self, max_bytes: int) -> None:
        self._entries: OrderedDict[tuple[Any, ...], tuple[Any, int]] = OrderedDict()
        self._bytes = 0
        self._max = max_bytes

    def get(self, content: tuple[Any, ...]) -> Any:
        """The value stored for `content`, or None."""
        entry = self._entries.get(content)
        if entry is None:
            return None
        self._entries.move_to_end(content)
        return entry[0]

    def put(self, content: tuple[Any, ...], value: Any, size: int) -> None:
        """Keep `value` for `content`; `size`: the bytes its states and points hold."""
        old = self._entries.pop(content, None)
        if old is not None:
            self._bytes -= old[1]
        self._entries[content] = (value, size)
        self._bytes += size
        while self._bytes > self._max:
            _, (_, evicted) = self._entries.popitem(last=False)
            self._bytes -= evicted


class ReadsInFlight:
    """Reads of batch-only windows in progress, by answer. After a publication every cached
    batch point is stale, and the dashboards polling one query all miss at once: each would
    read and merge the same cells (a total over 10k keys: ~1.3 s of CPU apiece). The first
    such read leads; identical requests arriving meanwhile wait for it and then answer from
    the points it cached (a request that finds them missing still reads them itself)."""

    def __init__(self) -> None:
        self._reads: dict[Hashable, asyncio.Future[None]] = {}

    async def wait(self, name: Hashable) -> None:
        """Until no read of `name` is in progress (at once when none is)."""
        read = self._reads.get(name)
        if read is not None:
            await asyncio.shield(read)  # a waiter cancelled must not cancel the others' wait

    def lead(self, name: Hashable) -> bool:
        """Start a read of `name` unless one is in progress; True when this caller leads and
        must call `done(name)`."""
        if name in self._reads:
            return False
        self._reads[name] = asyncio.get_running_loop().create_future()
        return True

    def done(self, name: Hashable) -> None:
        """The read of `name` ended (cached or failed): its waiters go on."""
        read = self._reads.pop(name, None)
        if read is not None and not read.done():
            read.set_result(None)
