"""The serving layer's caches. Batch-side entries are valid for one stamp of the served row
(rule 6: cells change only with it); speed-side entries are keyed by the very state bytes they
were rendered from. Neither can serve a stale answer."""

from __future__ import annotations

import asyncio
import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable, Sequence
from typing import Any

import orjson


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
    """Rendered speed-side points by content: an entry's key holds the metric, the window, the
    rendering options and the exact state bytes of every sub-cell read for it in this
    request, so a changed sub-cell is a different key and an entry can never be stale.
    Between two polls of a live series only the windows that received events miss. Least
    recently used entries go first once the keys and points held exceed `max_bytes`."""

    def __init__(self, max_bytes: int) -> None:
        self._entries: OrderedDict[tuple[Any, ...], tuple[orjson.Fragment | None, int]] = (
            OrderedDict()
        )
        self._bytes = 0
        self._max = max_bytes

    def point(
        self, content: tuple[Any, ...], states: Sequence[bytes], render: Callable[[], bytes]
    ) -> orjson.Fragment | None:
        """The point stored for `content` and `states`; on a miss `render()` makes its JSON
        (empty: no point)."""
        key = (*content, *states)
        entry = self._entries.get(key)
        if entry is not None:
            self._entries.move_to_end(key)
            return entry[0]
        data = render()
        point = orjson.Fragment(data) if data else None
        size = sum(map(len, states)) + len(data)
        self._entries[key] = (point, size)
        self._bytes += size
        while self._bytes > self._max:
            _, (_, evicted) = self._entries.popitem(last=False)
            self._bytes -= evicted
        return point


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
