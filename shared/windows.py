"""Tumbling, epoch-aligned, half-open windows `[start, end)` in epoch milliseconds (UTC)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple


def window_start(time_ms: int, size_ms: int) -> int:
    """The start of the window of `size_ms` containing `time_ms` (floors negatives too)."""
    return time_ms - time_ms % size_ms


def window_starts(start_ms: int, end_ms: int, size_ms: int) -> range:
    """Starts of the windows of `size_ms` whose start lies in `[start_ms, end_ms)`."""
    first = window_start(start_ms, size_ms)
    if first < start_ms:
        first += size_ms
    return range(first, end_ms, size_ms) if end_ms > first else range(0)


class CellRef(NamedTuple):
    """One stored cell: a window of `size_ms` starting at `start_ms`."""

    size_ms: int
    start_ms: int


class WindowPlan(NamedTuple):
    """How to compose one window: batch cells (each fully before W), then speed base cells."""

    batch_cells: tuple[CellRef, ...]
    speed_cells: tuple[int, ...]


def plan_window(
    start_ms: int,
    size_ms: int,
    base_ms: int,
    watermark_ms: int | None,
    batch_sizes: Sequence[int],
) -> WindowPlan:
    """Rule 8: cells ending at or before W come from the batch, composed greedily from the
    coarsest stored size that is aligned and fits; the rest are speed base cells."""
    end_ms = start_ms + size_ms
    batch_end = start_ms if watermark_ms is None else max(start_ms, min(end_ms, watermark_ms))
    coarse_first = sorted(set(batch_sizes) | {base_ms}, reverse=True)
    batch: list[CellRef] = []
    position = start_ms
    while position < batch_end:
        size = next(s for s in coarse_first if position % s == 0 and position + s <= batch_end)
        batch.append(CellRef(size, position))
        position += size
    return WindowPlan(tuple(batch), tuple(range(batch_end, end_ms, base_ms)))


def point_source(start_ms: int, end_ms: int, watermark_ms: int | None) -> str:
    """A point's `source` by position against W: batch, speed or mixed."""
    if watermark_ms is not None and end_ms <= watermark_ms:
        return "batch"
    if watermark_ms is None or start_ms >= watermark_ms:
        return "speed"
    return "mixed"
