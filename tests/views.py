"""Read the stored views back in the oracle's shape, `(metric, window_ms, start_ms, key) ->
outputs`, so a test can compare a whole view with `oracle.compare` (tests may use `shared`;
only the oracle may not)."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping
from typing import Any

from shared.aggregations import DEFAULT_RENDER, CellState, decode_state, merge_states
from shared.config import Settings
from shared.db.cells import state_of_columns
from shared.speed_view import SyncRedis, redis_client
from shared.speed_view.held import DURATIONS_PREFIX
from shared.speed_view.keys import cell_key, cell_of_key, cell_pattern, decode_key
from shared.windows import window_start

Cells = dict[tuple[str, int, int, tuple[str, ...]], dict[str, Any]]


def speed_view_cells(settings: Settings, client: SyncRedis | None = None) -> Cells:
    """Every metric's speed cells (partition sub-cells merged), rolled up to every window;
    read from `client`, or from the configured Redis."""
    client = client or redis_client(settings.redis)
    stored = {
        name.decode(): client.hgetall(name)
        for metric in settings.plans.values()
        for name in client.scan_iter(
            match=cell_pattern(metric.source.topic, metric.name, metric.version), count=1000
        )
    }
    return speed_cells_of(settings, stored)


def speed_cells_of(settings: Settings, stored: Mapping[str, Mapping[bytes, bytes]]) -> Cells:
    """`speed_view_cells` of sub-cells given as {cell key: {encoded key: state}}."""
    cells: Cells = {}
    for metric in settings.plans.values():
        topic = metric.source.topic
        states: dict[tuple[int, int, tuple[str, ...]], list[CellState]] = defaultdict(list)
        for name, fields in stored.items():
            if not name.startswith("lp:cell:"):  # a session metric's held events
                continue
            start, partition = cell_of_key(name)
            if name != cell_key(topic, partition, metric.name, metric.version, start):
                continue
            for encoded, blob in fields.items():
                if encoded.startswith(DURATIONS_PREFIX):  # what a session total is kept from
                    continue
                state = decode_state(blob)
                for size in metric.windows_ms:
                    states[(size, window_start(start, size), decode_key(encoded))].append(state)
        for (size, start, key), parts in states.items():
            rendered = metric.aggregations.render(merge_states(metric.kinds, parts), DEFAULT_RENDER)
            if rendered is not None:
                cells[(metric.name, size, start, key)] = rendered
    return cells


def batch_view_cells(settings: Settings, conn: Any) -> Cells:
    """The served generation's batch cells."""
    rows = conn.execute(
        """
        SELECT c.metric, c.window_ms, c.start_ms, c.key, c.count, c.sum, c.min, c.max,
               c.sketches, c.sketch_summaries
        FROM batch_cells c JOIN served_view s ON s.id = 1 AND c.generation = s.generation
        """
    ).fetchall()
    cells: Cells = {}
    for name, size, start, key, *columns in rows:
        metric = settings.plan(name)
        assert metric is not None, f"batch view holds cells of unknown metric {name}"
        state = state_of_columns(*columns)
        rendered = metric.aggregations.render(state, DEFAULT_RENDER)
        assert rendered is not None, f"an empty stored cell {(name, size, start, key)}"
        cells[(name, size, start, tuple(key))] = rendered
    return cells
