"""Read the stored views back in the oracle's shape, `(metric, window_ms, start_ms, key) ->
outputs`, so a test can compare a whole view with `oracle.compare` (tests may use `shared`;
only the oracle may not)."""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import redis

from shared.aggregates import AggState, merge_all, outputs_of
from shared.config import Settings
from shared.speed_store import decode_key
from shared.windows import window_start

Cells = dict[tuple[str, int, int, tuple[str, ...]], dict[str, Any]]


def speed_view_cells(settings: Settings) -> Cells:
    """Every metric's speed cells (partition sub-cells merged), rolled up to every window."""
    client = redis.Redis.from_url(settings.redis.url)
    cells: Cells = {}
    for metric in settings.plans.values():
        version = metric.version
        states: dict[tuple[int, int, tuple[str, ...]], list[AggState]] = defaultdict(list)
        for name in client.scan_iter(match=f"lp:cell:{metric.name}:{version}:*", count=1000):
            start = int(name.decode().split(":")[4])
            for encoded, blob in client.hgetall(name).items():
                state = AggState.from_bytes(blob)
                for size in metric.windows_ms:
                    states[(size, window_start(start, size), decode_key(encoded))].append(state)
        for (size, start, key), parts in states.items():
            merged = merge_all(parts)
            if merged is not None and merged.count:
                cells[(metric.name, size, start, key)] = merged.outputs(metric)
    return cells


def batch_view_cells(settings: Settings, conn: Any) -> Cells:
    """The served generation's batch cells."""
    rows = conn.execute(
        """
        SELECT c.metric, c.window_ms, c.start_ms, c.key, c.count, c.sum, c.min, c.max,
               c.distinct_estimates
        FROM batch_cells c JOIN served_view s ON s.id = 1 AND c.generation = s.generation
        """
    ).fetchall()
    cells: Cells = {}
    for name, size, start, key, count, total, minimum, maximum, estimates in rows:
        metric = settings.plan(name)
        assert metric is not None, f"batch view holds cells of unknown metric {name}"
        cells[(name, size, start, tuple(key))] = outputs_of(
            metric,
            count,
            total,
            float("inf") if minimum is None else minimum,
            float("-inf") if maximum is None else maximum,
            estimates,
        )
    return cells
