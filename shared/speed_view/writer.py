"""The speed layer's writer of the speed view (rule 3): fences, the fenced atomic apply, de-dup
ids, rebuild marks and the scans cleanup uses. Key names come from `keys`; states are the
aggregation registry's bytes."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from shared.metric_plan import MetricPlan
from shared.speed_view.client import SyncRedis
from shared.speed_view.keys import (
    EPOCH_KEY,
    REBUILD_UNTIL_KEY,
    REBUILDING_KEY,
    REJOIN_KEY,
    STALLED_KEY,
    PartitionStall,
    cell_of_key,
    cell_pattern,
    fence_key,
    ids_of_key,
    ids_pattern,
    session_events_pattern,
    sessions_key,
)

APPLIED, FENCE_MOVED, EPOCH_LOST = 1, 0, -1


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
    deleted: dict[str, list[bytes]] = field(default_factory=dict)
    """Fields removed from hashes: a session metric's bucket no session starts in any more."""
    strings: dict[str, bytes] = field(default_factory=dict)
    """Strings written whole: a session's events, cut again."""
    appends: dict[str, bytes] = field(default_factory=dict)
    """Bytes appended to strings: the events a session gains."""
    dropped: list[str] = field(default_factory=list)
    """Keys removed: the strings of sessions that no longer exist."""


def ensure_epoch(client: SyncRedis, candidate: str) -> str:
    """The current epoch marker, creating it when Redis has none (fresh or wiped)."""
    client.set(EPOCH_KEY, candidate, nx=True)
    current = client.get(EPOCH_KEY)
    if current is None:
        return candidate
    return current.decode() if isinstance(current, bytes) else str(current)


class SpeedViewWriter:
    """The speed layer's side of the view: the fenced, atomic apply of one partition's batch
    (rule 3), the reads a batch needs first (fence, stored states, known ids), rebuild marks
    (rule 9) and the scans cleanup uses."""

    def __init__(self, client: SyncRedis, ttl_seconds: int) -> None:
        self._client = client
        self._ttl = ttl_seconds
        self._apply = client.register_script(_script("apply.lua"))

    def apply(
        self, topic: str, partition: int, expected: Fence, new_fence: Fence, batch: ApplyBatch
    ) -> int:
        """APPLIED, FENCE_MOVED (another worker wrote since) or EPOCH_LOST (the fence this
        worker wrote or read vanished: the partition's data was lost)."""
        keys: list[str] = [fence_key(topic, partition)]
        args: list[Any] = [
            "" if expected.offset is None else str(expected.offset),
            str(new_fence.offset),
            "" if new_fence.stream_time is None else str(new_fence.stream_time),
            self._ttl,
            len(batch.cells),
            len(batch.ids),
            new_fence.defs or "",
            len(batch.deleted),
            len(batch.strings),
            len(batch.appends),
            len(batch.dropped),
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
        for key, names in batch.deleted.items():
            keys.append(key)
            args.append(len(names))
            args.extend(names)
        for writes in (batch.strings, batch.appends):
            keys.extend(writes)
            args.extend(writes.values())
        keys.extend(batch.dropped)
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

    def read_hashes(self, names: Sequence[str]) -> dict[str, dict[bytes, bytes]]:
        """Every field of each hash (HGETALL each, one round trip)."""
        pipe = self._client.pipeline(transaction=False)
        for name in names:
            pipe.hgetall(name)
        return dict(zip(names, pipe.execute(), strict=True))

    def read_strings(self, names: Sequence[str]) -> list[bytes | None]:
        """The given strings (a session's events), one round trip."""
        if not names:
            return []
        pipe = self._client.pipeline(transaction=False)
        for name in names:
            pipe.get(name)
        return list(pipe.execute())

    def held_keys(self, topic: str, partition: int, plan: MetricPlan) -> dict[bytes, bytes]:
        """Every key's session index of a session metric on one partition (`held`)."""
        fields = self._client.hgetall(sessions_key(topic, partition, plan.name, plan.version))
        return {bytes(k): bytes(v) for k, v in fields.items()}  # type: ignore[arg-type]

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

    def epoch(self) -> str | None:
        """The current epoch marker (None: Redis lost the view)."""
        current = self._client.get(EPOCH_KEY)
        if current is None:
            return None
        return current.decode() if isinstance(current, bytes) else str(current)

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

    def mark_rejoin(self, members: Mapping[str, set[str]]) -> None:
        """Note, per `<topic>:<partition>` member, the tables its cells are to be joined with
        again (added to any noted before)."""
        for member, tables in members.items():
            pending = self.pending_rejoin(member) | tables
            self._client.hset(REJOIN_KEY, member, ",".join(sorted(pending)))
        if members:
            self._client.expire(REJOIN_KEY, self._ttl)

    def pending_rejoin(self, member: str) -> set[str]:
        raw = self._client.hget(REJOIN_KEY, member)
        text = raw.decode() if isinstance(raw, bytes) else (raw or "")
        return set(text.split(",")) - {""}

    def finish_rejoin(self, member: str) -> None:
        self._client.hdel(REJOIN_KEY, member)

    def cell_fields(
        self, topic: str, partition: int, plan: MetricPlan
    ) -> dict[str, tuple[int, set[bytes]]]:
        """Every sub-cell of a metric version in one partition: key -> (start_ms, its fields)."""
        keys = self._scan(cell_pattern(topic, plan.name, plan.version, partition))
        pipe = self._client.pipeline(transaction=False)
        for key in keys:
            pipe.hkeys(key)
        answers = pipe.execute() if keys else []
        return {
            key: (cell_of_key(key)[0], set(fields))
            for key, fields in zip(keys, answers, strict=True)
        }

    def rebuild_until(self, member: str) -> int | None:
        raw = self._client.hget(REBUILD_UNTIL_KEY, member)
        return None if raw is None else int(raw)

    def finish_rebuild(self, member: str) -> None:
        pipe = self._client.pipeline(transaction=True)
        pipe.srem(REBUILDING_KEY, member)
        pipe.hdel(REBUILD_UNTIL_KEY, member)
        pipe.execute()

    def report_stall(self, member: str, stall: PartitionStall) -> None:
        """Record that `<topic>:<partition>` member's batches keep failing."""
        pipe = self._client.pipeline(transaction=True)
        pipe.hset(STALLED_KEY, member, stall.encode())
        pipe.expire(STALLED_KEY, self._ttl)
        pipe.execute()

    def clear_stall(self, member: str) -> None:
        self._client.hdel(STALLED_KEY, member)

    def partition_keys(self, topic: str, partition: int, plans: Sequence[MetricPlan]) -> list[str]:
        """Every key a partition's state lives in: its fence, de-dup id sets, the sub-cells
        of the given metric versions and their sessions' indexes and events (what a rebuild
        under new definitions drops)."""
        keys = [fence_key(topic, partition), *self._scan(ids_pattern(topic, partition))]
        for plan in plans:
            keys += self._scan(cell_pattern(topic, plan.name, plan.version, partition))
            if plan.holds_sessions:
                keys.append(sessions_key(topic, partition, plan.name, plan.version))
                keys += self.session_strings(topic, partition, plan)
        return keys

    def session_strings(self, topic: str, partition: int, plan: MetricPlan) -> list[str]:
        """The strings of a session metric version's held sessions on one partition."""
        return self._scan(session_events_pattern(topic, partition, plan.name, plan.version))

    def sub_cells(self, plan: MetricPlan) -> list[tuple[str, int, int]]:
        """(key, start_ms, partition) of every sub-cell of a metric version."""
        pattern = cell_pattern(plan.source.topic, plan.name, plan.version)
        return [(k, *cell_of_key(k)) for k in self._scan(pattern)]

    def id_sets(self, topic: str) -> list[tuple[str, int, int]]:
        """(key, partition, bucket_ms) of every de-dup id set of a source topic."""
        return [(k, *ids_of_key(k)) for k in self._scan(ids_pattern(topic))]

    def delete_keys(self, keys: Sequence[str]) -> int:
        """Unlinks the keys, 500 per call (a cluster client splits each call by slot)."""
        deleted = 0
        for i in range(0, len(keys), 500):
            deleted += int(self._client.unlink(*keys[i : i + 500]))
        return deleted

    def _scan(self, pattern: str) -> list[str]:
        return [
            k.decode() if isinstance(k, bytes) else str(k)
            for k in self._client.scan_iter(match=pattern, count=1000)
        ]


def _script(name: str) -> str:
    """A Lua script kept beside this module."""
    return (Path(__file__).parent / name).read_text()
