"""Rule 5's offset snapshot: per partition of every source and table (rule 11), the last stable
offset, taken once per run."""

from __future__ import annotations

from confluent_kafka import IsolationLevel, TopicPartition
from confluent_kafka.admin import OffsetSpec

from shared.config import Settings
from shared.kafka import admin_client

Snapshot = dict[str, dict[str, int]]
"""topic -> partition (as text, JSON-friendly) -> first offset not covered."""


def take_snapshot(settings: Settings) -> Snapshot:
    admin = admin_client(settings)
    topics = [(s.topic, s.partitions) for s in settings.sources]
    topics += [(t.topic, t.partitions) for t in settings.tables]
    wanted = {
        TopicPartition(topic, p): OffsetSpec.latest()
        for topic, partitions in topics
        for p in range(partitions)
    }
    futures = admin.list_offsets(wanted, isolation_level=IsolationLevel.READ_COMMITTED)
    snapshot: Snapshot = {topic: {} for topic, _ in topics}
    for tp, future in futures.items():
        snapshot[tp.topic][str(tp.partition)] = future.result(timeout=30).offset
    return snapshot
