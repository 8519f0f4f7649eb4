"""A session metric in the speed layer on the real Redis (rule 13 in docs/semantics.md): the
events of a batch run's snapshot applied first, then the run's seeds (what the serving layer
would read from the batch view: each key's last session that may reach W) and the events
after the snapshot. The buckets the speed view holds from W on, beside the run's buckets before
W, are the oracle's sessionization of every event: no session counted by both, split between
them or dropped; and the continuation is applied once per run, in the fenced apply."""

from __future__ import annotations

from typing import Any, NamedTuple

import orjson
import pytest

from lambdactl.generator import GeneratorSpec, generate
from shared.config import Settings
from shared.sessions import Session
from shared.speed_view import (
    APPLIED,
    SpeedViewWriter,
    SyncRedis,
    cell_key,
    session_events_key,
    sessions_key,
)
from shared.speed_view.held import KeyIndex, read_event_lines
from speed_layer.processor import RawRecord, SourceProcessor
from speed_layer.rejoin import Recomputation, replacement
from speed_layer.sessions import SessionSeeds
from tests import oracle
from tests.conftest import platform_config
from tests.speed.support import USER_SESSIONS, view_client
from tests.views import speed_view_cells

pytestmark = [pytest.mark.services, pytest.mark.timeout(300)]

MINUTE = 60_000
T0 = 1_704_067_200_000
METRIC = "user_sessions"
MAX_MS = 10 * MINUTE
CREATED = T0 + 2 * 60 * MINUTE


@pytest.fixture
def client(stack: Settings) -> SyncRedis:
    return view_client(stack)


def _config() -> dict[str, Any]:
    config = platform_config("sess", partitions=1)
    config["metrics"] = [USER_SESSIONS]
    return config


def _seeds(cells: dict[oracle.Cell, Any], stamp: str, w: int) -> SessionSeeds:
    """A run's seeds as `shared.db.sessions.boundary_sessions` reads them from its cells."""
    by_key: dict[tuple[str, ...], Session] = {}
    for (name, size, start, key), values in sorted(cells.items()):
        if name == f"{METRIC}(sessions)" and size == 0 and w - MAX_MS <= start < w:
            events = cells[(METRIC, 0, start, key)]["count"]
            by_key[key] = Session(start, start + int(values["max"]), events)
    return SessionSeeds(stamp, w, by_key)


def _bridge(minute: int) -> bytes:
    """An event of user `bridge` at T0 + `minute` minutes."""
    body = {"ts": T0 + minute * MINUTE, "event_id": f"b{minute}", "page": "/b", "user_id": "bridge"}
    return orjson.dumps({**body, "latency_ms": 5.0})


def _records() -> tuple[list[RawRecord], list[RawRecord], int]:
    """The run's snapshot, the events after it and its W (T0 + 27m: 12 minutes before the
    snapshot's last event time, about T0 + 40m, floored to the minute).

    Beside 40 minutes of sample events, user `bridge` has an event every minute from 17m to
    28m (the speed layer sees them on time: two sessions, 17m-26m and, cut by max_duration,
    27m-28m, which starts at W) and a late one at 16m that the speed layer drops and the
    run counts: in the run's sessions the cut moves to 26m, so its session 26m-28m, served by
    the batch view, holds the events of the speed layer's session at W."""
    sample = [r.value for r in generate(GeneratorSpec(T0, T0 + 40 * MINUTE, 2_500, seed=5))]
    step = 40 * MINUTE / 2_500
    for minute in range(28, 16, -1):  # each where the sample's time reaches it
        sample.insert(int(minute * MINUTE / step) + 1, _bridge(minute))
    sample.append(_bridge(16))  # late: the speed layer has passed it by 24 minutes
    after = generate(
        GeneratorSpec(T0 + 40 * MINUTE, T0 + 60 * MINUTE, 1_500, late_fraction=0.0, seed=6)
    )
    values = [*sample, *(r.value for r in after)]
    records = [RawRecord(i, CREATED, v) for i, v in enumerate(values)]
    return records[: len(sample)], records[len(sample) :], T0 + 27 * MINUTE


class FirstPass(NamedTuple):
    """The records of `_records` applied as the worker applies them: the snapshot, then the
    run's seeds and the events after it."""

    config: dict[str, Any]
    settings: Settings
    processor: SourceProcessor
    records: list[RawRecord]
    seeds: dict[str, SessionSeeds]
    w: int


def _first_pass(client: SyncRedis) -> FirstPass:
    config = _config()
    settings = Settings(**config)
    plan = settings.plan(METRIC)
    assert plan is not None and plan.sessions is not None
    snapshot, after, w = _records()
    as_oracle = [oracle.Record("pv-sess", 0, r.offset, r.timestamp, r.value) for r in snapshot]
    store = SpeedViewWriter(client, 86_400)
    processor = SourceProcessor(settings, settings.sources[0], store, lambda *_: None)  # type: ignore[arg-type]
    late = 0
    for i in range(0, len(snapshot), 100):
        outcome = processor.process(0, snapshot[i : i + 100], {})
        assert outcome.status == APPLIED
        late += len(outcome.late)
    assert late > 1, "the speed layer dropped the bridging event and the sample's late ones"

    run = oracle.compute(config, as_oracle)
    assert plan.sessions.watermark(None, [run.stream_time[("pv-sess", 0)]], plan.grace_ms) == w
    seeds = {METRIC: _seeds(run.cells, "run-1", w)}
    assert seeds[METRIC].by_key[("bridge",)] == Session(T0 + 26 * MINUTE, T0 + 28 * MINUTE, 3)
    watermarks = {name: w for name in settings.plans}
    for i in range(0, len(after), 100):
        outcome = processor.process(0, after[i : i + 100], watermarks, seeds=seeds)
        assert outcome.status == APPLIED and not outcome.late
    return FirstPass(config, settings, processor, [*snapshot, *after], seeds, w)


def _speed_view_is_the_oracles(first: FirstPass, client: SyncRedis) -> None:
    """The speed view's base buckets from W on are the oracle's over every event."""
    as_oracle = [oracle.Record("pv-sess", 0, r.offset, r.timestamp, r.value) for r in first.records]
    everything = oracle.compute_cells(first.config, as_oracle)
    base = {c: v for c, v in everything.items() if c[1] == MINUTE and c[2] >= first.w}
    speed = speed_view_cells(first.settings, client)
    speed = {c: v for c, v in speed.items() if c[1] == MINUTE and c[2] >= first.w}
    assert oracle.compare(base, speed) == []


def test_the_speed_view_continues_a_runs_sessions_exactly(client: SyncRedis) -> None:
    first = _first_pass(client)
    config, settings, processor, w = first.config, first.settings, first.processor, first.w
    plan = settings.plan(METRIC)
    assert plan is not None
    seeds = first.seeds
    snapshot_end = next(i for i, r in enumerate(first.records) if r.value == _bridge(16)) + 1
    as_oracle = [oracle.Record("pv-sess", 0, r.offset, r.timestamp, r.value) for r in first.records]
    run = oracle.compute(config, as_oracle[:snapshot_end])
    everything = oracle.compute_cells(config, as_oracle)
    base = {c: v for c, v in everything.items() if c[1] == MINUTE}
    batch = {c: v for c, v in run.cells.items() if c[1] == MINUTE and c[2] < w}
    assert oracle.compare({c: v for c, v in base.items() if c[2] < w}, batch) == []
    _speed_view_is_the_oracles(first, client)

    # Once per run: a second call finds nothing to do; what is held is from W on, each
    # session's string holding exactly its events.
    held = client.hgetall(sessions_key("pv-sess", 0, plan.name, plan.version))
    assert processor.reseed(0, seeds) == APPLIED
    assert client.hgetall(sessions_key("pv-sess", 0, plan.name, plan.version)) == held
    strings = 0
    for encoded, data in held.items():
        for session in KeyIndex.decode(data).sessions:
            assert session.first >= w
            name = session_events_key("pv-sess", 0, plan.name, plan.version, encoded, session.first)
            times = [t for t, _, _ in read_event_lines(client.get(name))]
            assert (times[0], times[-1], len(times)) == session.session
            strings += 1
    assert len(list(client.scan_iter("lp:sevents:*"))) == strings, "no string outlives its session"


def test_a_session_metric_joined_anew_keeps_its_sessions_and_continuation(
    client: SyncRedis,
) -> None:
    """A late table version recomputes a session metric in memory from the partition's
    records and the run's seeds, then swaps it in (rule 11, `speed_layer.rejoin`): the
    speed view is again the oracle's, and what the store held that the recomputation lacks
    (a session string, an index field, a bucket's field) is gone."""
    first = _first_pass(client)
    settings, w = first.settings, first.w
    plan = settings.plan(METRIC)
    assert plan is not None
    store = SpeedViewWriter(client, 86_400)
    held = _sessions(store.held_keys("pv-sess", 0, plan))
    ghost_string = session_events_key("pv-sess", 0, plan.name, plan.version, b"ghost", w)
    client.set(ghost_string, b"")
    index = sessions_key("pv-sess", 0, plan.name, plan.version)
    client.hset(index, b"ghost", next(iter(store.held_keys("pv-sess", 0, plan).values())))
    ghost_cell = cell_key("pv-sess", 0, plan.name, plan.version, w + 30 * 24 * 60 * MINUTE)
    client.hset(ghost_cell, b"ghost", b"")

    source_plan = first.processor.plan  # as `rejoined_plan` chooses it had the metric a lookup
    watermarks = {name: w for name in settings.plans}
    work = Recomputation(source_plan, 0, watermarks, {})
    for i in range(0, len(first.records), 500):
        work.add(first.records[i : i + 500])
    work.finish(first.seeds)
    stored = dict(store.cell_fields("pv-sess", 0, plan))
    served_w = dict.fromkeys(stored, w)
    stored[index] = (0, set(store.held_keys("pv-sess", 0, plan)))
    for part in source_plan.metrics[1:]:
        cells = store.cell_fields("pv-sess", 0, part)
        stored.update(cells)
        served_w.update(dict.fromkeys(cells, w))
    batch = replacement(work.view, stored, served_w, store.session_strings("pv-sess", 0, plan))
    fence = store.read_fence("pv-sess", 0)
    assert store.apply("pv-sess", 0, fence, fence, batch) == APPLIED

    assert _sessions(store.held_keys("pv-sess", 0, plan)) == held
    assert client.get(ghost_string) is None and not client.exists(ghost_cell)
    _speed_view_is_the_oracles(first, client)
    assert first.processor.reseed(0, first.seeds) == APPLIED  # nothing left to continue
    assert _sessions(store.held_keys("pv-sess", 0, plan)) == held


def _sessions(held: dict[bytes, bytes]) -> dict[bytes, tuple[Session, ...]]:
    """Each held key's sessions (its index also names the seed it continued from: a key the
    first pass met only after the run's continuation holds none, the recomputation's does)."""
    return {k: tuple(s.session for s in KeyIndex.decode(v).sessions) for k, v in held.items()}
