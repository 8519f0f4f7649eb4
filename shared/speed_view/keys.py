"""The speed view's key scheme, the one place Redis key names are spelled. Every key carries a
TTL of `speed.ttl_days` as a backstop only.

Every key a source partition's fenced apply writes carries that partition's hash tag
`{<topic>:<partition>}`, so on a Redis Cluster the apply's one Lua call stays in one slot
(rule 3) while the partitions spread over the masters. The view's own markers share the tag
`{lp}`, so the rebuild marks change together.

- `lp:{lp}:epoch` — a random marker; its absence means Redis lost its data (rule 9).
- `lp:fence:{<topic>:<partition>}` — hash {offset, stream_time, defs}: the last applied
  offset, the partition's stream time (rule 3) and a digest of the metric versions its cells
  hold. A fence that vanished under a worker that had written it means the partition's slot
  lost its data (rule 9).
- `lp:cell:{<topic>:<partition>}:<metric>:<version>:<start_ms>` — hash {key JSON -> state
  bytes (`shared.aggregations.encode_state`)}: one base cell's states for one source
  partition, written only by that partition's owner. A session metric's `sessions` rollup
  also holds, per rolled-up key, `#<key JSON>` -> its durations' multiset
  (`held.DurationCounts`), which readers of every key skip.
- `lp:sessions:{<topic>:<partition>}:<metric>:<version>` — hash {key JSON -> index}: a
  session metric's sessions of one source partition, per key (rule 13; `held.KeyIndex`).
- `lp:sevents:{<topic>:<partition>}:<metric>:<version>:<sha1 of the key JSON>:<first>` — string:
  one session's events (`held.event_lines`), appended to as events join it.
- `lp:ids:{<topic>:<partition>}:<bucket_start>` — set of the de-dup identities (event time
  and id, `shared.events.dedup_identity`) seen in that event-time bucket (rule 4), dropped
  once the bucket is late for every metric of the source.
- `lp:{lp}:rebuilding` — set of `<topic>:<partition>` being rebuilt after a data loss; the API
  reports `speed_status: "rebuilding"` while it is not empty.
- `lp:{lp}:rejoin` — hash `<topic>:<partition>` -> the comma-separated tables whose late
  versions the partition's cells are still to be joined with again (rule 11); kept until the
  recomputed cells replace the old ones, so a new owner does it if this one dies first.
- `lp:{lp}:rebuild_until` — hash `<topic>:<partition>` -> the offset a rebuild must reach
  before that member leaves the rebuilding set (so whichever worker owns the partition can
  finish it).
- `lp:{lp}:stalled` — hash `<topic>:<partition>` -> JSON {cause, error, since_ms, worker}: a
  partition whose batches keep failing (not Redis: a failure Redis cannot record), written by
  its owner and removed by whichever worker next applies or positions it; `/v1/status` lists
  them and `/readyz` answers 503 while there are any.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import NamedTuple

import orjson

EPOCH_KEY = "lp:{lp}:epoch"
REBUILDING_KEY = "lp:{lp}:rebuilding"
REBUILD_UNTIL_KEY = "lp:{lp}:rebuild_until"
REJOIN_KEY = "lp:{lp}:rejoin"
STALLED_KEY = "lp:{lp}:stalled"


def partition_tag(topic: str, partition: int | str) -> str:
    """The hash tag of every key one source partition's apply writes (Kafka topic names
    cannot hold braces or colons, so the tag is unambiguous)."""
    return f"{{{topic}:{partition}}}"


def fence_key(topic: str, partition: int) -> str:
    return f"lp:fence:{partition_tag(topic, partition)}"


def cell_key_prefix(topic: str, partition: int, metric: str, version: str) -> str:
    """`cell_key` up to `<start_ms>`: readers that build the names inside a Lua script send
    this once per partition instead of one name per sub-cell."""
    return f"lp:cell:{partition_tag(topic, partition)}:{metric}:{version}:"


def cell_key(topic: str, partition: int, metric: str, version: str, start_ms: int) -> str:
    return f"{cell_key_prefix(topic, partition, metric, version)}{start_ms}"


def sessions_key(topic: str, partition: int, metric: str, version: str) -> str:
    return f"lp:sessions:{partition_tag(topic, partition)}:{metric}:{version}"


def session_events_key(
    topic: str, partition: int, metric: str, version: str, key: bytes, first_ms: int
) -> str:
    """The string of one session's events (the key hashed: a key may be long)."""
    digest = hashlib.sha1(key, usedforsecurity=False).hexdigest()
    return f"lp:sevents:{partition_tag(topic, partition)}:{metric}:{version}:{digest}:{first_ms}"


def _literal(name: str) -> str:
    """A name as it matches itself in a SCAN pattern: a rollup's brackets (`views[country]`)
    are a character class in Redis's glob unless escaped."""
    return "".join(f"\\{c}" if c in "*?[]\\" else c for c in name)


def session_events_pattern(topic: str, partition: int, metric: str, version: str) -> str:
    """A SCAN pattern for a session metric version's event strings of one partition."""
    return f"lp:sevents:{partition_tag(topic, partition)}:{_literal(metric)}:{version}:*"


def cell_pattern(topic: str, metric: str, version: str, partition: int | None = None) -> str:
    """A SCAN pattern for a metric version's sub-cells (of one partition, or all)."""
    tag = partition_tag(topic, "*" if partition is None else partition)
    return f"lp:cell:{tag}:{_literal(metric)}:{version}:*"


def cell_of_key(key: str) -> tuple[int, int]:
    """(start_ms, partition) of a `cell_key`."""
    tag, _, rest = key.removeprefix("lp:cell:{").partition("}:")
    return int(rest.rpartition(":")[2]), int(tag.rpartition(":")[2])


def ids_key(topic: str, partition: int, bucket_ms: int) -> str:
    return f"lp:ids:{partition_tag(topic, partition)}:{bucket_ms}"


def ids_pattern(topic: str, partition: int | None = None) -> str:
    """A SCAN pattern for a source's de-dup id sets (of one partition, or all)."""
    return f"lp:ids:{partition_tag(topic, '*' if partition is None else partition)}:*"


def ids_of_key(key: str) -> tuple[int, int]:
    """(partition, bucket_ms) of an `ids_key`."""
    tag, _, bucket = key.removeprefix("lp:ids:{").partition("}:")
    return int(tag.rpartition(":")[2]), int(bucket)


def rebuild_member(topic: str, partition: int) -> str:
    """A partition's name in the rebuilding set and `REBUILD_UNTIL_KEY`."""
    return f"{topic}:{partition}"


class PartitionStall(NamedTuple):
    """A `STALLED_KEY` entry: why a partition's batches keep failing and since when."""

    cause: str
    """The store the failure points at (`kafka`, `postgres`) or `error` (anything else)."""
    error: str
    since_ms: int
    worker: str

    def encode(self) -> bytes:
        return orjson.dumps(self._asdict())

    @classmethod
    def decode(cls, data: bytes) -> PartitionStall:
        return cls(**orjson.loads(data))


def encode_key(key: Sequence[str]) -> bytes:
    """A metric key as the field name of its state in a cell hash."""
    return orjson.dumps(list(key))


def decode_key(data: bytes) -> tuple[str, ...]:
    return tuple(orjson.loads(data))
