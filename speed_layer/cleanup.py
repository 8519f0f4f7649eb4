"""What a worker deletes from the speed view once the batch serves it (rule 8 in
docs/semantics.md): the owned sub-cells ending at or before a W served for
`speed.cleanup_delay_s`, and the owned de-dup id sets whose bucket is late for every metric
of the source (rule 4)."""

from __future__ import annotations

from collections.abc import Mapping

from faust.types import TP

from shared.speed_view import SpeedViewWriter
from speed_layer.processor import SourceProcessor
from speed_layer.served_state import ServedState


def expired_keys(
    owned: set[TP],
    processors: Mapping[str, SourceProcessor],
    served: ServedState,
    store: SpeedViewWriter,
) -> tuple[list[str], list[str]]:
    """(the sub-cells, the id sets) of the `owned` partitions that may be deleted."""
    by_topic: dict[str, set[int]] = {}
    for tp in owned:
        by_topic.setdefault(tp.topic, set()).add(tp.partition)
    cells: list[str] = []
    id_sets: list[str] = []
    for topic, partitions in by_topic.items():
        processor = processors[topic]
        for metric in processor.metrics:
            safe = served.safe_watermark(metric.name)
            if safe is None:
                continue
            for key, start, partition in store.sub_cells(metric):
                if partition in partitions and metric.windows.cell_end(start) <= safe:
                    cells.append(key)
        for key, partition, bucket in store.id_sets(topic):
            fence = processor.known_fence(partition) if partition in partitions else None
            if fence is not None and processor.plan.id_bucket_closed(
                bucket, served.watermarks, fence.stream_time
            ):
                id_sets.append(key)
    return cells, id_sets
