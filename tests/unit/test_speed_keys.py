"""The Redis key scheme: readers that build sub-cell names from a prefix (the serving layer's
read script) must name exactly the keys the speed layer writes, and every key one partition's
apply writes must hash to that partition's Redis Cluster slot."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st
from redis.crc import key_slot

from shared.speed_view.keys import (
    cell_key,
    cell_key_prefix,
    cell_of_key,
    fence_key,
    ids_key,
    ids_of_key,
)
from shared.speed_view.reader import runs_of

names = st.text(st.characters(blacklist_categories=("Cs",)), min_size=1, max_size=20)
topics = st.text("abcXYZ019._-", min_size=1, max_size=20)  # Kafka's topic alphabet
starts = st.integers(-(2**53), 2**53)
partitions = st.integers(0, 1000)


@given(topics, partitions, names, names, starts)
def test_cell_key_is_its_prefix_then_start(
    topic: str, partition: int, metric: str, version: str, start_ms: int
) -> None:
    key = cell_key(topic, partition, metric, version, start_ms)
    assert cell_key_prefix(topic, partition, metric, version) + str(start_ms) == key
    assert cell_of_key(key) == (start_ms, partition)


@given(topics, partitions, names, names, starts)
def test_a_partitions_keys_share_its_slot(
    topic: str, partition: int, metric: str, version: str, start_ms: int
) -> None:
    slot = key_slot(fence_key(topic, partition).encode())
    assert key_slot(cell_key(topic, partition, metric, version, start_ms).encode()) == slot
    assert key_slot(ids_key(topic, partition, start_ms).encode()) == slot
    assert ids_of_key(ids_key(topic, partition, start_ms)) == (partition, start_ms)


@given(st.lists(st.integers(min_value=0, max_value=50), max_size=40))
def test_runs_expand_back_to_the_starts_in_order(cells: list[int]) -> None:
    step = 60_000
    starts = [c * step for c in cells]
    runs = runs_of(starts, step)
    assert [first + n * step for first, count in runs for n in range(count)] == starts
    assert all(count >= 1 for _, count in runs)


def test_a_contiguous_series_is_one_run() -> None:
    assert runs_of(range(0, 3_600_000, 60_000), 60_000) == [(0, 60)]
    assert runs_of([0, 60_000, 180_000], 60_000) == [(0, 2), (180_000, 1)]
