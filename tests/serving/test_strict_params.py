"""Issue #49's query parameters as sent: a single-valued parameter repeated is a 400 naming it
(only key dimensions repeat, meaning any of their values), and numbers, times and durations are
ASCII with no space around them, each refusal saying what to send. Before, the last of
`window=1h&window=1m` was used, a `q` in fullwidth digits was read as ASCII ones and
`start=%202026-...` as `2026-...`."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

pytestmark = [pytest.mark.services, pytest.mark.timeout(120)]

M = "/v1/metrics/views_by_page"
S, E = "2026-01-01T00:00:00Z", "2026-01-02T00:00:00Z"
SERIES = [("window", "1h"), ("start", S), ("end", E)]
TOP = [("window", "1h"), ("at", S)]
KEYS = [("start", S), ("end", E)]

REPEATED = [
    (f"{M}/series", [*SERIES, ("window", "1m")], "window is sent 2 times"),
    (f"{M}/series", [*SERIES, ("end", E)], "end is sent 2 times"),
    (f"{M}/series", [*SERIES, ("q", "0.5"), ("q", "0.9")], "q is sent 2 times"),
    (f"{M}/series", [*SERIES, ("step", "1h"), ("step", "1h")], "step is sent 2 times"),
    (f"{M}/top", [*TOP, ("n", "1"), ("n", "1000")], "n is sent 2 times"),
    (f"{M}/top", [*TOP, ("by", "count"), ("by", "sum"), ("by", "p99")], "by is sent 3 times"),
    (f"{M}/top", [*TOP, ("n", "x"), ("n", "1")], "n is sent 2 times"),
    (f"{M}/keys", [*KEYS, ("limit", "1"), ("limit", "2")], "limit is sent 2 times"),
    (f"{M}/keys", [*KEYS, ("prefix", "/a"), ("prefix", "/b")], "prefix is sent 2 times"),
    (f"{M}/sessions", [*KEYS, ("start", S)], "start is sent 2 times"),
]


@pytest.mark.parametrize(("path", "params", "words"), REPEATED)
def test_a_repeated_parameter_is_a_400_naming_it(
    client: TestClient, path: str, params: list[tuple[str, str]], words: str
) -> None:
    answer = client.get(path, params=params)
    assert answer.status_code == 400, answer.text
    detail = answer.json()["detail"]
    assert words in detail and "send it once" in detail and "dim=value, may repeat" in detail


def test_a_repeated_key_dimension_still_means_any_of_its_values(client: TestClient) -> None:
    answer = client.get(f"{M}/series", params=[*SERIES, ("page", "/a"), ("page", "/b")])
    assert answer.status_code == 200, answer.text
    assert answer.json()["filters"] == {"page": ["/a", "/b"]}


NOT_PLAIN = [
    (f"{M}/series", [*SERIES, ("q", "\uff10.5")], "q='\uff10.5' holds characters other than ASCII"),
    (f"{M}/series", [*SERIES, ("q", "0.5, 0.9")], "q='0.5, 0.9' has a space around a value"),
    (f"{M}/series", [("window", "1h"), ("start", " " + S), ("end", E)], "start=' 2026-01-01"),
    (f"{M}/series", [("window", "1h"), ("start", S), ("end", E + "\t")], "end='2026-01-02"),
    (f"{M}/series", [("window", "1h"), ("start", S), ("end", " 1767312000000")], "end=' 1767"),
    (f"{M}/series", [("window", " 1h"), ("start", S), ("end", E)], "window=' 1h' has a space"),
    (f"{M}/series", [*SERIES, ("step", "1h ")], "step='1h ' has a space"),
    (f"{M}/series", [*SERIES, ("limit", "1\u0660")], "limit='1\u0660' holds characters other than"),
    (f"{M}/top", [("window", "1h"), ("at", "\u0662026-01-01T00:00:00Z")], "at='\u0662026"),
    (f"{M}/top", [*TOP, ("n", " 10")], "n=' 10' has a space around a value"),
    (
        f"{M}/top",
        [*TOP, ("n", "\uff11\uff10")],
        "n='\uff11\uff10' holds characters other than ASCII",
    ),
    (f"{M}/keys", [*KEYS, ("limit", "10 ")], "limit='10 ' has a space around a value"),
]


@pytest.mark.parametrize(("path", "params", "words"), NOT_PLAIN)
def test_a_number_or_time_is_ascii_with_nothing_around_it(
    client: TestClient, path: str, params: list[tuple[str, str]], words: str
) -> None:
    answer = client.get(path, params=params)
    assert answer.status_code == 400, answer.text
    detail = answer.json()["detail"]
    assert words in detail and "write it in ASCII (digits 0-9) with nothing around it" in detail


@pytest.mark.parametrize("n", ["+5", "1_0", "10.0", "1e1"])
def test_an_integer_is_digits(client: TestClient, n: str) -> None:
    answer = client.get(f"{M}/top", params=[*TOP, ("n", n)])
    assert answer.status_code == 400, answer.text
    assert answer.json()["detail"] == f"n={n!r} is not an integer; send digits 0-9, e.g. n=10"


def test_plain_values_are_read_as_before(client: TestClient) -> None:
    """An unencoded `+` of an offset arrives as a space inside the time: still read as `+`."""
    plain = [
        (f"{M}/series", [("window", "1h"), ("start", "2026-01-01T01:00:00 01:00"), ("end", E)]),
        (f"{M}/series", [*SERIES, ("q", "0.5,0.99"), ("limit", "5"), ("step", "1h")]),
        (f"{M}/top", [*TOP, ("n", "3"), ("by", "count")]),
        (f"{M}/keys", [("start", "1767225600000"), ("end", "1767312000000"), ("limit", "007")]),
    ]
    for path, params in plain:
        answer = client.get(path, params=params)
        assert answer.status_code == 200, (path, params, answer.text)
    answer = client.get(f"{M}/top", params=[*TOP, ("n", "-1")])
    assert answer.status_code == 400 and "n must be between 1 and" in answer.json()["detail"]


def test_a_run_range_is_plain_too(client: TestClient) -> None:
    answer = client.post("/v1/batch/runs", json={"mode": "range", "start": " " + S, "end": E})
    assert answer.status_code == 400, answer.text
    assert "start=' 2026-01-01T00:00:00Z' has a space around a value" in answer.json()["detail"]
