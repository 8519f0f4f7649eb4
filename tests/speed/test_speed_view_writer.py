"""The fenced Lua apply against a real Redis: compare-and-set, a lost fence, big batches."""

from __future__ import annotations

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
