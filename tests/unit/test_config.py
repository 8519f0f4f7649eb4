"""Settings: the YAML file, `LAMBDA_*` overrides, readable errors and metric versions."""

from __future__ import annotations

import copy
import os
from pathlib import Path
from typing import Any

import pytest
import yaml

from shared.config import MetricConfig, Settings, load_settings
from shared.errors import ConfigError

REPO = Path(__file__).resolve().parents[2]

DESIGN_EXAMPLE = """
sources:
  - name: pageviews
    topic: pageviews
    time_field: ts            # integer epoch ms, or RFC 3339 with offset
    id_field: event_id        # optional; enables de-duplication
    partitions: 4
metrics:
  - name: views_by_page
    source: pageviews
    key: [page]
    value: latency_ms
    aggregations: [count, sum, min, max, avg, distinct(user_id)]
    windows: [1m, 1h, 1d]
    grace: 2m
batch:
  schedule: hourly            # 'hourly' or a 5-field cron expression
"""

MIN = 60_000
HOUR = 3_600_000
DAY = 86_400_000


@pytest.fixture(autouse=True)
def _isolated(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """No stray `LAMBDA_*` variable and no `lambda.yaml` in the working directory."""
    for name in list(os.environ):
        if name.startswith("LAMBDA_"):
            monkeypatch.delenv(name)
    monkeypatch.chdir(tmp_path)


def example() -> dict[str, Any]:
    return copy.deepcopy(yaml.safe_load(DESIGN_EXAMPLE))


def write_config(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, config: dict[str, Any] | str
) -> Path:
    path = tmp_path / "config.yaml"
    path.write_text(config if isinstance(config, str) else yaml.safe_dump(config))
    monkeypatch.setenv("LAMBDA_CONFIG", str(path))
    return path


def config_error(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, config: dict[str, Any]) -> str:
    write_config(monkeypatch, tmp_path, config)
    with pytest.raises(ConfigError) as info:
        load_settings()
    return str(info.value)


# --------------------------------------------------------------------------- loading


def test_design_example_loads_from_a_dict() -> None:
    settings = Settings(**example())
    (source,) = settings.sources
    assert (source.name, source.topic, source.time_field, source.id_field) == (
        "pageviews",
        "pageviews",
        "ts",
        "event_id",
    )
    assert source.partitions == 4
    assert source.max_future == 5 * MIN
    assert (source.dlq_topic, source.late_topic) == ("pageviews.dlq", "pageviews.late")
    (metric,) = settings.metrics
    assert metric.key == ("page",)
    assert metric.value == "latency_ms"
    assert metric.windows == (MIN, HOUR, DAY)
    assert metric.grace == 2 * MIN
    assert settings.batch.schedule == "hourly"


def test_repository_lambda_yaml_loads_through_lambda_config(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    path = REPO / "lambda.yaml"
    monkeypatch.setenv("LAMBDA_CONFIG", str(path))
    settings = load_settings()
    raw = yaml.safe_load(path.read_text())
    assert [s.name for s in settings.sources] == [s["name"] for s in raw["sources"]]
    assert [m.name for m in settings.metrics] == [m["name"] for m in raw["metrics"]]
    for metric in settings.metrics:
        assert settings.source(metric.source).name == metric.source
        assert settings.metric(metric.name) is metric
    assert settings.metric("no_such_metric") is None


def test_lambda_yaml_in_the_working_directory_is_the_default(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    (tmp_path / "lambda.yaml").write_text(DESIGN_EXAMPLE)
    settings = load_settings()
    assert [m.name for m in settings.metrics] == ["views_by_page"]


def test_without_any_file_the_defaults_apply() -> None:
    settings = load_settings()
    assert settings.sources == ()
    assert settings.metrics == ()
    assert settings.kafka.bootstrap_servers == "127.0.0.1:9092"
    assert settings.serving.max_cells == 50_000


def test_plans_of_a_source() -> None:
    config = example()
    config["sources"].append({"name": "clicks", "topic": "clicks", "time_field": "t"})
    config["metrics"].append({"name": "clicks_total", "source": "clicks", "windows": ["1m"]})
    settings = Settings(**config)
    assert [m.name for m in settings.plans_of(settings.source("pageviews"))] == ["views_by_page"]
    assert [m.name for m in settings.plans_of(settings.source("clicks"))] == ["clicks_total"]


# --------------------------------------------------------------------------- env overrides


def test_env_overrides_win_over_the_yaml(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    config = example()
    config["kafka"] = {"bootstrap_servers": "from-yaml:9092"}
    config["serving"] = {"max_cells": 10, "port": 9001}
    write_config(monkeypatch, tmp_path, config)
    monkeypatch.setenv("LAMBDA_KAFKA__BOOTSTRAP_SERVERS", "from-env:9093")
    monkeypatch.setenv("LAMBDA_SERVING__MAX_CELLS", "7")
    monkeypatch.setenv("LAMBDA_REDIS__URL", "redis://elsewhere:6380/2")
    monkeypatch.setenv("LAMBDA_AUTH__READER_TOKENS", '["r1", "r2"]')
    settings = load_settings()
    assert settings.kafka.bootstrap_servers == "from-env:9093"
    assert settings.serving.max_cells == 7
    assert settings.serving.port == 9001, "an override of one field keeps its siblings"
    assert settings.redis.url == "redis://elsewhere:6380/2"
    assert [t.get_secret_value() for t in settings.auth.reader_tokens] == ["r1", "r2"]
    assert [m.name for m in settings.metrics] == ["views_by_page"]


def test_env_override_is_validated(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    write_config(monkeypatch, tmp_path, example())
    monkeypatch.setenv("LAMBDA_SERVING__MAX_CELLS", "0")
    with pytest.raises(ConfigError) as info:
        load_settings()
    assert "serving.max_cells" in str(info.value)


def test_missing_lambda_config_file_is_named(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    missing = tmp_path / "nope" / "lambda.yaml"
    monkeypatch.setenv("LAMBDA_CONFIG", str(missing))
    with pytest.raises(ConfigError) as info:
        load_settings()
    assert str(missing) in str(info.value)
    assert "LAMBDA_CONFIG" in str(info.value)


# --------------------------------------------------------------------------- bad configs


@pytest.mark.parametrize(
    "dim",
    ["window", "start", "end", "at", "by", "n", "limit", "prefix", "group_by", "step", "tz", "q"],
)
def test_reserved_dimension_names_are_refused(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, dim: str
) -> None:
    config = example()
    config["metrics"][0]["key"] = ["page", dim]
    message = config_error(monkeypatch, tmp_path, config)
    assert "metrics.0.key" in message
    assert repr(dim) in message
    assert "reserved" in message


def test_unknown_aggregation_lists_the_allowed_ones(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    config = example()
    config["metrics"][0]["aggregations"] = ["count", "median"]
    message = config_error(monkeypatch, tmp_path, config)
    assert "metrics.0.aggregations" in message
    assert "'median'" in message
    for allowed in ("count", "sum", "min", "max", "avg", "distinct(<field>)"):
        assert allowed in message


def test_window_not_a_multiple_of_the_base(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    config = example()
    config["metrics"][0]["windows"] = ["1m", "90s", "1h"]
    message = config_error(monkeypatch, tmp_path, config)
    assert "metrics.0.windows" in message
    assert "90s" in message
    assert "multiple" in message
    assert "1m" in message


def test_sum_without_value(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    config = example()
    del config["metrics"][0]["value"]
    config["metrics"][0]["aggregations"] = ["count", "sum"]
    message = config_error(monkeypatch, tmp_path, config)
    assert "metrics.0" in message
    assert "sum" in message
    assert "value" in message


def test_count_and_distinct_need_no_value() -> None:
    config = example()
    del config["metrics"][0]["value"]
    config["metrics"][0]["aggregations"] = ["count", "distinct(user_id)"]
    (metric,) = Settings(**config).metrics
    assert metric.value is None


def test_metric_naming_an_unknown_source(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    config = example()
    config["metrics"][0]["source"] = "clicks"
    message = config_error(monkeypatch, tmp_path, config)
    assert "'views_by_page'" in message
    assert "'clicks'" in message
    assert "pageviews" in message, "the message lists the configured sources"


def test_duplicate_metric_names(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    config = example()
    config["metrics"].append(copy.deepcopy(config["metrics"][0]))
    message = config_error(monkeypatch, tmp_path, config)
    assert "metric names" in message
    assert "unique" in message


def test_duplicate_source_names(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    config = example()
    config["sources"].append(copy.deepcopy(config["sources"][0]))
    message = config_error(monkeypatch, tmp_path, config)
    assert "source names" in message
    assert "unique" in message


@pytest.mark.parametrize(
    ("field", "text"),
    [("grace", "2 minutes"), ("grace", "2w"), ("grace", "-1m"), ("windows", ["1m", "1x"])],
)
def test_bad_duration_text(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, field: str, text: object
) -> None:
    config = example()
    config["metrics"][0][field] = text
    message = config_error(monkeypatch, tmp_path, config)
    assert f"metrics.0.{field}" in message
    assert "s, m, h, d" in message


def test_bad_max_future_duration(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    config = example()
    config["sources"][0]["max_future"] = "soon"
    message = config_error(monkeypatch, tmp_path, config)
    assert "sources.0.max_future" in message
    assert "'soon'" in message


def test_unknown_field_is_refused(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    config = example()
    config["metrics"][0]["windowz"] = ["1m"]
    message = config_error(monkeypatch, tmp_path, config)
    assert "metrics.0.windowz" in message


def test_bad_schedule(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    config = example()
    config["batch"]["schedule"] = "every hour"
    message = config_error(monkeypatch, tmp_path, config)
    assert "batch.schedule" in message
    assert "cron" in message


def test_metric_name_with_a_trailing_newline_is_refused(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    config = example()
    config["metrics"][0]["name"] = "views\n"
    message = config_error(monkeypatch, tmp_path, config)
    assert "metrics.0.name" in message


def test_the_same_distinct_field_twice_is_refused(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """`distinct(u)` and `distinct( u )` would both be output as `distinct_u`."""
    config = example()
    config["metrics"][0]["aggregations"] = ["count", "distinct(u)", "distinct( u )"]
    message = config_error(monkeypatch, tmp_path, config)
    assert "metrics.0.aggregations" in message


# --------------------------------------------------------------------------- derived fields


def metric(**changes: Any) -> MetricConfig:
    base: dict[str, Any] = {
        "name": "m",
        "source": "s",
        "key": ["page"],
        "value": "lat",
        "aggregations": ["max", "distinct(user)", "count", "distinct( session )", "avg"],
        "windows": ["1h", "5m", "1d"],
    }
    base.update(changes)
    return MetricConfig(**base)


def test_windows_are_sorted() -> None:
    assert metric().windows == (5 * MIN, HOUR, DAY)


def test_defaults_of_a_metric() -> None:
    m = MetricConfig(name="m", source="s", windows=["1m"])
    assert m.key == ()
    assert m.aggregations == ("count",)
    assert m.grace == 0


# --------------------------------------------------------------------------- versions


def version_of(config: dict[str, Any], name: str = "views_by_page") -> str:
    found = Settings(**config).plan(name)
    assert found is not None
    return found.version


def test_version_is_stable_for_equal_definitions() -> None:
    first = version_of(example())
    assert first == version_of(example())
    assert isinstance(first, str)
    assert len(first) >= 8
    other = example()
    other["kafka"] = {"bootstrap_servers": "elsewhere:9092"}
    other["serving"] = {"max_cells": 3}
    assert version_of(other) == first, "settings outside the definition do not matter"


def test_version_ignores_the_partition_count() -> None:
    config = example()
    config["sources"][0]["partitions"] = 12
    assert version_of(config) == version_of(example())


def test_version_ignores_other_metrics() -> None:
    config = example()
    config["metrics"].append({"name": "other", "source": "pageviews", "windows": ["1m"]})
    assert version_of(config) == version_of(example())


@pytest.mark.parametrize(
    ("where", "field", "value"),
    [
        ("metric", "windows", ["1m", "1h"]),
        ("metric", "windows", ["5m", "1h", "1d"]),
        ("metric", "grace", "3m"),
        ("metric", "aggregations", ["count", "sum", "min", "max", "avg"]),
        ("metric", "aggregations", ["count", "sum", "min", "max", "avg", "distinct(page)"]),
        ("metric", "key", ["page", "country"]),
        ("metric", "key", []),
        ("metric", "value", "bytes"),
        ("source", "time_field", "event_time"),
    ],
)
def test_version_changes_with_the_definition(where: str, field: str, value: object) -> None:
    config = example()
    target = config["metrics"][0] if where == "metric" else config["sources"][0]
    target[field] = value
    assert version_of(config) != version_of(example())
