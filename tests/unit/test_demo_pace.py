"""The demo's history and its live events run at one rate (#50): per minute of event time the
history holds as many events as the live stream brings, so a chart keeps its level across W,
and the live stream starts where the history ends (the minutes of the first batch run are not
a gap), however unevenly the demo's loop ticks."""

from __future__ import annotations

import random
from collections import Counter

import orjson
import pytest

from lambdactl.demo import DemoOptions, Pace
from lambdactl.generator import GeneratorSpec, generate
from shared.errors import LambdaError

MINUTE = 60_000
ORIGIN = 1_780_000_123_456
"""The demo's start (not on a minute: nothing relies on it)."""


def _live(pace: Pace, first_tick_ms: int, until_ms: int, seed: int = 1) -> list[GeneratorSpec]:
    """The live specs of a demo loop ticking about every second (0.2 to 1.8 s, as a loaded
    machine would) from `first_tick_ms` (after the first batch run) to `until_ms`."""
    rng = random.Random(seed)
    specs, tick, sequence = [], first_tick_ms, 0
    while tick < until_ms:
        sequence += 1
        spec = pace.due(tick, sequence * 7919, keyed_by_user=True)
        if spec is not None:
            specs.append(spec)
        tick += rng.randrange(200, 1800)
    return specs


def _per_minute(specs: list[GeneratorSpec]) -> Counter[int]:
    """Distinct valid events per minute of event time, minutes counted from the origin."""
    seen: set[str] = set()
    minutes: Counter[int] = Counter()
    for spec in specs:
        for record in generate(spec):
            try:
                event = orjson.loads(record.value)
            except orjson.JSONDecodeError:
                continue
            if not isinstance(event, dict) or not isinstance(event.get("ts"), int):
                continue
            if "user_id" not in event or event["event_id"] in seen:
                continue
            seen.add(event["event_id"])
            minutes[(event["ts"] - ORIGIN) // MINUTE] += 1
    return minutes


def test_the_history_and_the_live_stream_have_one_rate() -> None:
    options = DemoOptions()
    pace = Pace(ORIGIN, options.live_rate_per_s)
    history = pace.history(options.history_events, seed=7, keyed_by_user=True)
    assert history.end_ms == ORIGIN
    span_ms = history.end_ms - history.start_ms
    assert span_ms == 180 * MINUTE  # the default: the last 3 hours, at 3 events a second
    assert history.events / span_ms * 1000 == options.live_rate_per_s
    live = _live(pace, ORIGIN + 75_000, ORIGIN + 30 * MINUTE)
    # One stream: each live spec starts where the one before (the history first) ended, at the
    # same spacing, and every event nominally before the last tick has been given.
    assert live[0].start_ms == ORIGIN
    for before, after in zip([history, *live], live, strict=False):
        assert after.start_ms == before.end_ms
    for spec in [history, *live]:
        assert (spec.end_ms - spec.start_ms) / spec.events == pytest.approx(1000 / 3, abs=1)
    assert live[0].events == 225  # the 75 s of the first batch run, caught up at once
    last = live[-1].end_ms
    assert sum(s.events for s in live) == pytest.approx((last - ORIGIN) * 3 / 1000, abs=1)

    counts = _per_minute([history, *live])
    nominal = options.live_rate_per_s * 60
    history_minutes = [counts[m] for m in range(-170, -20)]
    live_minutes = [counts[m] for m in range(16, 28)]  # late copies from 15 min on arrived too
    mean_history = sum(history_minutes) / len(history_minutes)
    mean_live = sum(live_minutes) / len(live_minutes)
    assert mean_live == pytest.approx(mean_history, rel=0.03)
    assert mean_history == pytest.approx(nominal, rel=0.03)
    # No step at W, no gap where the first batch run ran: every minute from the history's
    # start to the live stream's end holds about the nominal count.
    for minute in range(-170, 14):
        assert counts[minute] == pytest.approx(nominal, rel=0.2), (minute, counts[minute])


def test_pace_gives_each_event_once_however_it_is_called() -> None:
    pace = Pace(ORIGIN, 2.5)
    assert pace.due(ORIGIN - 5_000, 1, keyed_by_user=False) is None  # before the origin
    assert pace.due(ORIGIN, 1, keyed_by_user=False) is None  # nothing before the origin
    first = pace.due(ORIGIN + 1, 2, keyed_by_user=False)
    assert first is not None and (first.start_ms, first.events) == (ORIGIN, 1)
    assert pace.due(ORIGIN + 399, 3, keyed_by_user=False) is None  # the next is at +400 ms
    second = pace.due(ORIGIN + 10_000, 4, keyed_by_user=False)
    assert second is not None and (second.start_ms, second.events) == (ORIGIN + 400, 24)
    assert pace.due(ORIGIN + 9_000, 5, keyed_by_user=False) is None  # a clock step back
    assert pace.given == 25
    history = Pace(ORIGIN, 2.5).history(100, seed=1, keyed_by_user=False)
    assert (history.start_ms, history.end_ms) == (ORIGIN - 40_000, ORIGIN)
    assert history.malformed_fraction > 0 and first.malformed_fraction == 0


@pytest.mark.parametrize("rate", [0, -1.0])
def test_a_rate_that_is_not_positive_is_refused(rate: float) -> None:
    with pytest.raises(LambdaError, match="must be positive"):
        Pace(ORIGIN, rate)
