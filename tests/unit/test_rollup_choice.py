"""Which stored cells answer a query: the smallest rollup keeping every dimension the query
filters or groups by, else the full key (Pinot's star-tree and Druid's roll-up choose alike)."""

from __future__ import annotations

from typing import Any

import pytest
from fastapi import HTTPException

from serving_layer.params import metric_of
from serving_layer.query import answering_plan
from serving_layer.selection import Selection
from shared.config import Settings

KEY = ("country", "device", "page")


def _settings(rollups: list[list[str]]) -> Settings:
    return Settings(
        sources=[{"name": "pv", "topic": "pv", "time_field": "ts", "partitions": 1}],
        metrics=[
            {
                "name": "views",
                "source": "pv",
                "key": list(KEY),
                "windows": ["1m"],
                "rollups": rollups,
            }
        ],
    )


def _selection(filters: dict[str, list[str]], group_by: tuple[str, ...] = ()) -> Selection:
    return Selection(KEY, tuple((d, frozenset(v)) for d, v in filters.items()), group_by)


@pytest.mark.parametrize(
    ("filters", "group_by", "answered_by", "exact_key"),
    [
        ({}, (), "views[]", ()),
        ({"country": ["de"]}, (), "views[country]", ("de",)),
        ({"country": ["de", "fr"]}, (), "views[country]", None),
        ({}, ("country",), "views[country]", None),
        ({"device": ["tv"]}, ("country",), "views[country,device]", None),
        ({"page": ["/"]}, (), "views", None),
        ({"country": ["de"], "device": ["tv"], "page": ["/"]}, (), "views", ("de", "tv", "/")),
    ],
)
def test_the_smallest_covering_rollup_answers(
    filters: dict[str, Any], group_by: tuple[str, ...], answered_by: str, exact_key: Any
) -> None:
    settings = _settings([[], ["country"], ["device", "country"]])
    metric = settings.plans["views"]
    selection = _selection(filters, group_by)
    plan, read = answering_plan(settings, metric, selection)
    assert plan.name == answered_by
    assert read.dims == plan.key
    assert (read.filter_map(), read.group_by, read.exact_key) == (
        selection.filter_map(),
        group_by,
        exact_key,
    )


def test_without_rollups_the_metric_answers() -> None:
    settings = _settings([])
    metric = settings.plans["views"]
    plan, read = answering_plan(settings, metric, _selection({}))
    assert (plan, read) == (metric, _selection({}))


def test_a_rollup_is_not_a_metric_to_query_by_name() -> None:
    settings = _settings([[]])
    with pytest.raises(HTTPException) as raised:
        metric_of(settings, "views[]")
    assert raised.value.status_code == 404
    assert "configured metrics: views" in str(raised.value.detail)
