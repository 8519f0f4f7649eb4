"""Rule 5's offset snapshot: per partition, the last stable offset, taken once per run."""

from __future__ import annotations

from confluent_kafka import IsolationLevel, TopicPartition
from confluent_kafka.admin import OffsetSpec

from shared.config import Settings
from shared.kafka import admin_client

Snapshot = dict[str, dict[str, int]]
"""topic -> partition (as text, JSON-friendly) -> first offset not covered."""


def take_snapshot(settings: Settings) -> Snapshot:
    admin = admin_client(settings)
    wanted = {
        TopicPartition(source.topic, p): OffsetSpec.latest()
        for source in settings.sources
        for p in range(source.partitions)
    }
    futures = admin.list_offsets(wanted, isolation_level=IsolationLevel.READ_COMMITTED)
    snapshot: Snapshot = {source.topic: {} for source in settings.sources}
    for tp, future in futures.items():
        snapshot[tp.topic][str(tp.partition)] = future.result(timeout=30).offset
    return snapshot
