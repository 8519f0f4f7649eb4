"""A session metric's totals in the speed view (`speed_layer.session_totals`, rule 13 in
docs/semantics.md), without Redis: batches of events in any order, for many keys, go through
`decide` on the in-memory view the rejoin uses, then a run's continuation; after every step each
bucket's total equals its keys' cells merged (and the oracle's total over the events), though
it was kept from the keys' changes and never read back from them but on a re-cut."""

from __future__ import annotations

from collections import Counter
from typing import Any

import orjson
from hypothesis import given, settings
from hypothesis import strategies as st

from shared.aggregations import HLL, KLL, CellState, decode_state, merge_states
from shared.config import Settings
from shared.metric_plan import MetricPlan, rollup_name
from shared.sessions import Session
from shared.speed_view import ApplyBatch, Fence, cell_key, decode_key, encode_key
from shared.speed_view.held import DURATIONS_PREFIX, DurationCounts, KeyIndex, SessionPlans
from speed_layer.processor import RawRecord, SourcePlan, continue_from_seeds, decide
from speed_layer.rejoin import MemoryView
from speed_layer.sessions import SessionSeeds

MINUTE = 60_000
T0 = 1_704_067_200_000
TOPIC = "tot"


def _settings() -> Settings:
    return Settings(
        sources=[{"name": TOPIC, "topic": TOPIC, "time_field": "ts", "partitions": 1}],
        tables=[],
        metrics=[
            {
                "name": "visits",
                "source": TOPIC,
                "key": ["user", "page"],
                "value": "ms",
                "aggregations": ["count", "sum", "min", "max", "distinct(page)"],
                "windows": ["10m", "1h"],
                "rollups": [["user"]],
                "session": {"gap": "5m", "max_duration": "20m"},
                "grace": "1d",
            }
        ],
    )


def _cells(view: MemoryView, plan: MetricPlan) -> dict[tuple[int, tuple[str, ...]], CellState]:
    """(bucket, key) -> state of a plan's cells in the view (partition 0)."""
    prefix = cell_key(TOPIC, 0, plan.name, plan.version, 0)[:-1]
    cells = {}
    for name, fields in view.hashes.items():
        if name.startswith(prefix):
            for encoded, data in fields.items():
                if not encoded.startswith(DURATIONS_PREFIX):
                    cells[(int(name[len(prefix) :]), decode_key(encoded))] = decode_state(data)
    return cells


def _rolled(
    cells: dict[tuple[int, tuple[str, ...]], CellState],
    plan: MetricPlan,
    positions: tuple[int, ...],
) -> dict[tuple[int, tuple[str, ...]], CellState]:
    groups: dict[tuple[int, tuple[str, ...]], list[CellState]] = {}
    for (bucket, key), state in cells.items():
        groups.setdefault((bucket, tuple(key[i] for i in positions)), []).append(state)
    return {at: merge_states(plan.kinds, states) for at, states in groups.items()}


def _same(total: CellState, merged: CellState, kinds: Any) -> None:
    assert total.count == merged.count
    assert abs(total.total - merged.total) <= 1e-9 * max(1.0, abs(merged.total))
    assert (total.minimum, total.maximum) == (merged.minimum, merged.maximum)
    for kind, a, b in zip(kinds, total.sketches or [], merged.sketches or [], strict=True):
        if kind is HLL:  # distinct items: few here, so counted exactly by both
            assert kind.summary(a) == kind.summary(b)
        else:  # a KLL of as many values (the multiset gives the exact ones, checked apart)
            assert KLL.sketch([a]).n == KLL.sketch([b]).n


def _check(view: MemoryView, settings_: Settings) -> None:
    """Every rollup of the metric and of its parts equals its keys' cells merged; the
    `sessions` rollup's multiset holds exactly the durations of the sessions rolled into it."""
    metric = settings_.plan("visits")
    assert metric is not None
    plans = SessionPlans.of(metric, settings_.plans.values())
    assert len(plans.totals) == 2, "the total and the configured rollup"
    index = view.hashes.get(f"lp:sessions:{{{TOPIC}:0}}:visits:{metric.version}", {})
    for totals in plans.totals:
        rollup = totals.metric.rollup
        assert rollup is not None
        for owner, total in zip((metric, plans.sessions, plans.bounces), totals, strict=True):
            want = _rolled(_cells(view, owner), owner, rollup.positions)
            got = _cells(view, total)
            assert got.keys() == want.keys(), owner.name
            for at, state in want.items():
                _same(got[at], state, owner.kinds)
        durations: dict[tuple[int, tuple[str, ...]], Counter[int]] = {}
        for encoded, data in index.items():
            key = rollup.project(decode_key(encoded))
            for held in KeyIndex.decode(data).sessions:
                bucket = held.first - held.first % (10 * MINUTE)
                durations.setdefault((bucket, key), Counter())[held.last - held.first] += 1
        part = totals.sessions
        for (bucket, key), counts in durations.items():
            name = cell_key(TOPIC, 0, part.name, part.version, bucket)
            stored = view.hashes[name][DURATIONS_PREFIX + encode_key(key)]
            assert Counter(DurationCounts.decode(stored)) == counts


EVENTS = st.lists(
    st.tuples(
        st.integers(0, 90),  # minute
        st.integers(0, 59),  # second
        st.sampled_from(["u1", "u2", "u3"]),
        st.sampled_from(["/a", "/b"]),
        st.floats(0, 1000, allow_nan=False),
    ),
    min_size=1,
    max_size=60,
)


@settings(max_examples=60, deadline=None)
@given(EVENTS, st.integers(1, 12), st.integers(0, 90))
def test_totals_kept_from_changes_equal_the_keys_merged(
    events: list[tuple[int, int, str, str, float]], batch: int, w_minute: int
) -> None:
    config = _settings()
    plan = SourcePlan.of(config, config.sources[0])
    view = MemoryView()
    records = [
        RawRecord(
            offset,
            T0 + 10**9,
            orjson.dumps({"ts": T0 + m * MINUTE + s * 1000, "user": u, "page": p, "ms": v}),
        )
        for offset, (m, s, u, p, v) in enumerate(events)
    ]
    fence = Fence(None, None)
    for i in range(0, len(records), batch):
        outcome, written = decide(plan, 0, fence, records[i : i + batch], {}, view, {})
        view.write(written)
        fence = outcome.fence
        _check(view, config)

    # A run published W: every key continues from a seed (its first session, as if the run
    # served it), events before W become the batch view's
    metric = config.plan("visits")
    assert metric is not None
    plans = SessionPlans.of(metric, config.plans.values())
    w = T0 + w_minute * MINUTE
    index = view.hashes.get(f"lp:sessions:{{{TOPIC}:0}}:visits:{metric.version}", {})
    seeds: dict[tuple[str, ...], Session] = {}
    for encoded, data in index.items():
        sessions = KeyIndex.decode(data).sessions
        if sessions and sessions[0].first < w:
            seeds[decode_key(encoded)] = sessions[0].session
    out = ApplyBatch()
    continue_from_seeds(plans, TOPIC, 0, SessionSeeds("run", w, seeds), view, out)
    view.write(out)
    _check(view, config)
    assert rollup_name("visits", ()) in config.plans
