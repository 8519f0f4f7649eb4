"""`q` is bounded: a quantile's output name spells the fraction out (`p` + 100 q), so the
number of fractions and their digits bound every point's size (`q=1e-1000000` once made a
64 MB answer)."""

from __future__ import annotations

import pytest

from shared.aggregations import MAX_QUANTILES, parse_quantiles, quantile_name


def test_six_digits_after_the_point_and_ten_fractions_are_the_most() -> None:
    finest = parse_quantiles("0.000001,0.999999,0.5000000")  # trailing zeros are not digits
    assert [quantile_name(q) for q in finest] == ["p0.0001", "p50", "p99.9999"]
    ten = ",".join(f"0.{n:02d}" for n in range(1, MAX_QUANTILES + 1))
    assert len(parse_quantiles(ten)) == MAX_QUANTILES


@pytest.mark.parametrize(
    "text",
    ["1e-1000000", "0.1234567", "0.0000001", "0.1000000000000000000000000000001", "9E-7"],
)
def test_more_digits_are_refused_saying_how_many(text: str) -> None:
    with pytest.raises(ValueError, match=r"more than 6 digits after the point; send at most 6"):
        parse_quantiles(text)


def test_more_fractions_are_refused_saying_how_many() -> None:
    with pytest.raises(ValueError, match=r"11 quantiles asked for, more than 10; send at most 10"):
        parse_quantiles(",".join(["0.5"] * 11))
