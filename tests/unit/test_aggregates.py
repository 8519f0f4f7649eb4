"""Mergeable aggregate states: count/sum/min/max/avg and DataSketches HLL (lg_k 12)."""

from __future__ import annotations

import itertools
import math
import random
import struct
from collections.abc import Sequence

import datasketches as ds
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shared.aggregates import (
    HLL_LG_K,
    AggState,
    merge_all,
    new_sketch,
    outputs_of,
    sketch_from_bytes,
    union_sketches,
)
from shared.config import MetricConfig, SourceConfig
from shared.metric_plan import compile_plan

RSE = 1.04 / math.sqrt(2**HLL_LG_K)  # ~1.6%: the HLL relative standard error at lg_k 12

Event = tuple[float, tuple[str, str]]

SOURCE = SourceConfig(name="s", topic="s", time_field="ts")
METRIC = compile_plan(
    MetricConfig(
        name="m",
        source="s",
        key=("page",),
        value="lat",
        aggregations=("max", "count", "distinct(user)", "avg", "sum", "min", "distinct(session)"),
        windows=("1m",),
    ),
    SOURCE,
)


def sketch_state(sketch: ds.hll_sketch) -> tuple[str, object]:
    """What a sketch has seen, independent of HLL type and of the HIP accumulator: the coupon
    set while the sketch is exact, else its 2^lg_k registers.

    The *estimate* is not a function of the registers alone: a sketch updated in order uses the
    HIP estimator, a union result the composite one, so two sketches of the same items can
    report estimates ~1% apart. Equality of state is what "merge is exact" means for HLL.
    """
    union = ds.hll_union(HLL_LG_K)
    union.update(sketch)
    blob = union.get_result(ds.tgt_hll_type.HLL_8).serialize_updatable()
    header = blob[0] * 4
    if blob[7] & 3 == 2:  # HLL mode: one byte per register
        return "registers", blob[header : header + 2**HLL_LG_K]
    words = struct.unpack_from(f"<{(len(blob) - header) // 4}I", blob, header)
    return "coupons", frozenset(w for w in words if w)


def build(events: Sequence[Event]) -> AggState:
    state = AggState.empty(2)
    for value, distincts in events:
        state.add(value, distincts)
    return state


def close(a: float, b: float, scale: float) -> bool:
    """Sums agree to 1e-9 relative to the magnitude summed (cancellation can make the sum 0)."""
    return math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-9 * scale + 1e-12)


def assert_same(left: AggState, right: AggState, scale: float) -> None:
    assert left.count == right.count
    assert close(left.total, right.total, scale), (left.total, right.total)
    assert left.minimum == right.minimum
    assert left.maximum == right.maximum
    assert len(left.sketches) == len(right.sketches)
    for a, b in zip(left.sketches, right.sketches, strict=True):
        assert sketch_state(a) == sketch_state(b)
    for a, b in zip(left.distinct_estimates(), right.distinct_estimates(), strict=True):
        assert abs(a - b) <= 3 * RSE * max(a, b), (a, b)


# --------------------------------------------------------------------------- strategies


@st.composite
def event_lists(draw: st.DrawFn, max_size: int = 3000) -> list[Event]:
    """Events with a few, hundreds or thousands of distinct users (LIST, SET and HLL modes)."""
    n = draw(st.integers(0, max_size))
    users = draw(st.sampled_from([3, 50, 400, 5000]))
    rng = random.Random(draw(st.integers(0, 2**32)))
    values = st.floats(-1e6, 1e6, allow_nan=False) | st.integers(-1000, 1000).map(float)
    head = draw(st.lists(values, max_size=5))
    return [
        (
            head[i] if i < len(head) else rng.uniform(-1e3, 1e3),
            (f"u{rng.randrange(users)}", f"s{rng.randrange(users * 2)}"),
        )
        for i in range(n)
    ]


def scale_of(*groups: Sequence[Event]) -> float:
    return sum(abs(v) for events in groups for v, _ in events)


# --------------------------------------------------------------------------- basics


def test_add_folds_count_sum_min_max_and_distincts() -> None:
    state = build([(3.0, ("a", "x")), (-1.5, ("b", "x")), (10.0, ("a", "y"))])
    assert state.count == 3
    assert state.total == 11.5
    assert state.minimum == -1.5
    assert state.maximum == 10.0
    assert [round(e) for e in state.distinct_estimates()] == [2, 2]


def test_empty_state() -> None:
    state = AggState.empty(2)
    assert state.count == 0
    assert state.total == 0.0
    assert state.distinct_estimates() == [0.0, 0.0]
    assert AggState.empty(0).sketches == []


def test_count_only_events_have_no_value() -> None:
    state = AggState.empty(0)
    state.add(None, ())
    state.add(None, ())
    assert state.count == 2
    assert state.total == 0.0
    assert state.minimum == math.inf
    assert state.maximum == -math.inf


def test_add_needs_one_item_per_sketch() -> None:
    with pytest.raises(ValueError):
        AggState.empty(2).add(1.0, ["only one"])


def test_merge_does_not_modify_its_inputs() -> None:
    a = build([(1.0, ("a", "x"))])
    b = build([(2.0, ("b", "y"))])
    before = (a.to_bytes(), b.to_bytes())
    merged = a.merge(b)
    assert (a.to_bytes(), b.to_bytes()) == before
    assert (merged.count, merged.total, merged.minimum, merged.maximum) == (2, 3.0, 1.0, 2.0)
    assert [round(e) for e in merged.distinct_estimates()] == [2, 2]


@pytest.mark.parametrize("n", [0, 1, 7, 100, 3000])
def test_bytes_round_trip(n: int) -> None:
    rng = random.Random(n)
    state = build([(rng.uniform(-5, 5), (f"u{i}", f"s{i % 7}")) for i in range(n)])
    back = AggState.from_bytes(state.to_bytes())
    assert back.count == state.count
    assert back.total == state.total
    assert back.minimum == state.minimum
    assert back.maximum == state.maximum
    assert back.distinct_estimates() == state.distinct_estimates()
    assert [sketch_state(s) for s in back.sketches] == [sketch_state(s) for s in state.sketches]


def test_round_trip_of_a_state_without_sketches() -> None:
    state = AggState(4, 10.25, -1.0, 8.0)
    back = AggState.from_bytes(state.to_bytes())
    assert (back.count, back.total, back.minimum, back.maximum) == (4, 10.25, -1.0, 8.0)
    assert back.sketches == []


def test_merge_all() -> None:
    assert merge_all([]) is None
    single = build([(1.0, ("a", "b"))])
    only = merge_all([single])
    assert only is not None
    assert only.count == 1
    total = merge_all([build([(1.0, ("a", "b"))]), AggState.empty(2), build([(5.0, ("c", "b"))])])
    assert total is not None
    assert (total.count, total.total, total.minimum, total.maximum) == (2, 6.0, 1.0, 5.0)
    assert [round(e) for e in total.distinct_estimates()] == [2, 1]


# --------------------------------------------------------------------------- properties


@settings(max_examples=60, deadline=None)
@given(a=event_lists(), b=event_lists(), c=event_lists())
def test_merge_is_associative_and_commutative(
    a: list[Event], b: list[Event], c: list[Event]
) -> None:
    sa, sb, sc = build(a), build(b), build(c)
    scale = scale_of(a, b, c)
    assert_same(sa.merge(sb), sb.merge(sa), scale)
    assert_same(sa.merge(sb).merge(sc), sa.merge(sb.merge(sc)), scale)
    assert_same(sa.merge(sb).merge(sc), sc.merge(sa).merge(sb), scale)


@settings(max_examples=60, deadline=None)
@given(events=event_lists(max_size=6000), cuts=st.lists(st.floats(0, 1), max_size=6))
def test_merged_cells_equal_the_aggregate_over_all_events(
    events: list[Event], cuts: list[float]
) -> None:
    bounds = sorted({0, len(events), *(int(c * len(events)) for c in cuts)})
    parts = [events[lo:hi] for lo, hi in itertools.pairwise(bounds)] or [[]]
    direct = build(events)
    states = [build(part) for part in parts]
    merged = states[0]
    for state in states[1:]:
        merged = merged.merge(state)
    scale = scale_of(events)
    assert_same(merged, direct, scale)
    assert merged.count == len(events)
    assert close(merged.total, math.fsum(v for v, _ in events), scale)
    if events:
        assert merged.minimum == min(v for v, _ in events)
        assert merged.maximum == max(v for v, _ in events)
    at_once = merge_all(states)
    assert at_once is not None
    assert_same(at_once, merged, scale)
    assert_same(AggState.from_bytes(merged.to_bytes()), direct, scale)


@settings(max_examples=100, deadline=None)
@given(st.lists(st.integers(0, 30), max_size=40))
def test_small_distinct_counts_are_exact(users: list[int]) -> None:
    half = len(users) // 2
    left = build([(1.0, (f"u{u}", "s")) for u in users[:half]])
    right = build([(1.0, (f"u{u}", "s")) for u in users[half:]])
    merged = left.merge(right)
    assert round(merged.distinct_estimates()[0]) == len(set(users))
    assert merged.outputs(METRIC)["distinct_user"] == len(set(users))


# --------------------------------------------------------------------------- sketches


def test_distinct_estimate_is_within_three_standard_errors() -> None:
    state = AggState.empty(1)
    for i in range(10_000):
        state.add(1.0, [f"user-{i}"])
    for i in range(10_000):
        state.add(1.0, [f"user-{i}"])  # repeats do not count
    (estimate,) = state.distinct_estimates()
    assert abs(estimate - 10_000) <= 3 * RSE * 10_000, estimate


def test_a_merged_estimate_is_within_three_standard_errors() -> None:
    parts = [AggState.empty(1) for _ in range(10)]
    for i in range(10_000):
        parts[i % 10].add(1.0, [f"user-{i}"])
        parts[(i + 3) % 10].add(1.0, [f"user-{i}"])
    merged = merge_all(parts)
    assert merged is not None
    (estimate,) = merged.distinct_estimates()
    assert abs(estimate - 10_000) <= 3 * RSE * 10_000, estimate


def test_sketches_are_datasketches_hll4_lg_k_12() -> None:
    sketch = new_sketch()
    assert sketch.lg_config_k == 12
    assert sketch.tgt_type == ds.tgt_hll_type.HLL_4


def test_an_hll8_sketch_from_bytes_unions_with_ours() -> None:
    """Spark's `hll_sketch_agg` emits HLL_8; the same strings hash the same on both sides."""
    theirs = ds.hll_sketch(HLL_LG_K, ds.tgt_hll_type.HLL_8)
    for i in range(6_000):
        theirs.update(f"user-{i}")
    ours = AggState.empty(1)
    for i in range(3_000, 9_000):
        ours.add(1.0, [f"user-{i}"])
    read = sketch_from_bytes(theirs.serialize_compact())
    assert read.tgt_type == ds.tgt_hll_type.HLL_8
    batch = AggState(6_000, 0.0, 0.0, 0.0, [read])
    union_estimate = ours.merge(batch).distinct_estimates()[0]
    assert abs(union_estimate - 9_000) <= 3 * RSE * 9_000, union_estimate

    same_items = AggState.empty(1)
    for i in range(6_000):
        same_items.add(1.0, [f"user-{i}"])
    assert sketch_state(read) == sketch_state(same_items.sketches[0])
    assert sketch_state(union_sketches([read, same_items.sketches[0]])) == sketch_state(read)


def test_from_bytes_reads_a_state_holding_an_hll8_sketch() -> None:
    theirs = ds.hll_sketch(HLL_LG_K, ds.tgt_hll_type.HLL_8)
    for i in range(500):
        theirs.update(str(i))
    blob = AggState(500, 1.0, 1.0, 1.0, [theirs]).to_bytes()
    back = AggState.from_bytes(blob)
    ours = AggState.empty(1)
    for i in range(250, 750):
        ours.add(None, [str(i)])
    merged = back.merge(ours)
    assert merged.count == 1000
    assert abs(merged.distinct_estimates()[0] - 750) <= 3 * RSE * 750


def test_union_sketches_of_nothing_is_empty() -> None:
    assert union_sketches([]).is_empty()


# --------------------------------------------------------------------------- outputs


def test_outputs_are_exactly_the_configured_names_in_order() -> None:
    state = AggState.empty(2)
    state.add(2.0, ["a", "x"])
    state.add(4.0, ["b", "x"])
    state.add(9.0, ["a", "y"])
    out = state.outputs(METRIC)
    assert list(out) == ["max", "count", "distinct_user", "avg", "sum", "min", "distinct_session"]
    assert out == {
        "max": 9.0,
        "count": 3,
        "distinct_user": 2,
        "avg": 5.0,
        "sum": 15.0,
        "min": 2.0,
        "distinct_session": 2,
    }
    assert type(out["distinct_user"]) is int


def test_outputs_of_a_count_only_metric() -> None:
    metric = compile_plan(MetricConfig(name="c", source="s", windows=("1m",)), SOURCE)
    state = AggState.empty(0)
    state.add(None, ())
    assert state.outputs(metric) == {"count": 1}


def test_outputs_of_an_empty_state() -> None:
    out = AggState.empty(2).outputs(METRIC)
    assert out["count"] == 0
    assert out["sum"] == 0.0
    assert out["min"] is None
    assert out["max"] is None
    assert out["avg"] is None
    assert out["distinct_user"] == 0


def test_outputs_of_plain_columns() -> None:
    out = outputs_of(METRIC, 4, 10.0, -2.0, 7.5, [3.4, 1.6])
    assert out == {
        "max": 7.5,
        "count": 4,
        "distinct_user": 3,
        "avg": 2.5,
        "sum": 10.0,
        "min": -2.0,
        "distinct_session": 2,
    }
    empty = outputs_of(METRIC, 0, 0.0, math.inf, -math.inf, [0.0, 0.0])
    assert (empty["min"], empty["max"], empty["avg"]) == (None, None, None)
