"""The Redis key scheme: readers that build sub-cell names from a prefix (the serving layer's
read script) must name exactly the keys the speed layer writes."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from shared.speed_view.keys import cell_key, cell_key_prefix
from shared.speed_view.reader import runs_of

names = st.text(st.characters(blacklist_categories=("Cs",)), min_size=1, max_size=20)


@given(names, names, st.integers(-(2**53), 2**53), st.integers(0, 1000))
def test_cell_key_is_its_prefix_then_start_and_partition(
    metric: str, version: str, start_ms: int, partition: int
) -> None:
    expected = cell_key(metric, version, start_ms, partition)
    assert cell_key_prefix(metric, version) + f"{start_ms}:{partition}" == expected


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
