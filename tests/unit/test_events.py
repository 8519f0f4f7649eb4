"""Event validity (docs/semantics.md): canonical values, event times, records, inputs."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shared.config import MetricConfig, SourceConfig
from shared.events import (
    MAX_EVENT_MS,
    MIN_EVENT_MS,
    Malformed,
    MetricInput,
    Skipped,
    SourceEvent,
    canonical,
    decode_json,
    metric_input,
    parse_event_time,
    parse_record,
)
from shared.metric_plan import compile_plan

T0 = 1_704_067_200_000  # 2024-01-01T00:00:00Z
MIN = 60_000
CREATE = T0 + 3_600_000  # a CreateTime well after T0

SOURCE = SourceConfig(name="pv", topic="pv", time_field="ts", id_field="id", max_future="5m")
NO_ID = SourceConfig(name="plain", topic="plain", time_field="ts")
METRIC = compile_plan(
    MetricConfig(
        name="by_page",
        source="pv",
        key=("page", "country"),
        value="lat",
        aggregations=("count", "sum", "distinct(user)"),
        windows=("1m",),
    ),
    SOURCE,
)
COUNT_ONLY = compile_plan(MetricConfig(name="total", source="pv", windows=("1m",)), SOURCE)


def encode(value: Any) -> bytes:
    return json.dumps(value).encode()


def event(**fields: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "id": "e1",
        "ts": T0,
        "page": "home",
        "country": "nl",
        "lat": 1.5,
        "user": "u1",
    }
    base.update(fields)
    return base


def parsed(fields: dict[str, Any]) -> SourceEvent:
    result = parse_record(encode(fields), CREATE, SOURCE)
    assert isinstance(result, SourceEvent), result
    return result


def reason(result: object) -> str:
    assert isinstance(result, Malformed | Skipped), result
    return result.reason


# --------------------------------------------------------------------------- canonical


def test_canonical_string_and_integer_are_one_value() -> None:
    assert canonical(7) == canonical("7") == "7"
    assert canonical(-12) == "-12"
    assert canonical(0) == "0"
    assert canonical("") == ""
    assert canonical("héllo") == "héllo"
    assert canonical(2**70) == str(2**70)


@pytest.mark.parametrize("value", [True, False, 7.0, 1.5, None, [7], {"a": 1}, b"7"])
def test_canonical_of_anything_else_is_none(value: object) -> None:
    assert canonical(value) is None


# --------------------------------------------------------------------------- event time


def test_integer_epoch_ms() -> None:
    assert parse_event_time(T0) == T0
    assert parse_event_time(0) == 0
    assert parse_event_time(-1) == -1
    assert parse_event_time(MIN_EVENT_MS) == MIN_EVENT_MS
    assert parse_event_time(MAX_EVENT_MS) == MAX_EVENT_MS


@pytest.mark.parametrize("raw", [MIN_EVENT_MS - 1, MAX_EVENT_MS + 1, 2**63, -(2**63)])
def test_integer_outside_years_1_to_9999_is_invalid(raw: int) -> None:
    assert parse_event_time(raw) is None


@pytest.mark.parametrize("raw", [True, False, float(T0), None, [T0], {"t": T0}, str(T0)])
def test_other_types_are_invalid(raw: object) -> None:
    assert parse_event_time(raw) is None


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("2024-01-01T00:00:00Z", T0),
        ("2024-01-01T00:00:00z", T0),
        ("2024-01-01t00:00:00Z", T0),
        ("2024-01-01T00:00:00+00:00", T0),
        ("2024-01-01T00:00:00-00:00", T0),
        ("2024-01-01T01:30:00+01:30", T0),
        ("2023-12-31T22:00:00-02:00", T0),
        ("2024-01-01T05:45:00+05:45", T0),
        ("2024-01-01T00:00:00.5Z", T0 + 500),
        ("2024-01-01T00:00:00.12Z", T0 + 120),
        ("2024-01-01T00:00:00.123Z", T0 + 123),
        ("2024-01-01T00:00:00.1239Z", T0 + 123),
        ("2024-01-01T00:00:00.12399Z", T0 + 123),
        ("2024-01-01T00:00:00.123999Z", T0 + 123),
        ("1970-01-01T00:00:00Z", 0),
        ("1969-12-31T23:59:59.9999Z", -1),
        ("1969-12-31T23:59:59.999Z", -1),
        ("1969-12-31T23:59:59.998001Z", -2),
        ("2024-02-29T12:00:00Z", T0 + (31 + 28) * 86_400_000 + 12 * 3_600_000),
        ("0001-01-01T00:00:00Z", MIN_EVENT_MS),
        ("9999-12-31T23:59:59.999999Z", MAX_EVENT_MS),
        ("0001-01-01T00:59:00+00:59", MIN_EVENT_MS),
    ],
)
def test_rfc3339(text: str, expected: int) -> None:
    assert parse_event_time(text) == expected


@pytest.mark.parametrize(
    "text",
    [
        "2024-01-01T00:00:00.1234567Z",  # 7 fractional digits
        "2024-01-01T00:00:00.Z",
        "2024-01-01T00:00:00",  # no offset
        "2024-01-01 00:00:00Z",  # space separator
        "2024-01-01T00:00Z",
        "2024-01-01T00:00:00+0100",
        "2024-01-01T00:00:00+01",
        "2024-01-01T00:00:00+24:00",
        "2024-01-01T00:00:00+01:60",
        "2024-01-01T00:00:00UTC",
        "2024-02-30T00:00:00Z",
        "2023-02-29T00:00:00Z",
        "2024-13-01T00:00:00Z",
        "2024-01-01T24:00:00Z",
        "2024-01-01T00:60:00Z",
        "2016-12-31T23:59:60Z",  # leap second
        "0000-01-01T00:00:00Z",
        "0001-01-01T00:00:00+00:01",  # year 0 in UTC
        "9999-12-31T23:59:59-00:01",  # year 10000 in UTC
        "10000-01-01T00:00:00Z",
        "24-01-01T00:00:00Z",
        " 2024-01-01T00:00:00Z",
        "2024-01-01T00:00:00Z ",
        "2024-01-01T00:00:00Zjunk",
        "2024-01-01",
        "",
    ],
)
def test_invalid_rfc3339(text: str) -> None:
    assert parse_event_time(text) is None


def test_a_trailing_newline_is_not_rfc3339() -> None:
    assert parse_event_time("2024-01-01T00:00:00Z\n") is None


def test_only_ascii_digits_are_rfc3339_digits() -> None:
    arabic_indic_2024 = "\u0662\u0660\u0662\u0664"
    assert parse_event_time(f"{arabic_indic_2024}-01-01T00:00:00Z") is None


@settings(max_examples=200, deadline=None)
@given(
    moment=st.datetimes(
        min_value=datetime(1900, 1, 1), max_value=datetime(2200, 1, 1), timezones=st.just(UTC)
    ),
    offset_minutes=st.integers(-(23 * 60 + 59), 23 * 60 + 59),
    digits=st.integers(0, 6),
)
def test_rfc3339_agrees_with_datetime(moment: datetime, offset_minutes: int, digits: int) -> None:
    local = moment.astimezone(timezone(timedelta(minutes=offset_minutes)))
    text = local.strftime("%Y-%m-%dT%H:%M:%S")
    if digits:
        text += "." + f"{local.microsecond:06d}"[:digits]
    sign = "-" if offset_minutes < 0 else "+"
    text += f"{sign}{abs(offset_minutes) // 60:02d}:{abs(offset_minutes) % 60:02d}"
    kept = int(f"{moment.microsecond:06d}"[:digits].ljust(6, "0")) if digits else 0
    truncated = moment.replace(microsecond=kept)
    expected = (truncated - datetime(1970, 1, 1, tzinfo=UTC)) // timedelta(milliseconds=1)
    assert parse_event_time(text) == expected


# --------------------------------------------------------------------------- parse_record


def test_valid_record() -> None:
    result = parse_record(encode(event()), CREATE, SOURCE)
    assert isinstance(result, SourceEvent)
    assert result.time_ms == T0
    assert result.event_id == "e1"
    assert result.fields["page"] == "home"


def test_rfc3339_time_in_a_record() -> None:
    result = parsed(event(ts="2024-01-01T01:00:00.250+01:00"))
    assert result.time_ms == T0 + 250


def test_integer_id_is_canonicalised() -> None:
    assert parsed(event(id=5)).event_id == "5"
    assert parsed(event(id="5")).event_id == "5"


def test_id_beyond_64_bits_is_still_an_integer() -> None:
    """An integer id is its decimal text, however large (orjson decodes > u64 as float)."""
    big = 2**64
    result = parse_record(encode(event(id=big)), CREATE, SOURCE)
    assert isinstance(result, SourceEvent), result
    assert result.event_id == str(big)


def test_no_id_field_configured() -> None:
    result = parse_record(encode({"ts": T0}), CREATE, NO_ID)
    assert isinstance(result, SourceEvent)
    assert result.event_id is None


@pytest.mark.parametrize(
    "value",
    [
        None,
        b"",
        b"not json",
        b'{"ts": 1',
        b"\xff\xfe{}",
        b'{"ts": 1704067200000, "page": "\xff"}',
        b'{"ts": NaN}',
        b'{"ts": 1704067200000, "lat": Infinity}',
        b'{"ts": 1} {"ts": 2}',
    ],
)
def test_not_json(value: bytes | None) -> None:
    assert reason(parse_record(value, CREATE, SOURCE)) == "not_json"


@pytest.mark.parametrize("value", [b"[]", b"[1, 2]", b'"text"', b"7", b"null", b"true"])
def test_not_object(value: bytes) -> None:
    assert reason(parse_record(value, CREATE, SOURCE)) == "not_object"


def test_time_missing() -> None:
    fields = event()
    del fields["ts"]
    assert reason(parse_record(encode(fields), CREATE, SOURCE)) == "time_missing"


@pytest.mark.parametrize(
    "ts", [None, True, 1.5, float(T0), "yesterday", "2024-01-01T00:00:00", [T0], {"ms": T0}]
)
def test_time_invalid(ts: object) -> None:
    assert reason(parse_record(encode(event(ts=ts)), CREATE, SOURCE)) == "time_invalid"


def test_time_in_future_boundary() -> None:
    limit = CREATE + 5 * MIN
    at_limit = parse_record(encode(event(ts=limit)), CREATE, SOURCE)
    assert isinstance(at_limit, SourceEvent)
    assert at_limit.time_ms == limit
    beyond = parse_record(encode(event(ts=limit + 1)), CREATE, SOURCE)
    assert reason(beyond) == "time_in_future"


def test_time_in_future_applies_to_rfc3339_and_uses_max_future() -> None:
    create = T0 - 1_000  # 2023-12-31T23:59:59Z
    strict = SourceConfig(name="s", topic="s", time_field="ts", max_future="1s")
    assert isinstance(
        parse_record(encode({"ts": "2024-01-01T00:00:00Z"}), create, strict), SourceEvent
    )
    assert (
        reason(parse_record(encode({"ts": "2024-01-01T00:00:00.001Z"}), create, strict))
        == "time_in_future"
    )
    assert isinstance(parse_record(encode({"ts": T0 + 299_000}), create, NO_ID), SourceEvent)


def test_id_missing() -> None:
    fields = event()
    del fields["id"]
    assert reason(parse_record(encode(fields), CREATE, SOURCE)) == "id_missing"


@pytest.mark.parametrize("event_id", [True, False, 1.5, 5.0, None, {"a": 1}, ["e1"]])
def test_id_invalid(event_id: object) -> None:
    assert reason(parse_record(encode(event(id=event_id)), CREATE, SOURCE)) == "id_invalid"


def test_malformed_carries_a_readable_detail() -> None:
    result = parse_record(encode({"id": "x"}), CREATE, SOURCE)
    assert isinstance(result, Malformed)
    assert "'ts'" in result.detail


def test_time_is_checked_before_the_id() -> None:
    assert reason(parse_record(encode({"ts": "bad"}), CREATE, SOURCE)) == "time_invalid"


# --------------------------------------------------------------------------- metric_input


def test_valid_metric_input_is_canonical() -> None:
    result = metric_input(parsed(event(page=7, country="nl", lat=3, user=42)), METRIC)
    assert result == MetricInput(("7", "nl"), 3.0, ("42",))
    assert isinstance(result, MetricInput)
    assert type(result.value) is float
    same = metric_input(parsed(event(page="7", country="nl", lat=3.0, user="42")), METRIC)
    assert same == result


def test_count_only_metric_takes_no_value() -> None:
    result = metric_input(parsed(event(lat="not a number")), COUNT_ONLY)
    assert result == MetricInput((), None, ())


@pytest.mark.parametrize(
    ("changes", "expected"),
    [
        ({"page": None}, "key_invalid"),
        ({"page": True}, "key_invalid"),
        ({"page": 1.5}, "key_invalid"),
        ({"page": ["home"]}, "key_invalid"),
        ({"country": {"c": "nl"}}, "key_invalid"),
        ({"lat": True}, "value_invalid"),
        ({"lat": False}, "value_invalid"),
        ({"lat": "3"}, "value_invalid"),
        ({"lat": None}, "value_invalid"),
        ({"lat": [3]}, "value_invalid"),
        ({"user": None}, "distinct_invalid"),
        ({"user": True}, "distinct_invalid"),
        ({"user": 4.5}, "distinct_invalid"),
        ({"user": ["u1"]}, "distinct_invalid"),
    ],
)
def test_skipped_reasons(changes: dict[str, Any], expected: str) -> None:
    assert reason(metric_input(parsed(event(**changes)), METRIC)) == expected


@pytest.mark.parametrize(
    ("field", "expected"),
    [
        ("page", "key_missing"),
        ("country", "key_missing"),
        ("lat", "value_missing"),
        ("user", "distinct_missing"),
    ],
)
def test_skipped_missing(field: str, expected: str) -> None:
    fields = event()
    del fields[field]
    assert reason(metric_input(parsed(fields), METRIC)) == expected


def test_a_skip_is_per_metric() -> None:
    source_event = parsed(event(lat="3"))
    assert reason(metric_input(source_event, METRIC)) == "value_invalid"
    assert isinstance(metric_input(source_event, COUNT_ONLY), MetricInput)


@pytest.mark.parametrize("value", [2**63, -(2**63), 2**64, 1.7e308, -9.3e18])
def test_a_value_that_could_overflow_a_sum_is_out_of_range(value: float) -> None:
    """Two values of 1.7e308 overflow a sum (a stalled speed partition, an infinite batch
    sum): a value must be smaller than 2**63 in magnitude, the same skip in both layers."""
    result = parsed(event(lat=value))
    assert reason(metric_input(result, METRIC)) == "value_out_of_range"
    assert isinstance(metric_input(result, COUNT_ONLY), MetricInput)


@pytest.mark.parametrize("value", [2**63 - 2**10, -(2**62), 9.2e18, 1e-300])
def test_values_below_the_bound_count(value: float) -> None:
    result = metric_input(parsed(event(lat=value)), METRIC)
    assert isinstance(result, MetricInput), result
    assert result.value == float(value)


@pytest.mark.parametrize(
    ("page", "expected"),
    [
        ("a\x00b", "key_invalid"),
        ("é" * 513, "key_too_long"),
        ("x" * 1025, "key_too_long"),
        (10**1025, "key_too_long"),
    ],
    ids=["nul", "1026-bytes-utf8", "1025-ascii", "1026-digit-int"],
)
def test_a_key_the_batch_view_cannot_store_is_skipped(page: object, expected: str) -> None:
    """PostgreSQL text holds no NUL and a btree entry is at most 2,704 bytes: such a key
    would fail every batch run, so both layers skip it for the metric."""
    result = parsed(event(page=page))
    assert reason(metric_input(result, METRIC)) == expected
    assert isinstance(metric_input(result, COUNT_ONLY), MetricInput)


def test_the_longest_storable_key() -> None:
    fits = parsed(event(page="x" * 1024, country="y" * 1024))
    assert isinstance(metric_input(fits, METRIC), MetricInput)
    over = parsed(event(page="x" * 1024, country="é" * 513))
    assert reason(metric_input(over, METRIC)) == "key_too_long"


@pytest.mark.parametrize(
    ("event_id", "expected"),
    [("a\x00", "id_invalid"), ("i" * 1025, "id_too_long"), (10**1024, "id_too_long")],
    ids=["nul", "1025-ascii", "1025-digit-int"],
)
def test_an_id_the_batch_view_cannot_store_is_malformed(event_id: object, expected: str) -> None:
    result = parse_record(encode(event(id=event_id)), CREATE, SOURCE)
    assert isinstance(result, Malformed)
    assert result.reason == expected
    assert "'id'" in result.detail
    assert isinstance(parse_record(encode(event(id="i" * 1024)), CREATE, SOURCE), SourceEvent)


@pytest.mark.parametrize(
    "literal", [b"1e999", b"-1e999", b"1" + b"0" * 400], ids=["1e999", "-1e999", "10**400"]
)
def test_number_too_large_for_a_double_is_a_metric_skip(literal: bytes) -> None:
    """docs/semantics.md: a value field that is "not a finite JSON number" skips the event for that
    metric only; the record is still source-valid and counts for the source's other metrics."""
    value = b'{"id": "e1", "ts": %d, "page": "p", "country": "nl", "user": "u", "lat": %s}' % (
        T0,
        literal,
    )
    result = parse_record(value, CREATE, SOURCE)
    assert isinstance(result, SourceEvent), result
    assert reason(metric_input(result, METRIC)) == "value_invalid"
    assert isinstance(metric_input(result, COUNT_ONLY), MetricInput)


def test_key_beyond_64_bits_is_an_integer() -> None:
    big = 2**64 + 1
    result = metric_input(parsed(event(page=big)), METRIC)
    assert isinstance(result, MetricInput), result
    assert result.key == (str(big), "nl")


def test_huge_negative_integers_keep_their_digits() -> None:
    result = parsed(event(id=-(2**64), page=-(2**70)))
    assert result.event_id == str(-(2**64))
    assert metric_input(result, METRIC) == MetricInput((str(-(2**70)), "nl"), 1.5, ("u1",))


def test_float_literals_stay_floats() -> None:
    """Re-reading a document with large numbers must not turn `1e20` into an integer."""
    value = b'{"id": "e1", "ts": %d, "page": 1e20, "country": "nl", "user": "u", "lat": 1e20}' % T0
    result = parse_record(value, CREATE, SOURCE)
    assert isinstance(result, SourceEvent), result
    assert reason(metric_input(result, METRIC)) == "key_invalid"
    assert metric_input(result, COUNT_ONLY) == MetricInput((), None, ())
    fine = value.replace(b'"page": 1e20', b'"page": 100000000000000000000')
    fine = fine.replace(b'"lat": 1e20', b'"lat": 1e18')
    result = parse_record(fine, CREATE, SOURCE)
    assert isinstance(result, SourceEvent), result
    assert metric_input(result, METRIC) == MetricInput(
        ("100000000000000000000", "nl"), 1e18, ("u",)
    )


def test_a_huge_number_outside_the_used_fields_does_not_matter() -> None:
    value = b'{"id": "e1", "ts": %d, "page": "p", "country": "nl", "user": "u", "lat": 2,' % T0
    result = parse_record(value + b' "extra": [1e999, {"n": -1e999}]}', CREATE, SOURCE)
    assert isinstance(result, SourceEvent), result
    assert metric_input(result, METRIC) == MetricInput(("p", "nl"), 2.0, ("u",))


def test_lone_surrogate_is_not_json() -> None:
    """Sketches hash the canonical string's UTF-8 bytes; a lone surrogate has none."""
    for text in (b'"\\ud800"', b'"a\\udfffb"'):
        value = b'{"id": "e1", "ts": %d, "page": %s}' % (T0, text)
        assert reason(parse_record(value, CREATE, SOURCE)) == "not_json"
        with_huge = value[:-1] + b', "lat": 1e999}'
        assert reason(parse_record(with_huge, CREATE, SOURCE)) == "not_json"


def test_a_surrogate_pair_is_one_character() -> None:
    value = b'{"id": "e1", "ts": %d, "page": "\\ud83d\\ude00"}' % T0
    result = parse_record(value, CREATE, SOURCE)
    assert isinstance(result, SourceEvent), result
    assert result.fields["page"] == "\U0001f600"


@pytest.mark.parametrize("depth", [2_000, 100_000])
def test_deep_nesting_is_malformed_not_a_crash(depth: int) -> None:
    nested = b"[" * depth + b"]" * depth
    value = b'{"id": "e1", "ts": %d, "x": %s, "lat": 1e999}' % (T0, nested)
    assert reason(parse_record(value, CREATE, SOURCE)) == "not_json"


@pytest.mark.parametrize("depth", [1_000, 1_024])
def test_nesting_up_to_1024_levels_is_read(depth: int) -> None:
    """Past what the fast decoder reads under Python's recursion limit, up to orjson's 1,024
    levels (the record's own object is one): still a source-valid event."""
    nested = b"[" * (depth - 1) + b"]" * (depth - 1)
    result = parse_record(b'{"id": "e1", "ts": %d, "x": %s}' % (T0, nested), CREATE, SOURCE)
    assert isinstance(result, SourceEvent), result


def test_integers_beyond_64_bits_keep_their_digits_at_any_depth() -> None:
    value = b'{"id": "e1", "ts": %d, "geo": %s}' % (T0, b'{"n": ' * 50 + b"%d" % 2**70 + b"}" * 50)
    geo = decode_json(value)["geo"]  # type: ignore[index]
    for _ in range(49):
        geo = geo["n"]
    assert geo == {"n": 2**70} and type(geo["n"]) is int


@settings(max_examples=300, deadline=None)
@given(document=st.dictionaries(st.text(max_size=8), st.deferred(lambda: _JSON), max_size=6))
def test_decoding_reads_every_number_as_the_standard_library_does(document: dict[str, Any]) -> None:
    """The fast decoder's answer is the standard library's, integers of any size and floats
    alike (`json.dumps` tells an int from an equal float)."""
    text = json.dumps(document).encode()
    assert json.dumps(decode_json(text)) == json.dumps(json.loads(text))


# --------------------------------------------------------------------------- never raises

_JSON_SCALARS = (
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**63 - 1)
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(st.characters(exclude_categories=("Cs",)), max_size=20)
)
_JSON = st.recursive(
    _JSON_SCALARS,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=12,
)
_FIELD_VALUES = st.one_of(
    _JSON,
    st.integers(MIN_EVENT_MS, MAX_EVENT_MS),
    st.sampled_from(["2024-01-01T00:00:00Z", "2024-01-01T00:00:00.1234567Z", "x"]),
)
_NAMES = st.sampled_from(["ts", "id", "page", "country", "lat", "user", "other"])


@settings(max_examples=200, deadline=None)
@given(value=st.binary(max_size=200), create=st.integers(-(2**62), 2**62))
def test_parse_record_never_raises_on_bytes(value: bytes, create: int) -> None:
    result = parse_record(value, create, SOURCE)
    assert isinstance(result, SourceEvent | Malformed)
    if isinstance(result, SourceEvent):
        assert isinstance(metric_input(result, METRIC), MetricInput | Skipped)


@settings(max_examples=200, deadline=None)
@given(
    fields=st.dictionaries(_NAMES | st.text(max_size=6), _FIELD_VALUES, max_size=8),
    create=st.integers(MIN_EVENT_MS, MAX_EVENT_MS),
)
def test_parse_record_never_raises_on_json_objects(fields: dict[str, Any], create: int) -> None:
    result = parse_record(json.dumps(fields).encode(), create, SOURCE)
    assert isinstance(result, SourceEvent | Malformed)
    if isinstance(result, Malformed):
        assert result.reason in {
            "time_missing",
            "time_invalid",
            "time_in_future",
            "id_missing",
            "id_invalid",
        }
        return
    assert result.time_ms == parse_event_time(fields["ts"])
    assert result.time_ms <= create + SOURCE.max_future
    assert result.event_id == canonical(fields["id"])
    assert result.event_id is not None
    outcome = metric_input(result, METRIC)
    assert isinstance(outcome, MetricInput | Skipped)
    if isinstance(outcome, MetricInput):
        assert outcome.key == (canonical(fields["page"]), canonical(fields["country"]))
        assert outcome.sketch_items == (canonical(fields["user"]),)
        assert outcome.value == float(fields["lat"])
