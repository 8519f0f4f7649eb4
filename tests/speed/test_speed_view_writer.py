"""The fenced Lua apply against a real Redis: compare-and-set, epoch check, big batches."""

from __future__ import annotations

import pytest
import redis

from shared.speed_view import (
    APPLIED,
    EPOCH_KEY,
    EPOCH_LOST,
    FENCE_MOVED,
    ApplyBatch,
    Fence,
    SpeedViewWriter,
    cell_key,
    ensure_epoch,
    ids_key,
)
from tests.conftest import Platform

pytestmark = [pytest.mark.services, pytest.mark.timeout(60)]


def test_apply_compares_and_sets_the_fence(platform: Platform) -> None:
    client = redis.Redis.from_url(platform.settings.redis.url)
    store = SpeedViewWriter(client, 7 * 86_400)
    epoch = ensure_epoch(client, "e1")
    topic = platform.settings.sources[0].topic
    ids = [f"id-{i}" for i in range(5000)]
    cells = {cell_key("m", "v", 0, 0): {f"k{i}".encode(): b"state" for i in range(3000)}}
    batch = ApplyBatch(cells, {ids_key(topic, 0, 0): ids})

    first = Fence(41, None, "defs")
    assert store.apply(epoch, topic, 0, Fence(None, None), first, batch) == APPLIED
    assert store.read_fence(topic, 0) == first
    assert client.scard(ids_key(topic, 0, 0)) == 5000
    assert client.hlen(cell_key("m", "v", 0, 0)) == 3000
    assert all(store.known_ids({ids_key(topic, 0, 0): ids[:10]})[ids_key(topic, 0, 0)])

    second = Fence(50, 1_000, "defs")
    assert store.apply(epoch, topic, 0, Fence(40, None), second, ApplyBatch()) == FENCE_MOVED
    assert store.apply(epoch, topic, 0, first, second, ApplyBatch()) == APPLIED
    assert store.read_fence(topic, 0) == second
    assert store.apply("other", topic, 0, second, Fence(60, 1, "d"), ApplyBatch()) == EPOCH_LOST
    client.delete(EPOCH_KEY)
    assert store.apply(epoch, topic, 0, second, Fence(60, 1, "d"), ApplyBatch()) == EPOCH_LOST
    assert store.read_fence(topic, 0) == second
