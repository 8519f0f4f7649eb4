"""The serving layer's reader of the speed view (asyncio): status, one key's sub-cell states
in one round trip, and every key's states or names over a range of base cells, pipelined. A
short circuit breaker turns a Redis failure into batch-only answers (rule 9: `unavailable`,
never a 5xx). Key names come from `keys`; states are the aggregation registry's bytes. On a
Redis Cluster the pipelines fan out to the masters holding each partition's slot."""

from __future__ import annotations

import asyncio
import hashlib
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import redis.exceptions
from redis.asyncio.cluster import RedisCluster as AsyncRedisCluster

from shared.metric_plan import MetricPlan
from shared.speed_view.client import REDIS_FAILURES, AsyncRedis, SyncRedis
from shared.speed_view.held import DURATIONS_PREFIX
from shared.speed_view.keys import (
    EPOCH_KEY,
    REBUILDING_KEY,
    STALLED_KEY,
    PartitionStall,
    cell_key,
    cell_key_prefix,
    fence_key,
    sessions_key,
)


def speed_status_of(has_epoch: Any, rebuilding: Any) -> str:
    """ok, or rebuilding when Redis lost its data (no epoch marker) or a rebuild runs."""
    return "ok" if has_epoch and not rebuilding else "rebuilding"


def speed_status(client: SyncRedis) -> str:
    """The speed view's status read with a blocking client (for the operator routes)."""
    try:
        pipe = client.pipeline(transaction=False)
        _queue_status(pipe)
        return speed_status_of(*pipe.execute())
    except REDIS_FAILURES:
        return "unavailable"


def stalled_partitions(client: SyncRedis) -> dict[str, PartitionStall]:
    """`<topic>:<partition>` -> why its batches keep failing (empty when none do); raises
    `REDIS_FAILURES` (Redis down is reported as `unavailable` by the caller)."""
    entries: dict[bytes, bytes] = client.hgetall(STALLED_KEY)  # type: ignore[assignment]
    return {k.decode(): PartitionStall.decode(v) for k, v in entries.items()}


class SpeedViewReader:
    """Reads from Redis (asyncio) with a short circuit breaker: once Redis failed, requests
    answer batch-only (`unavailable`) for `cooldown_s` instead of each waiting for a timeout."""

    def __init__(self, client: AsyncRedis, cooldown_s: float = 2.0) -> None:
        self.client = client
        self._read_key = _script("read_key.lua")
        self._read_key_sha = hashlib.sha1(self._read_key.encode()).hexdigest()
        self._one_slot_per_partition = isinstance(client, AsyncRedisCluster)
        self._cooldown = cooldown_s
        self._down_until = 0.0

    def _available(self) -> bool:
        return time.monotonic() >= self._down_until

    def _failed(self) -> None:
        self._down_until = time.monotonic() + self._cooldown

    async def _pipelined(
        self, queue: Callable[[Any], None] | None, scripts: Sequence[Sequence[Any]] = ()
    ) -> list[Any] | None:
        """The replies of the commands `queue` puts in one pipeline, then of the read script
        called with each of `scripts` (EVALSHA's arguments after the sha); None when Redis
        failed (the breaker opens). The scripts are sent beside the pipeline, concurrently
        (a cluster pipeline refuses scripts; only a cluster's reads queue both). Without
        `queue`, each script is sent alone, as one command (one key's read on one server). A
        script Redis forgot (restart, failover) is loaded once more."""
        for attempt in (1, 2):
            try:
                return await self._send(queue, scripts)
            except redis.exceptions.NoScriptError:
                if attempt == 2:
                    break
                try:
                    await self.client.script_load(self._read_key)
                except REDIS_FAILURES:
                    break
            except REDIS_FAILURES:
                break
        self._failed()
        return None

    async def _send(
        self, queue: Callable[[Any], None] | None, scripts: Sequence[Sequence[Any]]
    ) -> list[Any]:
        sha = self._read_key_sha
        if queue is None:
            return [await self.client.evalsha(sha, *args) for args in scripts]
        pipe = self.client.pipeline(transaction=False)
        queue(pipe)
        sent = [self.client.evalsha(sha, *args) for args in scripts]
        piped, *scripted = await asyncio.gather(pipe.execute(), *sent)
        return [*piped, *scripted]

    async def status(self) -> str:
        """ok, rebuilding (Redis lost its data or a rebuild runs), or unavailable."""
        if not self._available():
            return "unavailable"
        replies = await self._pipelined(_queue_status)
        return "unavailable" if replies is None else speed_status_of(*replies)

    def _partition_groups(self, partitions: int) -> list[list[int]]:
        """The partitions one read script may visit together: all of them on one server, each
        alone on a cluster (a script stays in one slot)."""
        if self._one_slot_per_partition:
            return [[p] for p in range(partitions)]
        return [list(range(partitions))]

    async def read_key(
        self, plan: MetricPlan, starts: Sequence[int], key: bytes
    ) -> tuple[str, dict[int, list[bytes]]]:
        """Status and one key's sub-cell states per base cell start (each a multiple of the
        plan's base window), in one round trip: on one server, one script call that also
        reads the status (`read_key.lua`)."""
        if not self._available():
            return "unavailable", {}
        topic, base = plan.source.topic, plan.base_window_ms
        groups = self._partition_groups(plan.source.partitions)
        runs = [n for run in runs_of(starts, base) for n in run]
        status_keys = () if self._one_slot_per_partition else STATUS_KEYS  # one group then
        scripts = []
        for group in groups:
            prefixes = [cell_key_prefix(topic, p, plan.name, plan.version) for p in group]
            fences = [fence_key(topic, p) for p in group]
            keys = [*status_keys, *fences]
            scripts.append(
                [len(keys), *keys, len(status_keys), key, base, len(prefixes), *prefixes, *runs]
            )
        replies = await self._pipelined(None if status_keys else _queue_status, scripts)
        if replies is None:
            return "unavailable", {}
        if status_keys:
            (has_epoch, rebuilding, *cells), *others = replies
            by_group = [cells, *others]
        else:
            has_epoch, rebuilding, *by_group = replies
        states: dict[int, list[bytes]] = {}
        for cells in by_group:
            for start, found in zip(starts, cells, strict=True):
                if found:
                    held = states.get(start)
                    if held is None:
                        states[start] = found
                    else:
                        held.extend(found)
        return speed_status_of(has_epoch, rebuilding), states

    async def _each_sub_cell(
        self, command: str, plan: MetricPlan, starts: Sequence[int]
    ) -> tuple[str, list[Any]]:
        """Status and the replies of `command` (a Redis hash command) on every sub-cell of
        the given base cells (start-major, then partition), pipelined in one round trip."""
        status = await self.status()
        if status == "unavailable" or not starts:
            return status, []
        topic, partitions = plan.source.topic, plan.source.partitions

        def queue(pipe: Any) -> None:
            for start in starts:
                for partition in range(partitions):
                    name = cell_key(topic, partition, plan.name, plan.version, start)
                    getattr(pipe, command)(name)

        replies = await self._pipelined(queue)
        return ("unavailable", []) if replies is None else (status, replies)

    async def read_all(
        self, plan: MetricPlan, starts: Sequence[int]
    ) -> tuple[str, dict[bytes, list[bytes]]]:
        """Status and every key's sub-cell states over the given base cells."""
        status, by_start = await self.read_all_by_start(plan, starts)
        by_key: dict[bytes, list[bytes]] = {}
        for cell in by_start.values():
            for encoded, states in cell.items():
                by_key.setdefault(encoded, []).extend(states)
        return status, by_key

    async def read_all_by_start(
        self, plan: MetricPlan, starts: Sequence[int]
    ) -> tuple[str, dict[int, dict[bytes, list[bytes]]]]:
        """Status and, per base cell start, every key's sub-cell states."""
        status, replies = await self._each_sub_cell("hgetall", plan, starts)
        partitions = plan.source.partitions
        by_start: dict[int, dict[bytes, list[bytes]]] = {}
        for n, reply in enumerate(replies):
            if reply:
                cell = by_start.setdefault(starts[n // partitions], {})
                for encoded, state in reply.items():
                    if not encoded.startswith(DURATIONS_PREFIX):
                        cell.setdefault(encoded, []).append(state)
        return status, by_start

    async def read_held(self, plan: MetricPlan, key: bytes) -> tuple[str, list[bytes]]:
        """Status and one key's session index of a session metric on every partition holding
        one (`held.KeyIndex`), in one round trip."""
        if not self._available():
            return "unavailable", []
        topic, partitions = plan.source.topic, plan.source.partitions

        def queue(pipe: Any) -> None:
            _queue_status(pipe)
            for partition in range(partitions):
                pipe.hget(sessions_key(topic, partition, plan.name, plan.version), key)

        replies = await self._pipelined(queue)
        if replies is None:
            return "unavailable", []
        return speed_status_of(replies[0], replies[1]), [r for r in replies[2:] if r is not None]

    async def read_fields(self, plan: MetricPlan, starts: Sequence[int]) -> tuple[str, set[bytes]]:
        """Status and the encoded keys present in the given base cells."""
        status, replies = await self._each_sub_cell("hkeys", plan, starts)
        keys = {name for reply in replies for name in reply}
        return status, {k for k in keys if not k.startswith(DURATIONS_PREFIX)}


STATUS_KEYS = (EPOCH_KEY, REBUILDING_KEY)
"""What `speed_status_of` reads: whether the epoch marker exists, how many partitions rebuild."""


def _queue_status(pipe: Any) -> None:
    """The two reads `speed_status_of` takes."""
    pipe.exists(EPOCH_KEY)
    pipe.scard(REBUILDING_KEY)


def runs_of(starts: Sequence[int], step: int) -> list[tuple[int, int]]:
    """`starts` as (first, count) runs of consecutive values `step` apart, in order."""
    runs: list[tuple[int, int]] = []
    for start in starts:
        if runs and runs[-1][0] + runs[-1][1] * step == start:
            runs[-1] = (runs[-1][0], runs[-1][1] + 1)
        else:
            runs.append((start, 1))
    return runs


def _script(name: str) -> str:
    """A Lua script kept beside this module."""
    return (Path(__file__).parent / name).read_text()
