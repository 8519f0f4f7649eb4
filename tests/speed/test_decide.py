"""The speed layer's decision without Redis: `decide` is a pure function of a batch of records
and what it reads of the speed view (de-dup ids of earlier batches, stored sub-cell states),
given here by an in-memory view. Validity, de-duplication, lateness (rule 2) and the
pre-aggregated states it writes are checked case by case and, for any split of a sample into
batches, against the oracle. `test_processor` keeps the same path honest on the real Redis."""

from __future__ import annotations

import itertools
import random
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

import orjson
from hypothesis import given, settings
from hypothesis import strategies as st

from lambdactl.generator import GeneratorSpec, generate
from shared.config import Settings
from shared.speed_view import Fence
from speed_layer.processor import BatchOutcome, RawRecord, SourcePlan, decide
from speed_layer.rejoin import MemoryView
from tests import oracle
from tests.conftest import platform_config
from tests.speed.support import USER_SESSIONS
from tests.views import speed_cells_of

MINUTE = 60_000
T0 = 1_704_067_200_000
CREATED = T0 + 60 * MINUTE


def _config(grace: str = "2m") -> dict[str, Any]:
    config = platform_config("decide", partitions=1)
    for metric in config["metrics"]:
        metric["grace"] = grace
    return config


def _plan(config: dict[str, Any]) -> SourcePlan:
    settings = Settings(**config)
    return SourcePlan.of(settings, settings.sources[0])


def _event(offset: int, ts: int, created: int = CREATED, **fields: Any) -> RawRecord:
    body = {"ts": ts, "event_id": f"e{offset}", "page": "/", "user_id": "u", "latency_ms": 1.0}
    body.update(fields)
    return RawRecord(offset, created, orjson.dumps(body))


def _run(
    plan: SourcePlan,
    view: MemoryView,
    batches: Sequence[Sequence[RawRecord]],
    watermarks: Mapping[str, int | None] | None = None,
) -> tuple[list[BatchOutcome], Fence]:
    fence = Fence(None, None)
    outcomes = []
    for records in batches:
        outcome, batch = decide(plan, 0, fence, records, watermarks or {}, view)
        view.write(batch)
        fence = outcome.fence
        outcomes.append(outcome)
    return outcomes, fence


def _cells(config: dict[str, Any], view: MemoryView) -> dict[Any, Any]:
    return speed_cells_of(Settings(**config), view.hashes)


def test_a_valid_event_becomes_one_state_and_moves_the_fence() -> None:
    config = _config()
    plan = _plan(config)
    view = MemoryView()
    (outcome,), fence = _run(plan, view, [[_event(0, T0 + 5_000, latency_ms=4)]])
    assert (outcome.records, outcome.duplicates, outcome.dead_letters, outcome.late) == (
        1,
        0,
        [],
        [],
    )
    assert fence == Fence(0, T0 + 5_000, plan.defs)
    cells = _cells(config, view)
    assert cells[("views_by_page", MINUTE, T0, ("/",))]["count"] == 1
    assert cells[("views_by_page", MINUTE, T0, ("/",))]["p50"] == 4.0
    assert cells[("views_total", MINUTE, T0, ())]["distinct_user_id"] == 1


def test_malformed_records_are_dead_letters_and_do_not_move_stream_time() -> None:
    plan = _plan(_config())
    records = [
        _event(0, T0 + 5_000),
        RawRecord(1, CREATED, b"not json"),
        RawRecord(2, CREATED, orjson.dumps({"event_id": "x"})),
        RawRecord(3, T0, orjson.dumps({"ts": T0 + 10 * MINUTE, "event_id": "f"})),
    ]
    (outcome,), fence = _run(plan, MemoryView(), [records])
    assert [(d.offset, d.why) for d in outcome.dead_letters] == [
        (1, "not_json"),
        (2, "time_missing"),
        (3, "time_in_future"),
    ]
    assert fence == Fence(3, T0 + 5_000, plan.defs)


def test_a_copy_of_an_id_counts_once_within_and_across_batches() -> None:
    config = _config()
    plan = _plan(config)
    view = MemoryView()
    first = [_event(0, T0 + 1_000, event_id="a"), _event(1, T0 + 1_000, event_id="a")]
    second = [_event(2, T0 + 1_000, event_id="a"), _event(3, T0 + 3_000, event_id="b")]
    outcomes, _ = _run(plan, view, [first, second])
    assert [o.duplicates for o in outcomes] == [1, 1]
    assert _cells(config, view)[("views_total", MINUTE, T0, ())]["count"] == 2


def test_an_id_reused_at_another_time_is_another_event() -> None:
    """Rule 4: copies share their id and their event time; within one bucket and across."""
    config = _config()
    plan = _plan(config)
    view = MemoryView()
    first = [_event(0, T0 + 1_000, event_id="a"), _event(1, T0 + 2_000, event_id="a")]
    second = [_event(2, T0 + MINUTE, event_id="a"), _event(3, T0 + 2_000, event_id="a")]
    outcomes, _ = _run(plan, view, [first, second])
    assert [o.duplicates for o in outcomes] == [0, 1]
    cells = _cells(config, view)
    assert cells[("views_total", MINUTE, T0, ())]["count"] == 2
    assert cells[("views_total", MINUTE, T0 + MINUTE, ())]["count"] == 1


def test_stream_time_stops_at_the_record_timestamp() -> None:
    """Rule 2: an event ahead of its record's timestamp (within `max_future`) counts, but
    moves stream time only to the timestamp, so the events after it are not late."""
    config = _config(grace="1m")
    plan = _plan(config)
    view = MemoryView()
    ahead = _event(0, T0 + 6 * MINUTE, created=T0 + 2 * MINUTE)
    now = _event(1, T0 + 2 * MINUTE, created=T0 + 2 * MINUTE)
    (outcome,), _ = _run(plan, view, [[ahead, now]])
    assert outcome.late_by_metric == Counter()
    assert outcome.fence.stream_time == T0 + 2 * MINUTE
    cells = _cells(config, view)
    assert cells[("views_total", MINUTE, T0 + 6 * MINUTE, ())]["count"] == 1
    assert cells[("views_total", MINUTE, T0 + 2 * MINUTE, ())]["count"] == 1


def test_lateness_by_grace_and_by_w_per_metric() -> None:
    config = _config(grace="1m")
    plan = _plan(config)
    view = MemoryView()
    records = [
        _event(0, T0 + 10 * MINUTE),  # stream time 10:00
        _event(1, T0 + 8 * MINUTE + 5_000),  # cell [8, 9) ends 9:00, + 1m grace = 10:00: late
        _event(2, T0 + 9 * MINUTE),  # cell [9, 10) + grace = 11:00 > 10:00: on time
    ]
    watermarks = {"views_by_page": T0 + 10 * MINUTE, "views_total": None}
    (outcome,), _ = _run(plan, view, [records], watermarks)
    # views_by_page: cells ending at or before W = 10:00 are late (offsets 1, 2)
    assert outcome.late_by_metric == Counter({"views_by_page": 2, "views_total": 1})
    assert [(r.offset, r.why) for r in outcome.late] == [
        (1, "views_by_page,views_total"),
        (2, "views_by_page"),
    ]
    cells = {c[:3] for c in _cells(config, view) if c[1] == MINUTE}
    assert cells == {
        ("views_by_page", MINUTE, T0 + 10 * MINUTE),
        ("views_total", MINUTE, T0 + 10 * MINUTE),
        ("views_total", MINUTE, T0 + 9 * MINUTE),
    }


def test_metric_level_skips_are_counted_per_metric_and_reason() -> None:
    plan = _plan(_config())
    records = [
        _event(0, T0, page=None),
        _event(1, T0, latency_ms=True),
        _event(2, T0, latency_ms="fast"),
        _event(3, T0, user_id=2.5),
    ]
    (outcome,), _ = _run(plan, MemoryView(), [records])
    assert outcome.skipped == Counter(
        {
            ("views_by_page", "key_invalid"): 1,
            ("views_by_page", "value_invalid"): 2,
            ("views_by_page", "distinct_invalid"): 1,
            ("views_total", "distinct_invalid"): 1,
        }
    )


def _sample() -> list[RawRecord]:
    spec = GeneratorSpec(T0, T0 + 40 * MINUTE, 1_500, malformed_fraction=0.03, seed=12)
    return [RawRecord(i, CREATED, r.value) for i, r in enumerate(generate(spec))]


SAMPLE = _sample()


@settings(max_examples=25, deadline=None)
@given(
    cuts=st.lists(st.integers(1, len(SAMPLE) - 1), max_size=12, unique=True),
    w_minutes=st.one_of(st.none(), st.integers(0, 40)),
)
def test_any_split_into_batches_matches_the_oracle(cuts: list[int], w_minutes: int | None) -> None:
    config = _config()
    plan = _plan(config)
    bounds = [0, *sorted(cuts), len(SAMPLE)]
    batches = [SAMPLE[lo:hi] for lo, hi in itertools.pairwise(bounds)]
    watermark = None if w_minutes is None else T0 + w_minutes * MINUTE
    watermarks = {m.name: watermark for m in plan.metrics}
    view = MemoryView()
    outcomes, fence = _run(plan, view, batches, watermarks)
    expected = oracle.compute(
        config,
        [oracle.Record("pv-decide", 0, r.offset, r.timestamp, r.value) for r in SAMPLE],
        late_rule=True,
        watermarks={k: v for k, v in watermarks.items() if v is not None},
    )
    assert oracle.compare(expected.cells, _cells(config, view)) == []
    assert sum(o.duplicates for o in outcomes) == expected.duplicates
    assert sum(len(o.dead_letters) for o in outcomes) == sum(expected.malformed.values())
    late = Counter[str]()
    for o in outcomes:
        late.update(o.late_by_metric)
    assert {k: v for k, v in late.items() if v} == {k: v for k, v in expected.late.items() if v}
    assert fence.stream_time == expected.stream_time[("pv-decide", 0)]


@settings(max_examples=25, deadline=None)
@given(
    skews=st.lists(
        st.one_of(
            st.integers(-30 * MINUTE, 0),  # on time or late
            st.integers(1, 5 * MINUTE),  # a device clock ahead, inside max_future
            st.integers(5 * MINUTE + 1, 366 * 24 * 60 * MINUTE),  # beyond: malformed
        ),
        min_size=1,
        max_size=60,
    )
)
def test_clock_skewed_events_never_move_stream_time_past_arrival(skews: list[int]) -> None:
    """Rules 1 and 2: whatever the producers' clocks say, stream time follows the records'
    timestamps (the broker's clock), and the batch's cells equal the oracle's."""
    config = _config()
    plan = _plan(config)
    view = MemoryView()
    arrivals = [T0 + 30 * MINUTE + i * 1_000 for i in range(len(skews))]
    records = [
        _event(i, arrival + skew, created=arrival)
        for i, (arrival, skew) in enumerate(zip(arrivals, skews, strict=True))
    ]
    (outcome,), fence = _run(plan, view, [records])
    assert fence.stream_time is None or fence.stream_time <= max(arrivals)
    expected = oracle.compute(
        config,
        [oracle.Record("pv-decide", 0, r.offset, r.timestamp, r.value) for r in records],
        late_rule=True,
    )
    assert fence.stream_time == expected.stream_time.get(("pv-decide", 0))
    assert oracle.compare(expected.cells, _cells(config, view)) == []
    assert len(outcome.dead_letters) == sum(s > 5 * MINUTE for s in skews)


@settings(max_examples=10, deadline=None)
@given(
    cuts=st.lists(st.integers(1, len(SAMPLE) - 1), max_size=8, unique=True),
    w_minutes=st.one_of(st.none(), st.integers(0, 40)),
)
def test_a_rollup_holds_its_parents_accepted_events_merged(
    cuts: list[int], w_minutes: int | None
) -> None:
    """`views_by_page` rolled up to `[]` counts exactly the events `views_total` (the same
    source, grace and W, no key) counts, cell by cell, whatever the batches; the parent's own
    cells are unchanged by having a rollup."""
    config = _config()
    config["metrics"][0]["rollups"] = [[]]
    plan = _plan(config)
    bounds = [0, *sorted(cuts), len(SAMPLE)]
    watermark = None if w_minutes is None else T0 + w_minutes * MINUTE
    view = MemoryView()
    _run(
        plan,
        view,
        [SAMPLE[lo:hi] for lo, hi in itertools.pairwise(bounds)],
        {m.name: watermark for m in plan.metrics},
    )
    cells = _cells(config, view)
    totals = {k[1:]: v for k, v in cells.items() if k[0] == "views_total"}
    rolled = {k[1:]: v for k, v in cells.items() if k[0] == "views_by_page[]"}
    assert totals or watermark is not None  # a W past the sample leaves every event late
    assert {k: (v["count"], v["distinct_user_id"]) for k, v in totals.items()} == {
        k: (v["count"], v["distinct_user_id"]) for k, v in rolled.items() if k in totals
    }
    expected = oracle.compute(
        config,
        [oracle.Record("pv-decide", 0, r.offset, r.timestamp, r.value) for r in SAMPLE],
        late_rule=True,
        watermarks={} if watermark is None else {m.name: watermark for m in plan.metrics},
    )
    parents = {k: v for k, v in cells.items() if k[0] != "views_by_page[]"}
    assert oracle.compare(expected.cells, parents) == []


SESSIONS = USER_SESSIONS


@settings(max_examples=25, deadline=None)
@given(
    cuts=st.lists(st.integers(1, len(SAMPLE) - 1), max_size=12, unique=True),
    w_minutes=st.one_of(st.none(), st.integers(0, 40)),
)
def test_sessions_of_any_split_into_batches_match_the_oracle(
    cuts: list[int], w_minutes: int | None
) -> None:
    """A session metric's buckets (its aggregations over the events of the sessions starting
    in them, the sessions part and the bounces part) equal the oracle's sessionization of the
    events the layer accepted (rule 13's lateness), whatever the batches: out-of-order events
    re-split earlier sessions and a bucket a session left loses its cells."""
    config = _config()
    config["metrics"] = [SESSIONS]
    plan = _plan(config)
    bounds = [0, *sorted(cuts), len(SAMPLE)]
    watermark = None if w_minutes is None else T0 + w_minutes * MINUTE
    view = MemoryView()
    outcomes, _ = _run(
        plan,
        view,
        [SAMPLE[lo:hi] for lo, hi in itertools.pairwise(bounds)],
        {m.name: watermark for m in plan.metrics},
    )
    expected = oracle.compute(
        config,
        [oracle.Record("pv-decide", 0, r.offset, r.timestamp, r.value) for r in SAMPLE],
        late_rule=True,
        watermarks={} if watermark is None else {"user_sessions": watermark},
    )
    want = {c: v for c, v in expected.cells.items() if c[1] != 0}
    assert oracle.compare(want, _cells(config, view)) == []
    late = sum(o.late_by_metric["user_sessions"] for o in outcomes)
    assert late == expected.late["user_sessions"]
    if watermark is None:  # the sample has what the rule is about
        parts = {c[0] for c in want}
        owners = {"user_sessions", "user_sessions(sessions)", "user_sessions(bounces)"}
        assert parts == owners | {f"{name}[]" for name in owners}, "each with its total"
        sessions = [v for c, v in want.items() if c[0] == "user_sessions(sessions)"]
        assert max(v["max"] for v in sessions) >= 8 * MINUTE  # cut near max_duration


@settings(max_examples=25, deadline=None)
@given(st.randoms(use_true_random=False), st.integers(1, 6))
def test_sessions_cut_again_by_events_out_of_order_match_the_oracle(
    rng: random.Random, batch_size: int
) -> None:
    """Two users' events in any order, none late (a long grace): events that start a session
    early, bridge two or move a cut at max_duration make the processor read the sessions'
    events back and cut them again; the cells still equal the oracle's."""
    config = _config(grace="3h")
    config["metrics"] = [{**SESSIONS, "grace": "3h"}]
    plan = _plan(config)
    times = [T0 + rng.randrange(60 * MINUTE) for _ in range(60)]
    records = [_event(i, t, user_id=f"u{i % 2}", event_id=f"o{i}") for i, t in enumerate(times)]
    rng.shuffle(records)
    records = [RawRecord(i, r.timestamp, r.value) for i, r in enumerate(records)]
    view = MemoryView()
    batches = [records[i : i + batch_size] for i in range(0, len(records), batch_size)]
    _run(plan, view, batches, {m.name: None for m in plan.metrics})
    expected = oracle.compute(
        config,
        [oracle.Record("pv-decide", 0, r.offset, r.timestamp, r.value) for r in records],
        late_rule=True,
    )
    assert (
        oracle.compare({c: v for c, v in expected.cells.items() if c[1] != 0}, _cells(config, view))
        == []
    )
