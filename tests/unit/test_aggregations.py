"""The aggregation registry (`shared.aggregations`): cell states, their codec and merge,
DataSketches HLL (lg_k 12) and KLL (k 200) sketches, rendering and ranking.

A state is built the way the speed layer builds one, with `fold_inputs`. "Same state" means:
equal count, min and max, sums equal to rounding, HLL sketches with the same coupons or
registers (and the same estimate), and KLL sketches that have seen the same number of items,
the same min and max, and whose quantiles lie within the KLL rank-error bound of the exact
quantiles of the data.
"""

from __future__ import annotations

import itertools
import math
import random
import re
import struct
from bisect import bisect_left, bisect_right
from collections.abc import Sequence
from decimal import Decimal

import datasketches as ds
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shared.aggregations import (
    DEFAULT_RENDER,
    HLL,
    HLL_LG_K,
    KLL,
    KLL_K,
    CellState,
    Distinct,
    Number,
    Plain,
    Quantiles,
    RenderOptions,
    check_aggregations,
    decode_state,
    encode_state,
    fold_inputs,
    merge_states,
    parse_aggregation,
    parse_quantiles,
    quantile_name,
    quantile_of_name,
)
from shared.config import MetricConfig, SourceConfig
from shared.metric_plan import MetricPlan, compile_plan

RSE = 1.04 / math.sqrt(2**HLL_LG_K)  # ~1.6%: the HLL relative standard error at lg_k 12
CHECKED_QUANTILES = (0.01, 0.25, 0.5, 0.9, 0.99)

Event = tuple[float, str, str]
"""One event's `lat` (the value), `user` and `session` fields."""
FIELDS = ("lat", "user", "session")

SOURCE = SourceConfig(name="s", topic="s", time_field="ts")


def plan_of(*aggregations: str, value: str | None = "lat") -> MetricPlan:
    metric = MetricConfig(
        name="m", source="s", key=("page",), value=value, aggregations=aggregations, windows=("1m",)
    )
    return compile_plan(metric, SOURCE)


METRIC = plan_of(
    "max", "count", "distinct(user)", "avg", "quantiles(lat)", "sum", "min", "distinct(session)"
)
"""Sketch slots: 0 distinct(user) (HLL), 1 quantiles(lat) (KLL), 2 distinct(session) (HLL)."""
DISTINCTS = plan_of("max", "count", "distinct(user)", "avg", "sum", "min", "distinct(session)")
QUANTILES = plan_of("count", "quantiles(lat)", value=None)
COUNT_ONLY = plan_of("count", value=None)


# --------------------------------------------------------------------------- helpers


def build(
    events: Sequence[Event], plan: MetricPlan = METRIC, previous: CellState | None = None
) -> CellState:
    """`previous` with `events` folded in under `plan`, each sketch slot fed its field."""
    values = [lat for lat, _, _ in events] if plan.value else None
    items = [[e[FIELDS.index(i.field)] for e in events] for i in plan.sketch_inputs]
    return fold_inputs(plan.kinds, previous, values, items, len(events))


def merge(*states: CellState | None, plan: MetricPlan = METRIC) -> CellState | None:
    return merge_states(plan.kinds, [s for s in states if s is not None])


def render(state: CellState | None, plan: MetricPlan = METRIC) -> dict[str, Number] | None:
    return plan.aggregations.render(state, DEFAULT_RENDER)


def hll_of(items: Sequence[str]) -> bytes:
    """An HLL_8 sketch built by DataSketches directly, as Spark's `hll_sketch_agg` writes it."""
    sketch = ds.hll_sketch(HLL_LG_K, ds.tgt_hll_type.HLL_8)
    for item in items:
        sketch.update(item)
    return bytes(sketch.serialize_compact())


def sketch_state(blob: bytes) -> tuple[str, object]:
    """What an HLL sketch has seen, independent of HLL type and of the HIP accumulator: the
    coupon set while the sketch is exact, else its 2^lg_k registers.

    The *estimate* of a sketch is not a function of the registers alone: a sketch updated in
    order carries the HIP estimator, a union result the composite one, so two sketches of the
    same items can report estimates ~1% apart. Equality of state is what "merge is exact" means
    for HLL.
    """
    union = ds.hll_union(HLL_LG_K)
    union.update(ds.hll_sketch.deserialize(blob))
    serialized = union.get_result(ds.tgt_hll_type.HLL_8).serialize_updatable()
    header = serialized[0] * 4
    if serialized[7] & 3 == 2:  # HLL mode: one byte per register
        return "registers", serialized[header : header + 2**HLL_LG_K]
    words = struct.unpack_from(f"<{(len(serialized) - header) // 4}I", serialized, header)
    return "coupons", frozenset(w for w in words if w)


def close(a: float, b: float, scale: float) -> bool:
    """Sums agree to 1e-9 relative to the magnitude summed (cancellation can make the sum 0)."""
    return math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-9 * scale + 1e-12)


def assert_rank_within(value: float, q: float, ordered: Sequence[float], eps: float) -> None:
    """`value` is a q-quantile of the sorted data `ordered` to within `eps` normalized rank:
    some rank `value` holds in the data (ties span a range) lies within q +- eps."""
    low = bisect_left(ordered, value) / len(ordered)
    high = bisect_right(ordered, value) / len(ordered)
    assert low - eps <= q <= high + eps, (q, value, low, high, eps)


def assert_kll_of(blob: bytes, ordered: Sequence[float]) -> None:
    """The KLL sketch `blob` is a sketch of the sorted data `ordered`."""
    sketch = KLL.sketch([blob])
    assert sketch.n == len(ordered)
    assert (sketch.get_min_value(), sketch.get_max_value()) == (ordered[0], ordered[-1])
    eps = sketch.normalized_rank_error(False)
    for q in CHECKED_QUANTILES:
        assert_rank_within(sketch.get_quantile(q), q, ordered, eps)


def assert_state_of(state: CellState | None, events: Sequence[Event]) -> None:
    """`state` is the state of METRIC over `events` (None when there are none)."""
    if not events:
        assert state is None
        return
    assert state is not None
    ordered = sorted(value for value, _, _ in events)
    assert state.count == len(events)
    scale = math.fsum(abs(v) for v in ordered)
    assert close(state.total, math.fsum(ordered), scale), (state.total, math.fsum(ordered))
    assert (state.minimum, state.maximum) == (ordered[0], ordered[-1])
    direct = build(events)
    assert state.sketches is not None
    assert direct.sketches is not None
    for kind, got, want in zip(METRIC.kinds, state.sketches, direct.sketches, strict=True):
        if kind is KLL:
            assert_kll_of(got, ordered)
        else:
            assert sketch_state(got) == sketch_state(want)
            # one estimator everywhere: the count does not depend on how cells were combined
            assert HLL.summary(got) == HLL.summary(want)


def round_trip(state: CellState) -> CellState:
    return decode_state(encode_state(state))


# --------------------------------------------------------------------------- strategies


@st.composite
def event_lists(draw: st.DrawFn, max_size: int = 3000) -> list[Event]:
    """Events with a few, hundreds or thousands of distinct users (HLL LIST, SET and HLL modes;
    KLL exact and estimating), a few drawn values first (extremes, ties, zeros)."""
    n = draw(st.integers(0, max_size))
    users = draw(st.sampled_from([3, 50, 400, 5000]))
    rng = random.Random(draw(st.integers(0, 2**32)))
    values = st.floats(-1e6, 1e6, allow_nan=False) | st.integers(-1000, 1000).map(float)
    head = draw(st.lists(values, max_size=5))
    return [
        (
            head[i] if i < len(head) else rng.uniform(-1e3, 1e3),
            f"u{rng.randrange(users)}",
            f"s{rng.randrange(users * 2)}",
        )
        for i in range(n)
    ]


# --------------------------------------------------------------------------- fold_inputs


def test_fold_inputs_folds_count_sum_min_max_and_items() -> None:
    state = build([(3.0, "a", "x"), (-1.5, "b", "x"), (10.0, "a", "y")])
    assert (state.count, state.total, state.minimum, state.maximum) == (3, 11.5, -1.5, 10.0)
    assert state.sketches is not None
    users, lats, sessions = state.sketches
    assert (round(HLL.estimate([users])), round(HLL.estimate([sessions]))) == (2, 2)
    assert_kll_of(lats, [-1.5, 3.0, 10.0])


def test_fold_inputs_extends_a_previous_state_without_modifying_it() -> None:
    first = [(1.0, "a", "x"), (2.0, "b", "x")]
    more = [(-4.0, "c", "y"), (8.0, "a", "z")]
    previous = build(first)
    before = encode_state(previous)
    extended = build(more, previous=round_trip(previous))
    assert encode_state(previous) == before
    assert_state_of(extended, first + more)


def test_count_only_events_have_no_value() -> None:
    state = build([(0.0, "a", "x"), (0.0, "b", "y")], COUNT_ONLY)
    assert (state.count, state.total, state.sketches) == (2, 0.0, [])
    assert (state.minimum, state.maximum) == (math.inf, -math.inf)


def test_fold_inputs_needs_items_for_every_sketch_slot() -> None:
    with pytest.raises(ValueError):
        fold_inputs(METRIC.kinds, None, [1.0], [["only one slot"]], 1)


def test_a_state_of_no_events_merges_and_renders_to_none() -> None:
    empty = build([])
    assert (empty.count, empty.total) == (0, 0.0)
    assert merge(empty) is None
    assert render(empty) is None


# --------------------------------------------------------------------------- codec


@pytest.mark.parametrize("n", [0, 1, 7, 100, 3000])
def test_codec_round_trip(n: int) -> None:
    rng = random.Random(n)
    state = build([(rng.uniform(-5, 5), f"u{i}", f"s{i % 7}") for i in range(n)])
    back = round_trip(state)
    assert back == state  # the same columns and the very same sketch bytes
    assert len(back.sketches or []) == 3
    plain = decode_state(encode_state(state), with_sketches=False)
    assert plain.sketches is None
    assert plain == CellState(state.count, state.total, state.minimum, state.maximum, None)


def test_codec_round_trip_of_a_state_without_sketches() -> None:
    assert round_trip(CellState(4, 10.25, -1.0, 8.0, [])) == CellState(4, 10.25, -1.0, 8.0, [])
    count_only = build([(0.0, "a", "x")] * 3, COUNT_ONLY)
    assert round_trip(count_only) == CellState(3, 0.0, math.inf, -math.inf, [])


def test_codec_reads_a_state_holding_spark_hll8_sketch() -> None:
    theirs = CellState(500, 1.0, 1.0, 1.0, [hll_of([str(i) for i in range(500)])])
    ours = fold_inputs((HLL,), None, None, [[str(i) for i in range(250, 750)]], 500)
    merged = merge_states((HLL,), [round_trip(theirs), ours])
    assert merged is not None
    assert merged.count == 1000
    assert merged.sketches is not None
    assert abs(HLL.estimate(merged.sketches) - 750) <= 3 * RSE * 750


# --------------------------------------------------------------------------- merge_states


def test_merge_states() -> None:
    assert merge() is None
    assert merge(build([]), build([])) is None
    single = build([(1.0, "a", "b")])
    single.summaries = [1.0, None, 1.0]
    assert merge(single) is single  # one state as it is, its stored summaries too
    merged = merge(build([(1.0, "a", "b")]), build([]), build([(5.0, "c", "b")]))
    assert merged is not None
    assert (merged.count, merged.total, merged.minimum, merged.maximum) == (2, 6.0, 1.0, 5.0)
    assert merged.summaries is None
    assert merged.sketches is not None
    users, lats, sessions = merged.sketches
    assert (round(HLL.estimate([users])), round(HLL.estimate([sessions]))) == (2, 1)
    assert_kll_of(lats, [1.0, 5.0])


def test_merge_does_not_modify_its_inputs() -> None:
    a, b = build([(1.0, "a", "x")]), build([(2.0, "b", "y")])
    before = (encode_state(a), encode_state(b))
    assert_state_of(merge(a, b), [(1.0, "a", "x"), (2.0, "b", "y")])
    assert (encode_state(a), encode_state(b)) == before


def test_merging_sketches_needs_the_sketch_bytes() -> None:
    stored = [decode_state(encode_state(build([(v, "a", "x")])), False) for v in (1.0, 2.0)]
    with pytest.raises(ValueError, match="sketch bytes"):
        merge(*stored)
    plain = merge_states((), stored)  # a merge of the plain columns alone needs none
    assert plain is not None
    assert (plain.count, plain.total, plain.minimum, plain.maximum) == (2, 3.0, 1.0, 2.0)


@settings(max_examples=60, deadline=None)
@given(a=event_lists(), b=event_lists(), c=event_lists())
def test_merge_is_associative_and_commutative(
    a: list[Event], b: list[Event], c: list[Event]
) -> None:
    sa, sb, sc = build(a), build(b), build(c)
    assert_state_of(merge(sa, sb), a + b)
    assert_state_of(merge(sb, sa), a + b)
    for merged in (merge(merge(sa, sb), sc), merge(sa, merge(sb, sc)), merge(merge(sc, sa), sb)):
        assert_state_of(merged, a + b + c)


@settings(max_examples=60, deadline=None)
@given(events=event_lists(max_size=6000), cuts=st.lists(st.floats(0, 1), max_size=6))
def test_merged_parts_equal_the_state_over_all_events(
    events: list[Event], cuts: list[float]
) -> None:
    bounds = sorted({0, len(events), *(int(c * len(events)) for c in cuts)})
    parts = [events[lo:hi] for lo, hi in itertools.pairwise(bounds)] or [[]]
    states = [build(part) for part in parts]
    one_by_one: CellState | None = None
    folded: CellState | None = None
    for part, state in zip(parts, states, strict=True):
        one_by_one = merge(one_by_one, state)
        folded = build(part, previous=None if folded is None else round_trip(folded))
    at_once = merge(*states)
    assert_state_of(one_by_one, events)
    assert_state_of(at_once, events)
    assert_state_of(None if at_once is None else round_trip(at_once), events)
    assert folded is not None
    assert_state_of(folded if folded.count else None, events)


# --------------------------------------------------------------------------- HLL


@settings(max_examples=100, deadline=None)
@given(st.lists(st.integers(0, 30), min_size=1, max_size=40))
def test_small_distinct_counts_are_exact(users: list[int]) -> None:
    half = len(users) // 2
    left = build([(1.0, f"u{u}", "s") for u in users[:half]])
    right = build([(1.0, f"u{u}", "s") for u in users[half:]])
    out = render(merge(left, right))
    assert out is not None
    assert out["distinct_user"] == len(set(users))


def test_distinct_estimate_is_within_three_standard_errors() -> None:
    users = [f"user-{i}" for i in range(10_000)]
    blob = HLL.add(HLL.add(None, users), users)  # repeats do not count
    estimate = HLL.estimate([blob])
    assert abs(estimate - 10_000) <= 3 * RSE * 10_000, estimate


def test_a_merged_estimate_is_within_three_standard_errors() -> None:
    users = [f"user-{i}" for i in range(10_000)]
    parts = [  # every user in two of the ten parts
        HLL.add(None, [u for i, u in enumerate(users) if part in (i % 10, (i + 3) % 10)])
        for part in range(10)
    ]
    estimate = HLL.estimate([HLL.union(parts)])
    assert abs(estimate - 10_000) <= 3 * RSE * 10_000, estimate
    assert HLL.estimate(parts) == estimate


def test_our_sketches_are_hll4_lg_k_12_and_kll_k_200() -> None:
    for blob in (HLL.add(None, ["a"]), HLL.union([hll_of(["a"]), hll_of(["b"])])):
        sketch = ds.hll_sketch.deserialize(blob)
        assert (sketch.lg_config_k, sketch.tgt_type) == (12, ds.tgt_hll_type.HLL_4)
    assert KLL.sketch([KLL.add(None, [1.0])]).k == KLL_K == 200


def test_the_hll_summary_is_its_estimate_and_kll_has_none() -> None:
    blob = HLL.add(None, [f"u{i}" for i in range(5000)])
    assert HLL.summary(blob) == HLL.estimate([blob])
    assert KLL.summary(KLL.add(None, [1.0, 2.0])) is None


def test_a_spark_hll8_sketch_unions_with_ours() -> None:
    """Spark's `hll_sketch_agg` emits HLL_8; the same strings hash the same on both sides."""
    theirs = hll_of([f"user-{i}" for i in range(6_000)])
    assert ds.hll_sketch.deserialize(theirs).tgt_type == ds.tgt_hll_type.HLL_8
    ours = HLL.add(None, [f"user-{i}" for i in range(3_000, 9_000)])
    union_estimate = HLL.estimate([theirs, ours])
    assert abs(union_estimate - 9_000) <= 3 * RSE * 9_000, union_estimate

    same_items = HLL.add(None, [f"user-{i}" for i in range(6_000)])
    assert sketch_state(theirs) == sketch_state(same_items)
    assert sketch_state(HLL.union([theirs, same_items])) == sketch_state(theirs)


def test_a_union_of_no_hll_sketches_is_empty() -> None:
    assert ds.hll_sketch.deserialize(HLL.union([])).is_empty()


# --------------------------------------------------------------------------- KLL


def test_merged_quantiles_are_within_the_kll_rank_error() -> None:
    rng = random.Random(7)
    values = [rng.lognormvariate(3, 1) for _ in range(100_000)]
    parts = [build([(v, "u", "s") for v in values[i::10]], QUANTILES) for i in range(10)]
    merged = merge(*parts, plan=QUANTILES)
    assert merged is not None
    assert merged.sketches is not None
    eps = KLL.sketch(merged.sketches).normalized_rank_error(False)
    assert eps == pytest.approx(0.0133, abs=5e-4)
    out = render(merged, QUANTILES)
    assert out is not None
    ordered = sorted(values)
    for q in ("0.5", "0.9", "0.99"):
        value = out[quantile_name(Decimal(q))]
        assert isinstance(value, float)
        assert_rank_within(value, float(q), ordered, eps)


def test_a_spark_kll_sketch_unions_with_ours() -> None:
    """Spark's `kll_sketch_agg_double` writes what `kll_doubles_sketch` writes."""
    theirs = ds.kll_doubles_sketch(KLL_K)
    theirs.update(np.arange(0.0, 5_000.0))
    batch = CellState(5_000, 0.0, 0.0, 4_999.0, [bytes(theirs.serialize())])
    speed = build([(float(v), "u", "s") for v in range(5_000, 10_000)], QUANTILES)
    merged = merge(round_trip(batch), speed, plan=QUANTILES)
    assert merged is not None
    assert merged.sketches is not None
    assert_kll_of(merged.sketches[0], [float(v) for v in range(10_000)])


# --------------------------------------------------------------------------- render


def three_events() -> CellState:
    return build([(2.0, "a", "x"), (4.0, "b", "x"), (9.0, "a", "y")])


def test_render_outputs_exactly_the_configured_names_in_order() -> None:
    out = render(three_events())
    assert out == {
        "max": 9.0,
        "count": 3,
        "distinct_user": 2,
        "avg": 5.0,
        "p50": 4.0,
        "p90": 9.0,
        "p99": 9.0,
        "sum": 15.0,
        "min": 2.0,
        "distinct_session": 2,
    }
    assert tuple(out) == METRIC.output_names
    assert type(out["distinct_user"]) is int


def test_render_options_pick_the_quantiles() -> None:
    options = RenderOptions((Decimal("0.999"),))
    out = METRIC.aggregations.render(three_events(), options)
    assert out is not None
    names = ("max", "count", "distinct_user", "avg", "p99.9", "sum", "min", "distinct_session")
    assert tuple(out) == names
    assert METRIC.aggregations.output_names(options) == names
    assert out["p99.9"] == 9.0


def test_render_of_no_events_is_none() -> None:
    assert METRIC.aggregations.render(None, DEFAULT_RENDER) is None
    assert render(build([])) is None


def test_render_of_a_count_only_metric() -> None:
    assert render(build([(0.0, "a", "x")] * 4, COUNT_ONLY), COUNT_ONLY) == {"count": 4}


def test_min_and_max_render_none_when_no_event_carried_a_value() -> None:
    plan = plan_of("count", "min", "max")
    state = fold_inputs(plan.kinds, None, None, [], 2)
    assert render(state, plan) == {"count": 2, "min": None, "max": None}


def test_a_stored_cell_renders_distincts_from_its_summaries() -> None:
    """A batch row read without its sketch bytes: the stored HLL estimates suffice."""
    stored = CellState(4, 10.0, -2.0, 7.5, sketches=None, summaries=[3.4, 1.6])
    assert render(stored, DISTINCTS) == {
        "max": 7.5,
        "count": 4,
        "distinct_user": 3,
        "avg": 2.5,
        "sum": 10.0,
        "min": -2.0,
        "distinct_session": 2,
    }
    with pytest.raises(ValueError, match="sketch bytes"):
        render(CellState(4, 10.0, -2.0, 7.5, None, [3.4, None, 1.6]))


def test_a_missing_summary_falls_back_to_the_sketch() -> None:
    state = build([(1.0, f"u{i}", "s") for i in range(5)], DISTINCTS)
    state.summaries = [None, 1.0]
    out = render(state, DISTINCTS)
    assert out is not None
    assert (out["distinct_user"], out["distinct_session"]) == (5, 1)


def test_needs_sketches() -> None:
    assert METRIC.aggregations.needs_sketches(1)  # no stored summary renders a quantile
    assert not DISTINCTS.aggregations.needs_sketches(1)
    assert DISTINCTS.aggregations.needs_sketches(2)
    assert not COUNT_ONLY.aggregations.needs_sketches(5)


# --------------------------------------------------------------------------- quantile names


@pytest.mark.parametrize(
    ("q", "name"),
    [("0.5", "p50"), ("0.999", "p99.9"), ("0.25", "p25"), ("0.9", "p90"), ("0.01", "p1")],
)
def test_quantile_names(q: str, name: str) -> None:
    assert quantile_name(Decimal(q)) == name
    assert quantile_of_name(name) == Decimal(q)


@pytest.mark.parametrize("name", ["p0", "p100", "p150", "p-5", "pabc", "p", "max", "50"])
def test_names_of_no_quantile(name: str) -> None:
    assert quantile_of_name(name) is None


def test_parse_quantiles_sorts_and_dedups() -> None:
    assert parse_quantiles("0.99,0.5,0.5") == (Decimal("0.5"), Decimal("0.99"))
    assert parse_quantiles(" 0.9 , 0.1") == (Decimal("0.1"), Decimal("0.9"))


@pytest.mark.parametrize("text", ["0", "1", "-0.1", "abc", "nan", "inf", "0.5,", "0.5,2"])
def test_parse_quantiles_refuses(text: str) -> None:
    with pytest.raises(ValueError, match=r"strictly between 0 and 1; send e\.g\. q=0\.5"):
        parse_quantiles(text)


# --------------------------------------------------------------------------- parsing


def test_parse_aggregation() -> None:
    assert parse_aggregation("count") == Plain("count", needs_value=False)
    assert parse_aggregation(" avg ") == Plain("avg")
    distinct = parse_aggregation("distinct( user )")
    assert distinct == Distinct("user")
    assert distinct.spec == "distinct(user)"
    assert parse_aggregation("quantiles(lat)") == Quantiles("lat")


@pytest.mark.parametrize(
    "spec", ["median", "", "distinct()", "distinct(a b)", "quantile(lat)", "Count", "count(x)"]
)
def test_unknown_aggregations_are_refused_naming_the_allowed_ones(spec: str) -> None:
    allowed = "count, sum, min, max, avg, distinct(<field>), quantiles(<field>)"
    with pytest.raises(ValueError, match=re.escape(f"allowed: {allowed}")):
        parse_aggregation(spec)


def test_check_aggregations() -> None:
    check_aggregations([parse_aggregation(s) for s in METRIC.config.aggregations])
    for specs, message in [
        (["count", "count"], "must not repeat"),
        (["distinct(u)", "distinct( u )"], "must not repeat"),
        (["quantiles(a)", "quantiles(b)"], "at most one quantiles"),
    ]:
        with pytest.raises(ValueError, match=message):
            check_aggregations([parse_aggregation(s) for s in specs])


# --------------------------------------------------------------------------- ranking


def only_slot(state: CellState, slot: int) -> CellState:
    """`state` as `top` reads it to rank by one sketch aggregation: its slot alone."""
    assert state.sketches is not None
    return CellState(state.count, state.total, state.minimum, state.maximum, [state.sketches[slot]])


def test_ranking_by_a_quantile() -> None:
    ranking = METRIC.aggregations.ranking("p99")
    assert ranking is not None
    assert (ranking.slot, ranking.options) == (1, RenderOptions((Decimal("0.99"),)))
    rng = random.Random(3)
    parts = [[(rng.uniform(0, 100), "u", "s") for _ in range(60)] for _ in range(3)]
    value = ranking.value([only_slot(build(part), ranking.slot) for part in parts])
    ordered = sorted(v for part in parts for v, _, _ in part)  # 180 values: the sketch is exact
    assert isinstance(value, float)
    assert_rank_within(value, 0.99, ordered, 0.0)
    assert value == ordered[178]
    assert ranking.value([]) is None
    assert ranking.value([build([])]) is None


def test_ranking_by_a_distinct_count_and_a_plain_output() -> None:
    users = METRIC.aggregations.ranking("distinct_session")
    assert users is not None
    assert users.slot == 2
    parts = [build([(1.0, "u", f"s{i % 4 + p}") for i in range(8)]) for p in range(3)]
    assert users.value([only_slot(part, 2) for part in parts]) == 6
    stored = CellState(8, 8.0, 1.0, 1.0, None, [17.2])  # one stored cell: its summary
    assert users.value([stored]) == 17

    ranking = METRIC.aggregations.ranking("sum")
    assert ranking is not None
    assert ranking.slot == -1
    plain = [CellState(p.count, p.total, p.minimum, p.maximum, None) for p in parts]
    assert ranking.value(plain) == 24.0


def test_ranking_by_what_the_metric_does_not_render_is_none() -> None:
    assert METRIC.aggregations.ranking("nope") is None
    assert DISTINCTS.aggregations.ranking("p99") is None
    assert COUNT_ONLY.aggregations.ranking("sum") is None


def test_ranking_needs_sketch() -> None:
    def needs(by: str, plan: MetricPlan, parts: int) -> bool:
        ranking = plan.aggregations.ranking(by)
        assert ranking is not None
        return ranking.needs_sketch(parts)

    assert needs("p99", METRIC, 1)  # KLL: no stored summary
    assert not needs("distinct_user", METRIC, 1)  # the stored HLL estimate is used
    assert needs("distinct_user", METRIC, 2)
    assert not needs("count", METRIC, 2)
