"""The fenced Lua apply against a real Redis: compare-and-set, a lost fence, big batches."""

from __future__ import annotations

from dataclasses import replace

import pytest

from shared.speed_view import (
    APPLIED,
    EPOCH_LOST,
    FENCE_MOVED,
    ApplyBatch,
    Fence,
    SpeedViewWriter,
    cell_key,
    fence_key,
    ids_key,
    redis_client,
)
from tests.conftest import Platform

pytestmark = [pytest.mark.services, pytest.mark.timeout(60)]


def test_apply_compares_and_sets_the_fence(platform: Platform) -> None:
    client = redis_client(platform.settings.redis)
    store = SpeedViewWriter(client, 7 * 86_400)
    topic = platform.settings.sources[0].topic
    ids = [f"id-{i}" for i in range(5000)]
    cell = cell_key(topic, 0, "m", "v", 0)
    cells = {cell: {f"k{i}".encode(): b"state" for i in range(3000)}}
    batch = ApplyBatch(cells, {ids_key(topic, 0, 0): ids})

    first = Fence(41, None, "defs")
    assert store.apply(topic, 0, Fence(None, None), first, batch) == APPLIED
    assert store.read_fence(topic, 0) == first
    assert client.scard(ids_key(topic, 0, 0)) == 5000
    assert client.hlen(cell) == 3000
    assert all(store.known_ids({ids_key(topic, 0, 0): ids[:10]})[ids_key(topic, 0, 0)])

    second = Fence(50, 1_000, "defs")
    assert store.apply(topic, 0, Fence(40, None), second, ApplyBatch()) == FENCE_MOVED
    assert store.apply(topic, 0, Fence(None, None), second, ApplyBatch()) == FENCE_MOVED
    assert store.apply(topic, 0, first, second, ApplyBatch()) == APPLIED
    assert store.read_fence(topic, 0) == second

    client.delete(fence_key(topic, 0))  # the partition's slot lost its data
    assert store.apply(topic, 0, second, Fence(60, 1, "d"), batch) == EPOCH_LOST
    assert store.read_fence(topic, 0) == Fence(None, None)
    assert store.apply(topic, 0, Fence(None, None), Fence(60, 1, "d"), ApplyBatch()) == APPLIED
    assert store.read_fence(topic, 0) == Fence(60, 1, "d")


def test_the_scans_find_a_rollups_sub_cells_by_their_literal_name(platform: Platform) -> None:
    """Cleanup, rebuild and the rejoin find sub-cells by a SCAN pattern; a rollup's name holds
    brackets, a character class in Redis's glob: `views[c]` must not match `viewsc` and must
    match itself (unescaped, it matched neither way round)."""
    client = redis_client(platform.settings.redis)
    store = SpeedViewWriter(client, 86_400)
    plan = next(iter(platform.settings.plans.values()))
    rollup = replace(plan, name=f"{plan.name}[c]")
    topic = plan.source.topic
    mine = cell_key(topic, 1, rollup.name, plan.version, 60_000)
    other = cell_key(topic, 1, f"{plan.name}c", plan.version, 60_000)
    client.hset(mine, "k", "s")
    client.hset(other, "k", "s")
    assert store.sub_cells(rollup) == [(mine, 60_000, 1)]
    assert mine in store.partition_keys(topic, 1, [rollup])
    assert other not in store.partition_keys(topic, 1, [rollup])
