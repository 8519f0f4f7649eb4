"""The Redis key scheme: readers that build sub-cell names from a prefix (the serving layer's
read script) must name exactly the keys the speed layer writes."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from shared.speed_view.keys import cell_key, cell_key_prefix

names = st.text(st.characters(blacklist_categories=("Cs",)), min_size=1, max_size=20)


@given(names, names, st.integers(-(2**53), 2**53), st.integers(0, 1000))
def test_cell_key_is_its_prefix_then_start_and_partition(
    metric: str, version: str, start_ms: int, partition: int
) -> None:
    expected = cell_key(metric, version, start_ms, partition)
    assert cell_key_prefix(metric, version) + f"{start_ms}:{partition}" == expected
