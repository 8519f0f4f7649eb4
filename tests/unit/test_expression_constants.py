"""The constant analysis of expressions (`shared/expressions/constants.py`): a `where` TRUE for
no event and a computed field NULL for every event are found when the config loads (rule 10 in
docs/semantics.md), and never one that some event makes TRUE (or not NULL)."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from shared.expressions import Definitions, compile_definitions, compile_node, null_fields
from shared.expressions.constants import never_true
from tests.expression_strategies import TIME_FIELD, events, expressions


@pytest.mark.parametrize(
    ("where", "fields", "why"),
    [
        ("latency_ms / 0 > 1", {}, "'latency_ms / 0' is always NULL: division by zero"),
        ("latency_ms % 0.0 = 1", {}, "'latency_ms % 0.0' is always NULL: remainder by zero"),
        ("FALSE", {}, "'FALSE' is always FALSE"),
        ("NULL", {}, "'NULL' is always NULL"),
        ("page = NULL", {}, "'page = NULL' is always NULL: a comparison with NULL is NULL"),
        ("page IN (NULL)", {}, "'page = NULL' is always NULL"),
        ("latency_ms > 1 AND 1 = 2", {}, "'1 = 2' is always FALSE"),
        ("page = 'a' AND NULL", {}, "'NULL' is always NULL"),
        ("NOT TRUE", {}, "'NOT TRUE' is always FALSE"),
        ("ts IS NULL", {}, "'ts IS NULL' is always FALSE: the event time is never NULL"),
        ("latency_ms + NULL > 1", {}, "'latency_ms + NULL' is always NULL: an operand is NULL"),
        ("lower(NULL) = 'a'", {}, "'lower(NULL)' is always NULL"),
        ("x / 0 > 1 OR y > 1 AND NULL", {}, "division by zero; 'NULL' is always NULL"),
        ("slow > 1", {"slow": "latency_ms / 0"}, "fields.slow: 'latency_ms / 0' is always NULL"),
        (
            "b > 1",
            {"a": "x % 0", "b": "a + 1"},
            "fields.b: fields.a: 'x % 0' is always NULL: remainder by zero",
        ),
        (
            "CASE WHEN x > 1 THEN NULL END",
            {},
            "'CASE WHEN x > 1 THEN NULL ELSE NULL END' is always NULL: every result it may take",
        ),
        ("CASE WHEN TRUE THEN FALSE ELSE x END", {}, "always FALSE: its first branch is always"),
        ("COALESCE(NULL, x / 0) > 1", {}, "'COALESCE(NULL, x / 0)' is always NULL"),
    ],
)
def test_a_where_true_for_no_event_is_refused_saying_why(
    where: str, fields: dict[str, str], why: str
) -> None:
    with pytest.raises(ValueError) as error:
        compile_definitions(where, fields, TIME_FIELD)
    message = str(error.value)
    assert message.startswith("where: never TRUE for any event (")
    assert why in message and message.endswith("; fix or remove the filter")


@pytest.mark.parametrize(
    ("where", "event"),
    [
        ("x * 0 = 0", {"x": 3}),
        ("x / 2 > 1", {"x": 3}),
        ("x > 1 OR y / 0 > 2", {"x": 3}),
        ("COALESCE(x, NULL) > 1", {"x": 3}),
        ("CASE WHEN TRUE THEN x > 1 END", {"x": 3}),
        ("CASE WHEN x IS NULL THEN TRUE END", {}),
        ("ts IS NOT NULL", {}),
        ("x IS NULL", {}),
        ("NOT (x = 1) IS NULL", {"x": 1}),
        ("x IN (NULL, 1)", {"x": 1}),
        ("COALESCE(x / 0, TRUE)", {}),
        ("CAST(x AS BOOLEAN) OR FALSE", {"x": 1}),
    ],
)
def test_a_where_some_event_makes_true_loads(where: str, event: dict[str, Any]) -> None:
    definitions = compile_definitions(where, {}, TIME_FIELD)
    assert definitions.where is not None
    assert compile_node(definitions.where)(event, 0, {}) is True


def test_computed_fields_null_for_every_event_are_found() -> None:
    definitions = compile_definitions(
        None,
        {
            "slow": "latency_ms / 0",
            "later": "slow + 1",
            "none": "NULL",
            "label": "CASE WHEN ts IS NULL THEN 'never' END",
            "kept": "COALESCE(slow, 'all')",
            "maybe": "CASE WHEN x > 1 THEN 'big' END",
        },
        TIME_FIELD,
    )
    assert null_fields(definitions) == {
        "slow": "'latency_ms / 0' is always NULL: division by zero",
        "later": "fields.slow: 'latency_ms / 0' is always NULL: division by zero",
        "none": "'NULL' is always NULL",
        "label": """"CASE WHEN ts IS NULL THEN 'never' ELSE NULL END" is always NULL: no branch """
        "is ever taken",
    }


@settings(
    max_examples=300,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(expressions, st.lists(events(), min_size=1, max_size=20))
def test_what_the_analysis_finds_holds_for_every_event(
    text: str, batch: list[tuple[dict[str, Any], int]]
) -> None:
    """Conservative: an expression found NULL for every event is NULL on every generated
    event, and one found never TRUE is TRUE on none (as a `where`, it would be refused)."""
    try:
        definitions = compile_definitions(None, {"e": text}, TIME_FIELD)
    except ValueError:
        return
    ((_, node),) = definitions.fields
    evaluate = compile_node(node)
    values = [evaluate(event, time_ms, {}) for event, time_ms in batch]
    if "e" in null_fields(definitions):
        assert values == [None] * len(values), text
    if never_true(Definitions((), node, TIME_FIELD)) is not None:
        assert True not in [v is True for v in values], text
