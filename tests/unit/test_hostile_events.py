"""Hostile events (issue #26): whatever a record holds — extreme numbers, NUL and control
characters, long strings, deep nesting, bytes that are not UTF-8 — the shared rules neither
raise nor disagree with the brute-force oracle about whether it is malformed, skipped or
counted, and with which key and value. The same records run through both layers against the
real stack in `tests/e2e/test_hostile_input.py`."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from shared.config import Settings
from shared.events import Malformed, MetricInput, Skipped, metric_input, parse_record
from tests import oracle

T0 = 1_767_225_600_000
CREATE = T0 + 60_000
CONFIG: dict[str, Any] = {
    "sources": [
        {"name": "pv", "topic": "pv", "time_field": "ts", "id_field": "id", "partitions": 1}
    ],
    "metrics": [
        {
            "name": "by_page",
            "source": "pv",
            "key": ["page", "country", "device"],
            "value": "lat",
            "aggregations": ["count", "sum", "min", "max", "distinct(user)", "quantiles(lat)"],
            "windows": ["1m"],
        },
        {"name": "total", "source": "pv", "aggregations": ["count"], "windows": ["1m"]},
    ],
}
SETTINGS = Settings(**CONFIG)
PLANS = list(SETTINGS.plans.values())

EXTREME_NUMBERS = st.sampled_from(
    [1.7e308, -1.7e308, 2**63, -(2**63), 2**63 - 1024, 9.2e18, 1e-320, 0.0, -0.0, 2**64, 10**30]
)
HOSTILE_TEXT = st.one_of(
    st.text(max_size=8),
    st.text(st.characters(codec="utf-8"), max_size=40),
    st.sampled_from(["a\x00b", "\x00", "\x01\x1f", "é" * 512, "é" * 513, "x" * 1025, "日本" * 200]),
    st.integers(0, 2100).map(lambda n: "p" * n),
)
BOUNDARY_TEXT = st.sampled_from(
    ["x" * 1024, "é" * 512, "x" * 1000, "é" * 500, "é" * 513, "y" * 1025, "a\x00"]
)
"""Texts at the stores' limits: 1,024 bytes a dimension, 2,048 a key, no NUL."""
FIELD_VALUES = st.one_of(
    HOSTILE_TEXT,
    EXTREME_NUMBERS,
    st.integers(),
    st.floats(allow_nan=False, allow_infinity=False),
    st.booleans(),
    st.none(),
    st.just({"nested": {"deeper": [1, 2]}}),
    st.just([]),
)


def _event(draw: Any) -> dict[str, Any]:
    """A valid event with one to three of its fields replaced by hostile values."""
    event: dict[str, Any] = {
        "id": draw(st.integers(0, 10**6).map(str)),
        "ts": T0 + draw(st.integers(0, 59_999)),
        "page": "home",
        "country": "nl",
        "device": "d",
        "user": "u",
        "lat": 1.5,
    }
    hostile = {
        "id": st.one_of(HOSTILE_TEXT, st.integers(), st.integers(10**1000, 10**1100)),
        "ts": st.one_of(EXTREME_NUMBERS, HOSTILE_TEXT, st.just("0001-01-01T00:00:00Z")),
        "page": st.one_of(BOUNDARY_TEXT, FIELD_VALUES),
        "country": st.one_of(BOUNDARY_TEXT, FIELD_VALUES),
        "device": st.one_of(BOUNDARY_TEXT, FIELD_VALUES),
        "user": FIELD_VALUES,
        "lat": st.one_of(EXTREME_NUMBERS, FIELD_VALUES),
    }
    for name in draw(st.lists(st.sampled_from(sorted(hostile)), min_size=1, max_size=3)):
        event[name] = draw(hostile[name])
    return event


@st.composite
def hostile_values(draw: Any) -> bytes:
    """A record value: an event with hostile fields, encoded, sometimes mangled."""
    encoded = json.dumps(_event(draw)).encode()
    mangle = draw(st.sampled_from(["none", "none", "nesting", "bytes", "cut"]))
    if mangle == "nesting":
        depth = draw(st.integers(1, 3000))
        return encoded[:-1] + b', "deep": ' + b"[" * depth + b"]" * depth + b"}"
    if mangle == "bytes":
        at = draw(st.integers(0, len(encoded)))
        return encoded[:at] + draw(st.binary(min_size=1, max_size=4)) + encoded[at:]
    if mangle == "cut":
        return encoded[: draw(st.integers(0, len(encoded)))]
    return encoded


def _at_limits(**fields: Any) -> bytes:
    event = {"id": "e", "ts": T0, "page": "p", "country": "nl", "device": "d", "lat": 1.5}
    return json.dumps({**event, "user": "u", **fields}).encode()


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(value=hostile_values())
@example(value=_at_limits(page="x" * 1024, country="é" * 512))  # a key of 2,049 bytes
@example(value=_at_limits(page="x" * 1024, country="y" * 1000, device="z" * 24))  # 2,048
@example(value=_at_limits(page="x" * 1024, country="y" * 1000))  # 2,025
@example(value=_at_limits(lat=2**63 - 1024))
@example(value=_at_limits(lat=-(2**63)))
def test_the_shared_rules_and_the_oracle_agree_on_hostile_records(value: bytes) -> None:
    source = SETTINGS.sources[0]
    parsed = parse_record(value, CREATE, source)
    expected = oracle.compute(CONFIG, [oracle.Record("pv", 0, 0, CREATE, value)])
    if isinstance(parsed, Malformed):
        assert sum(expected.malformed.values()) == 1, (parsed, value[:200])
        assert parsed.detail
        return
    assert not expected.malformed, (expected.malformed, value[:200])
    for plan in PLANS:
        contribution = metric_input(parsed, plan)
        cells = {cell: agg for cell, agg in expected.cells.items() if cell[0] == plan.name}
        if isinstance(contribution, Skipped):
            assert expected.skipped.get(plan.name) == 1 and not cells, (contribution, value[:200])
            continue
        assert isinstance(contribution, MetricInput)
        ((cell, aggregates),) = cells.items()
        assert cell[3] == contribution.key
        if plan.value is not None:
            assert aggregates["sum"] == contribution.value
