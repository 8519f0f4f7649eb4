"""The speed view's key scheme, the one place Redis key names are spelled. Every key carries a
TTL of `speed.ttl_days` as a backstop only.

- `lp:epoch` — a random marker; its absence means Redis lost its data (rule 9).
- `lp:fence:<topic>:<partition>` — hash {offset, stream_time, defs}: the last applied offset,
  the partition's stream time (rule 3) and a digest of the metric versions its cells hold.
- `lp:cell:<metric>:<version>:<start_ms>:<partition>` — hash {key JSON -> state bytes
  (`shared.aggregations.encode_state`)}: one base cell's states for one source partition,
  written only by that partition's owner.
- `lp:ids:<topic>:<partition>:<bucket_start>` — set of event ids seen in that event-time bucket
  (de-duplication, rule 4), dropped once the bucket is late for every metric of the source.
- `lp:rebuilding` — set of `<topic>:<partition>` being rebuilt after a data loss; the API
  reports `speed_status: "rebuilding"` while it is not empty.
- `lp:rebuild_until` — hash `<topic>:<partition>` -> the offset a rebuild must reach before
  that member leaves `lp:rebuilding` (so whichever worker owns the partition can finish it).
"""

from __future__ import annotations

from collections.abc import Sequence

import orjson

EPOCH_KEY = "lp:epoch"
REBUILDING_KEY = "lp:rebuilding"
REBUILD_UNTIL_KEY = "lp:rebuild_until"


def fence_key(topic: str, partition: int) -> str:
    return f"lp:fence:{topic}:{partition}"


def cell_key_prefix(metric: str, version: str) -> str:
    """`cell_key` up to `<start_ms>:<partition>`: readers that build the names inside a Lua
    script send this once instead of one name per sub-cell."""
    return f"lp:cell:{metric}:{version}:"


def cell_key(metric: str, version: str, start_ms: int, partition: int) -> str:
    return f"{cell_key_prefix(metric, version)}{start_ms}:{partition}"


def cell_pattern(metric: str, version: str, partition: int | None = None) -> str:
    """A SCAN pattern for a metric version's sub-cells (of one partition, or all)."""
    return f"{cell_key_prefix(metric, version)}*" + ("" if partition is None else f":{partition}")


def cell_of_key(key: str, metric: str, version: str) -> tuple[int, int]:
    """(start_ms, partition) of a `cell_key` of the given metric version."""
    start, _, partition = key.removeprefix(cell_key_prefix(metric, version)).partition(":")
    return int(start), int(partition)


def ids_key(topic: str, partition: int, bucket_ms: int) -> str:
    return f"lp:ids:{topic}:{partition}:{bucket_ms}"


def ids_pattern(topic: str, partition: int | None = None) -> str:
    """A SCAN pattern for a source's de-dup id sets (of one partition, or all)."""
    return f"lp:ids:{topic}:" + ("*" if partition is None else f"{partition}:*")


def ids_of_key(key: str, topic: str) -> tuple[int, int]:
    """(partition, bucket_ms) of an `ids_key` of the given topic."""
    partition, _, bucket = key.removeprefix(f"lp:ids:{topic}:").partition(":")
    return int(partition), int(bucket)


def rebuild_member(topic: str, partition: int) -> str:
    """A partition's name in `lp:rebuilding` / `lp:rebuild_until`."""
    return f"{topic}:{partition}"


def encode_key(key: Sequence[str]) -> bytes:
    """A metric key as the field name of its state in a cell hash."""
    return orjson.dumps(list(key))


def decode_key(data: bytes) -> tuple[str, ...]:
    return tuple(orjson.loads(data))
