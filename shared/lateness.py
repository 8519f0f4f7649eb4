"""Lateness (rule 2) and the batch watermark W (rule 5), as pure functions."""

from __future__ import annotations

from collections.abc import Iterable

from shared.windows import window_start


def is_late(
    cell_end_ms: int, grace_ms: int, stream_time_ms: int | None, watermark_ms: int | None
) -> bool:
    """Kafka Streams' rule, plus: a cell the batch already serves (end <= W) is closed."""
    if stream_time_ms is not None and cell_end_ms + grace_ms <= stream_time_ms:
        return True
    return watermark_ms is not None and cell_end_ms <= watermark_ms


def latest_late_start(
    base_ms: int, grace_ms: int, stream_time_ms: int | None, watermark_ms: int | None
) -> int:
    """The latest start of a late base cell: a cell of size `base_ms` starting at `s` is late
    (`is_late`) iff `s <= latest_late_start(...)`. One comparison per event in the speed
    layer's hot loop, recomputed only when the stream time moves."""
    bound = -(2**63)
    if stream_time_ms is not None:
        bound = stream_time_ms - grace_ms - base_ms
    if watermark_ms is not None:
        bound = max(bound, watermark_ms - base_ms)
    return bound


def id_bucket_closed(
    bucket_start_ms: int,
    bucket_ms: int,
    metrics: Iterable[tuple[int, int, int | None]],
    stream_time_ms: int | None,
) -> bool:
    """Whether the speed layer may forget a de-dup id bucket (rule 4): a later copy of any of
    its events would be late for every metric. `metrics` holds each metric's (base window,
    grace, W). The bucket's last instant lies in the last cell it overlaps, which ends
    latest, so that cell decides (the bucket is the source's smallest base window, which
    need not divide another metric's base)."""
    last = bucket_start_ms + bucket_ms - 1
    return all(
        is_late(window_start(last, base) + base, grace, stream_time_ms, watermark)
        for base, grace, watermark in metrics
    )


def batch_watermark(
    previous_ms: int | None, stream_times_ms: Iterable[int], grace_ms: int, base_ms: int
) -> int | None:
    """`W = max(W_prev, floor_base(max_p L_p - grace))`; an idle partition never holds W back."""
    newest = max(stream_times_ms, default=None)
    if newest is None:
        return previous_ms
    candidate = window_start(newest - grace_ms, base_ms)
    return candidate if previous_ms is None else max(previous_ms, candidate)
