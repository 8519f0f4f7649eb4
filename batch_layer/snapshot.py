"""Rule 5's offset snapshot: per partition of every source and table (rule 11), the last stable
offset, taken once per run."""

from __future__ import annotations

import logging
import time
from concurrent.futures import TimeoutError as FutureTimeout

from confluent_kafka import IsolationLevel, KafkaError, KafkaException, TopicPartition
from confluent_kafka.admin import OffsetSpec

from batch_layer.errors import SnapshotUnavailableError
from shared.config import Settings
from shared.kafka import admin_client

log = logging.getLogger(__name__)

Snapshot = dict[str, dict[str, int]]
"""topic -> partition (as text, JSON-friendly) -> first offset not covered."""


SNAPSHOT_ATTEMPT_S = 10.0
"""How long one request for the partitions' offsets may take before it is asked again: a
leader killed while the request is in flight never answers, and a new request finds the
partition's new leader."""
SNAPSHOT_PATIENCE_S = 120.0
"""How long the snapshot keeps asking after a timeout, a retriable error (a leader election
takes seconds) or an answer without an offset, before the run fails with it. A partition
whose leader was killed as a full run asked came back once (the cluster test) with offset
-1001, librdkafka's "invalid", and no error: taken as the snapshot's end, the run read nothing
of that partition and published, and the next run's slice started at -1001. Once (CI) one client
kept answering -1001 for the whole patience, most likely from metadata it cached before the
election; so each round asks through a new client, which looks the leaders up afresh."""


def take_snapshot(settings: Settings) -> Snapshot:
    topics = [(s.topic, s.partitions) for s in settings.sources]
    topics += [(t.topic, t.partitions) for t in settings.tables]
    pending = [TopicPartition(topic, p) for topic, partitions in topics for p in range(partitions)]
    snapshot: Snapshot = {topic: {} for topic, _ in topics}
    give_up = time.monotonic() + SNAPSHOT_PATIENCE_S
    while True:
        admin = admin_client(settings)  # kept until answered: a dropped client never answers
        futures = admin.list_offsets(
            {tp: OffsetSpec.latest() for tp in pending},
            isolation_level=IsolationLevel.READ_COMMITTED,
            request_timeout=SNAPSHOT_ATTEMPT_S,
        )
        again: list[TopicPartition] = []
        for tp, future in futures.items():
            try:
                offset = future.result(timeout=SNAPSHOT_ATTEMPT_S + 5).offset
            except (FutureTimeout, KafkaException) as exc:
                if not _worth_retrying(exc) or time.monotonic() > give_up:
                    raise
                again.append(tp)
                continue
            if offset >= 0:
                snapshot[tp.topic][str(tp.partition)] = offset
            elif time.monotonic() > give_up:
                raise SnapshotUnavailableError(
                    f"the last stable offset of {tp.topic}[{tp.partition}] could not be read "
                    f"in {SNAPSHOT_PATIENCE_S:.0f} s (the answer was {offset}, no offset): "
                    "check that the partition has a leader, then run again"
                )
            else:
                again.append(tp)
        if not again:
            return snapshot
        log.warning("offsets of %d partitions not read yet; asking again", len(again))
        pending = again
        time.sleep(1.0)


def _worth_retrying(exc: BaseException) -> bool:
    """A timeout, or an error Kafka marks retriable (no leader, not the leader, a lost
    connection); not a missing topic or a denied request."""
    if isinstance(exc, FutureTimeout):
        return True
    error = exc.args[0] if exc.args else None
    if not isinstance(error, KafkaError):
        return False
    return error.retriable() or error.code() in (KafkaError._TIMED_OUT, KafkaError._TRANSPORT)
