"""The speed view in Redis: key scheme, the atomic fenced apply, and reads.

Key scheme (every key carries a TTL of `speed.ttl_days` as a backstop only):
- `lp:epoch` — a random marker; its absence means Redis lost its data (rule 9).
- `lp:fence:<topic>:<partition>` — hash {offset, stream_time, defs}: the last applied offset,
  the partition's stream time (rule 3) and a digest of the metric versions its cells hold.
- `lp:cell:<metric>:<version>:<start_ms>:<partition>` — hash {key JSON -> AggState bytes}: one
  base cell's states for one source partition, written only by that partition's owner.
- `lp:ids:<topic>:<partition>:<bucket_start>` — set of event ids seen in that event-time bucket
  (de-duplication, rule 4), dropped once the bucket is late for every metric of the source.
- `lp:rebuilding` — set of `<topic>:<partition>` being rebuilt after a data loss; the API
  reports `speed_status: "rebuilding"` while it is not empty.
- `lp:rebuild_until` — hash `<topic>:<partition>` -> the offset a rebuild must reach before
  that member leaves `lp:rebuilding` (so whichever worker owns the partition can finish it).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson
import redis

EPOCH_KEY = "lp:epoch"
REBUILDING_KEY = "lp:rebuilding"
REBUILD_UNTIL_KEY = "lp:rebuild_until"

APPLIED, FENCE_MOVED, EPOCH_LOST = 1, 0, -1

# Compare-and-set on the fence and the epoch, then every write of the batch, in one call.
_APPLY_LUA = """
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return -1 end
local current = redis.call('HGET', KEYS[2], 'offset')
if (current or '') ~= ARGV[2] then return 0 end
local ttl = tonumber(ARGV[5])
redis.call('HSET', KEYS[2], 'offset', ARGV[3], 'defs', ARGV[8])
if ARGV[4] == '' then
  redis.call('HDEL', KEYS[2], 'stream_time')
else
  redis.call('HSET', KEYS[2], 'stream_time', ARGV[4])
end
redis.call('EXPIRE', KEYS[2], ttl)
local n_hashes, n_sets = tonumber(ARGV[6]), tonumber(ARGV[7])
local arg = 9
local function write(command, key, first, last)
  local chunk = 2000
  for i = first, last, chunk do
    redis.call(command, key, unpack(ARGV, i, math.min(i + chunk - 1, last)))
  end
  redis.call('EXPIRE', key, ttl)
end
for k = 3, 2 + n_hashes do
  local n = tonumber(ARGV[arg])
  if n > 0 then write('HSET', KEYS[k], arg + 1, arg + 2 * n) end
  arg = arg + 1 + 2 * n
end
for k = 3 + n_hashes, 2 + n_hashes + n_sets do
  local n = tonumber(ARGV[arg])
  if n > 0 then write('SADD', KEYS[k], arg + 1, arg + n) end
  arg = arg + 1 + n
end
return 1
"""


def fence_key(topic: str, partition: int) -> str:
    return f"lp:fence:{topic}:{partition}"


def cell_key(metric: str, version: str, start_ms: int, partition: int) -> str:
    return f"lp:cell:{metric}:{version}:{start_ms}:{partition}"


def cell_key_prefix(metric: str, version: str) -> str:
    """`cell_key` up to `<start_ms>:<partition>`: readers that build the names inside a Lua
    script send this once instead of one name per sub-cell."""
    return f"lp:cell:{metric}:{version}:"


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
    defs: str | None = None
    """A digest of the metric versions the partition's cells were built with; a worker with
    other definitions rebuilds the partition (rule 7 -> rule 9)."""


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
            "" if new_fence.stream_time is None else str(new_fence.stream_time),
            self._ttl,
            len(batch.cells),
            len(batch.ids),
            new_fence.defs or "",
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
        raw = self._client.hmget(fence_key(topic, partition), ["offset", "stream_time", "defs"])
        offset, stream_time = (None if not v else int(v) for v in raw[:2])
        defs = raw[2].decode() if isinstance(raw[2], bytes) and raw[2] else None
        return Fence(offset, stream_time, defs)

    def read_fields(self, requests: Mapping[str, Sequence[bytes]]) -> dict[str, list[bytes | None]]:
        """Current states of the given fields of each cell hash, one HMGET each, one round trip."""
        pipe = self._client.pipeline(transaction=False)
        names = list(requests)
        for name in names:
            pipe.hmget(name, list(requests[name]))
        return dict(zip(names, pipe.execute(), strict=True))

    def known_ids(self, requests: Mapping[str, Sequence[str]]) -> dict[str, list[bool]]:
        """Which of the given ids each de-dup set holds, one SMISMEMBER each, one round trip."""
        pipe = self._client.pipeline(transaction=False)
        names = list(requests)
        for name in names:
            pipe.smismember(name, list(requests[name]))
        return {
            name: [bool(v) for v in reply]
            for name, reply in zip(names, pipe.execute(), strict=True)
        }

    def start_rebuild(self, members: Mapping[str, int]) -> None:
        """Mark `<topic>:<partition>` members as rebuilding until their fence reaches the
        offset given (kept in `lp:rebuild_until` so a new owner can finish the job)."""
        if not members:
            return
        pipe = self._client.pipeline(transaction=True)
        pipe.sadd(REBUILDING_KEY, *members)
        for member, until in members.items():
            pipe.hset(REBUILD_UNTIL_KEY, member, str(until))
        pipe.expire(REBUILDING_KEY, self._ttl)
        pipe.expire(REBUILD_UNTIL_KEY, self._ttl)
        pipe.execute()

    def rebuild_until(self, member: str) -> int | None:
        raw = self._client.hget(REBUILD_UNTIL_KEY, member)
        return None if raw is None else int(raw)

    def finish_rebuild(self, member: str) -> None:
        pipe = self._client.pipeline(transaction=True)
        pipe.srem(REBUILDING_KEY, member)
        pipe.hdel(REBUILD_UNTIL_KEY, member)
        pipe.execute()

    def scan_keys(self, pattern: str) -> list[str]:
        return [
            k.decode() if isinstance(k, bytes) else str(k)
            for k in self._client.scan_iter(match=pattern, count=1000)
        ]

    def delete_keys(self, keys: Sequence[str]) -> int:
        deleted = 0
        for i in range(0, len(keys), 500):
            deleted += int(self._client.unlink(*keys[i : i + 500]))
        return deleted
