"""The speed view in Redis: key scheme, the atomic fenced apply, and reads.

Key scheme (every key carries a TTL of `speed.ttl_days` as a backstop only):
- `lp:epoch` — a random marker; its absence means Redis lost its data (rule 9).
- `lp:fence:<topic>:<partition>` — hash {offset, stream_time}: the last applied offset and the
  partition's stream time (rule 3).
- `lp:cell:<metric>:<version>:<start_ms>:<partition>` — hash {key JSON -> AggState bytes}: one
  base cell's states for one source partition, written only by that partition's owner.
- `lp:ids:<topic>:<partition>:<bucket_start>` — set of event ids seen in that event-time bucket
  (de-duplication, rule 4), dropped once the bucket is late for every metric of the source.
- `lp:rebuilding` — set of `<topic>:<partition>` being rebuilt after a data loss.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson
import redis

EPOCH_KEY = "lp:epoch"
REBUILDING_KEY = "lp:rebuilding"

APPLIED, FENCE_MOVED, EPOCH_LOST = 1, 0, -1

# Compare-and-set on the fence and the epoch, then every write of the batch, in one call.
_APPLY_LUA = """
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return -1 end
local current = redis.call('HGET', KEYS[2], 'offset')
if (current or '') ~= ARGV[2] then return 0 end
local ttl = tonumber(ARGV[5])
redis.call('HSET', KEYS[2], 'offset', ARGV[3], 'stream_time', ARGV[4])
redis.call('EXPIRE', KEYS[2], ttl)
local n_hashes, n_sets = tonumber(ARGV[6]), tonumber(ARGV[7])
local arg = 8
for k = 3, 2 + n_hashes do
  local n = tonumber(ARGV[arg]); arg = arg + 1
  for i = 1, n do
    redis.call('HSET', KEYS[k], ARGV[arg], ARGV[arg + 1]); arg = arg + 2
  end
  redis.call('EXPIRE', KEYS[k], ttl)
end
for k = 3 + n_hashes, 2 + n_hashes + n_sets do
  local n = tonumber(ARGV[arg]); arg = arg + 1
  for i = 1, n do
    redis.call('SADD', KEYS[k], ARGV[arg]); arg = arg + 1
  end
  redis.call('EXPIRE', KEYS[k], ttl)
end
return 1
"""


def fence_key(topic: str, partition: int) -> str:
    return f"lp:fence:{topic}:{partition}"


def cell_key(metric: str, version: str, start_ms: int, partition: int) -> str:
    return f"lp:cell:{metric}:{version}:{start_ms}:{partition}"


def ids_key(topic: str, partition: int, bucket_ms: int) -> str:
    return f"lp:ids:{topic}:{partition}:{bucket_ms}"


def encode_key(key: Sequence[str]) -> bytes:
    return orjson.dumps(list(key))


def decode_key(data: bytes) -> tuple[str, ...]:
    return tuple(orjson.loads(data))


@dataclass(frozen=True)
class Fence:
    offset: int | None
    """The last applied offset; None when nothing was applied yet."""
    stream_time: int | None


@dataclass
class ApplyBatch:
    """Everything one batch of one partition writes, applied atomically by `apply`."""

    cells: dict[str, dict[bytes, bytes]] = field(default_factory=dict)
    ids: dict[str, list[str]] = field(default_factory=dict)


def ensure_epoch(client: redis.Redis, candidate: str) -> str:
    """The current epoch marker, creating it when Redis has none (fresh or wiped)."""
    client.set(EPOCH_KEY, candidate, nx=True)
    current = client.get(EPOCH_KEY)
    if current is None:
        return candidate
    return current.decode() if isinstance(current, bytes) else str(current)


class SpeedStore:
    """The fenced, atomic apply of one partition's batch (rule 3)."""

    def __init__(self, client: redis.Redis, ttl_seconds: int) -> None:
        self._client = client
        self._ttl = ttl_seconds
        self._apply = client.register_script(_APPLY_LUA)

    def apply(
        self,
        epoch: str,
        topic: str,
        partition: int,
        expected: Fence,
        new_fence: Fence,
        batch: ApplyBatch,
    ) -> int:
        """APPLIED, FENCE_MOVED (another worker wrote since) or EPOCH_LOST (Redis was wiped)."""
        keys: list[str] = [EPOCH_KEY, fence_key(topic, partition)]
        args: list[Any] = [
            epoch,
            "" if expected.offset is None else str(expected.offset),
            str(new_fence.offset),
            str(new_fence.stream_time),
            self._ttl,
            len(batch.cells),
            len(batch.ids),
        ]
        for key, fields in batch.cells.items():
            keys.append(key)
            args.append(len(fields))
            for name, value in fields.items():
                args.extend((name, value))
        for key, members in batch.ids.items():
            keys.append(key)
            args.append(len(members))
            args.extend(members)
        return int(self._apply(keys=keys, args=args))

    def read_fence(self, topic: str, partition: int) -> Fence:
        raw = self._client.hmget(fence_key(topic, partition), ["offset", "stream_time"])
        offset, stream_time = (None if v is None else int(v) for v in raw)
        return Fence(offset, stream_time)

    def read_states(self, requests: Iterable[tuple[str, bytes]]) -> list[bytes | None]:
        """Current states of (cell key, encoded key) pairs, pipelined in one round trip."""
        pipe = self._client.pipeline(transaction=False)
        for key, field_name in requests:
            pipe.hget(key, field_name)
        return pipe.execute()

    def known_ids(self, requests: Iterable[tuple[str, str]]) -> list[bool]:
        pipe = self._client.pipeline(transaction=False)
        for key, member in requests:
            pipe.sismember(key, member)
        return [bool(v) for v in pipe.execute()]


def read_cells(
    client: redis.Redis,
    metric: str,
    version: str,
    starts: Sequence[int],
    partitions: int,
    key: Sequence[str] | None,
) -> dict[int, dict[bytes, list[bytes]]]:
    """Speed sub-cells of the given base cells: start -> encoded key -> one state per partition.

    One pipelined round trip; with `key` only that key's states are fetched."""
    pipe = client.pipeline(transaction=False)
    wanted = None if key is None else encode_key(key)
    for start in starts:
        for partition in range(partitions):
            name = cell_key(metric, version, start, partition)
            if wanted is None:
                pipe.hgetall(name)
            else:
                pipe.hget(name, wanted)
    replies = iter(pipe.execute())
    cells: dict[int, dict[bytes, list[bytes]]] = {}
    for start in starts:
        by_key: dict[bytes, list[bytes]] = {}
        for _ in range(partitions):
            reply = next(replies)
            items: Mapping[bytes, bytes] = (
                reply if wanted is None else ({wanted: reply} if reply is not None else {})
            )
            for encoded, state in items.items():
                by_key.setdefault(encoded, []).append(state)
        if by_key:
            cells[start] = by_key
    return cells
