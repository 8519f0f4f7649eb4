"""The serving layer's reader of the speed view (asyncio): status, one key's sub-cell states
in one Lua call, and every key's states or names over a range of base cells, pipelined. A
short circuit breaker turns a Redis failure into batch-only answers (rule 9: `unavailable`,
never a 5xx). Key names come from `keys`; states are the aggregation registry's bytes."""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import redis
import redis.asyncio as aioredis

from shared.speed_view.keys import EPOCH_KEY, REBUILDING_KEY, cell_key, cell_key_prefix


def speed_status_of(has_epoch: Any, rebuilding: Any) -> str:
    """ok, or rebuilding when Redis lost its data (no epoch marker) or a rebuild runs."""
    return "ok" if has_epoch and not rebuilding else "rebuilding"


def speed_status(client: redis.Redis) -> str:
    """The speed view's status read with a blocking client (for the operator routes)."""
    try:
        pipe = client.pipeline(transaction=False)
        pipe.exists(EPOCH_KEY)
        pipe.scard(REBUILDING_KEY)
        return speed_status_of(*pipe.execute())
    except redis.RedisError:
        return "unavailable"


class SpeedViewReader:
    """Reads from Redis (asyncio) with a short circuit breaker: once Redis failed, requests
    answer batch-only (`unavailable`) for `cooldown_s` instead of each waiting for a timeout."""

    def __init__(self, client: aioredis.Redis, cooldown_s: float = 2.0) -> None:
        self.client = client
        self._script = client.register_script(_script("read_key.lua"))
        self._cooldown = cooldown_s
        self._down_until = 0.0

    def _available(self) -> bool:
        return time.monotonic() >= self._down_until

    def _failed(self) -> None:
        self._down_until = time.monotonic() + self._cooldown

    async def status(self) -> str:
        """ok, rebuilding (Redis lost its data or a rebuild runs), or unavailable."""
        if not self._available():
            return "unavailable"
        try:
            pipe = self.client.pipeline(transaction=False)
            pipe.exists(EPOCH_KEY)
            pipe.scard(REBUILDING_KEY)
            has_epoch, rebuilding = await pipe.execute()
        except redis.RedisError:
            self._failed()
            return "unavailable"
        return speed_status_of(has_epoch, rebuilding)

    async def read_key(
        self,
        metric: str,
        version: str,
        starts: Sequence[int],
        base_ms: int,
        partitions: int,
        key: bytes,
    ) -> tuple[str, dict[int, list[bytes]]]:
        """Status and one key's sub-cell states per base cell start (each a multiple of
        `base_ms`), in one call."""
        if not self._available():
            return "unavailable", {}
        args: list[Any] = [cell_key_prefix(metric, version), key, partitions, base_ms]
        args.extend(n for run in runs_of(starts, base_ms) for n in run)
        try:
            reply = await self._script(keys=[EPOCH_KEY, REBUILDING_KEY], args=args)
        except redis.RedisError:
            self._failed()
            return "unavailable", {}
        states: dict[int, list[bytes]] = {}
        values = iter(reply[2:])
        for start in starts:
            found = [v for v in (next(values) for _ in range(partitions)) if v is not None]
            if found:
                states[start] = found
        return speed_status_of(reply[0], reply[1]), states

    async def _each_sub_cell(
        self, command: str, metric: str, version: str, starts: Sequence[int], partitions: int
    ) -> tuple[str, list[Any]]:
        """Status and the replies of `command` (a Redis hash command) on every sub-cell of
        the given base cells, pipelined in one round trip."""
        status = await self.status()
        if status == "unavailable" or not starts:
            return status, []
        pipe = self.client.pipeline(transaction=False)
        for start in starts:
            for partition in range(partitions):
                getattr(pipe, command)(cell_key(metric, version, start, partition))
        try:
            return status, await pipe.execute()
        except redis.RedisError:
            self._failed()
            return "unavailable", []

    async def read_all(
        self, metric: str, version: str, starts: Sequence[int], partitions: int
    ) -> tuple[str, dict[bytes, list[bytes]]]:
        """Status and every key's sub-cell states over the given base cells."""
        status, by_start = await self.read_all_by_start(metric, version, starts, partitions)
        by_key: dict[bytes, list[bytes]] = {}
        for cell in by_start.values():
            for encoded, states in cell.items():
                by_key.setdefault(encoded, []).extend(states)
        return status, by_key

    async def read_all_by_start(
        self, metric: str, version: str, starts: Sequence[int], partitions: int
    ) -> tuple[str, dict[int, dict[bytes, list[bytes]]]]:
        """Status and, per base cell start, every key's sub-cell states."""
        status, replies = await self._each_sub_cell("hgetall", metric, version, starts, partitions)
        by_start: dict[int, dict[bytes, list[bytes]]] = {}
        for n, reply in enumerate(replies):
            if reply:
                cell = by_start.setdefault(starts[n // partitions], {})
                for encoded, state in reply.items():
                    cell.setdefault(encoded, []).append(state)
        return status, by_start

    async def read_fields(
        self, metric: str, version: str, starts: Sequence[int], partitions: int
    ) -> tuple[str, set[bytes]]:
        """Status and the encoded keys present in the given base cells."""
        status, replies = await self._each_sub_cell("hkeys", metric, version, starts, partitions)
        return status, {name for reply in replies for name in reply}


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
