"""Settings: the YAML file, `LAMBDA_*` overrides, readable errors and metric versions."""

from __future__ import annotations

import copy
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from shared.config import MetricConfig, Settings, load_settings
from shared.durations import MAX_DURATION_MS, parse_duration
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


# --------------------------------------------------------------------------- the file itself


def file_error(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, content: str | bytes) -> str:
    """The message of loading `content` as the config file, with its path shortened to
    `<file>`."""
    path = tmp_path / "config.yaml"
    if isinstance(content, bytes):
        path.write_bytes(content)
    else:
        path.write_text(content)
    monkeypatch.setenv("LAMBDA_CONFIG", str(path))
    with pytest.raises(ConfigError) as info:
        load_settings()
    return str(info.value).replace(str(path), "<file>")


def test_yaml_syntax_error_names_file_line_and_column(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    message = file_error(monkeypatch, tmp_path, "sources: [\n  - name: a\n")
    assert message.startswith("<file>:2:3: invalid YAML: ")
    assert "fix the YAML there" in message
    assert "\n" not in message


def test_top_level_list_is_refused(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    message = file_error(monkeypatch, tmp_path, "- sources\n- metrics\n")
    assert message.startswith("<file>:1:1: the file holds a list")
    assert "must be a mapping" in message
    assert "`sources:`" in message


@pytest.mark.parametrize(
    ("content", "where", "what"),
    [
        (b"\x89PNG\r\n\x1a\n\x00", "<file>:1:1:", "byte 0x89 is not UTF-8"),
        (b"kafka:\n  bootstrap_servers: \xff\n", "<file>:2:22:", "byte 0xff is not UTF-8"),
        (b"batch:\n  schedule: hour\x00ly\n", "<file>:2:17:", "character U+0000"),
    ],
)
def test_binary_bytes_are_refused(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, content: bytes, where: str, what: str
) -> None:
    message = file_error(monkeypatch, tmp_path, content)
    assert message.startswith(where)
    assert what in message
    assert "UTF-8" in message


def test_python_tag_is_refused_before_it_runs(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    marker = tmp_path / "ran"
    content = f"kafka:\n  bootstrap_servers: !!python/object/apply:os.system ['touch {marker}']\n"
    message = file_error(monkeypatch, tmp_path, content)
    assert message == (
        "<file>:2:22: kafka.bootstrap_servers: YAML tags are not allowed (found "
        "'!!python/object/apply:os.system'); write plain values (quote one meant as text)"
    )
    assert not marker.exists()


@pytest.mark.parametrize(
    ("content", "where", "tag"),
    [
        ("!!python/tuple [sources, metrics]\n", "<file>:1:1: ", "!!python/tuple"),
        ("--- !!python/object/apply:os.system ['true']\n", "<file>:1:5: ", "!!python/object/apply"),
        ("--- !!python/name:os.system\n", "<file>:1:5: ", "!!python/name:os.system"),
        ("!!map {batch: {schedule: hourly}}\n", "<file>:1:1: ", "!!map"),
        ("batch:\n  schedule: !!str hourly\n", "<file>:2:13: batch.schedule: ", "!!str"),
        ("spark:\n  conf: !custom {a: b}\n", "<file>:2:9: spark.conf: ", "!custom"),
        ("metrics:\n  - !!python/tuple [a]\n", "<file>:2:5: metrics.0: ", "!!python/tuple"),
        ("batch:\n  schedule: ! hourly\n", "<file>:2:13: batch.schedule: ", "'!'"),
    ],
    ids=[
        "top-level-list",
        "top-level-apply",
        "top-level-scalar",
        "map",
        "str",
        "local",
        "item",
        "bang",
    ],
)
def test_any_yaml_tag_is_refused_where_it_is_written(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, content: str, where: str, tag: str
) -> None:
    """A tag on the top-level node was reported as what the file holds ("holds a list"), and
    a tag YAML's core schema knows (`!!str`, `!!map`) was let through."""
    message = file_error(monkeypatch, tmp_path, content)
    assert message.startswith(where + "YAML tags are not allowed (found '")
    assert tag in message and message.endswith("; write plain values (quote one meant as text)")


def test_a_value_yaml_cannot_construct_is_refused(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    message = file_error(monkeypatch, tmp_path, "serving:\n  port: 0x_\n")
    assert message.startswith("<file>:2:9: serving.port: '0x_' reads as a int but is not a valid")
    assert "quote it if it is text ('0x_')" in message


@pytest.mark.parametrize("content", ["", "\n\n", "# only a comment\n"])
def test_empty_file_is_refused(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, content: str
) -> None:
    message = file_error(monkeypatch, tmp_path, content)
    assert message.startswith("<file>:1: the file is empty")
    assert "unset LAMBDA_CONFIG" in message


def test_duplicate_top_level_key(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    content = DESIGN_EXAMPLE + "batch:\n  schedule: '0 * * * *'\n"
    message = file_error(monkeypatch, tmp_path, content)
    first = DESIGN_EXAMPLE.splitlines().index("batch:") + 1
    second = len(DESIGN_EXAMPLE.splitlines()) + 1
    assert message.startswith(f"<file>:{second}:1: batch: duplicate key 'batch'")
    assert f"also set at line {first}" in message
    assert "keep one `batch:`" in message


def test_duplicate_key_in_a_metric(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    content = DESIGN_EXAMPLE.replace("    grace: 2m\n", "    grace: 2m\n    grace: 5m\n")
    message = file_error(monkeypatch, tmp_path, content)
    first = content.splitlines().index("    grace: 2m") + 1
    assert message.startswith(f"<file>:{first + 1}:5: metrics.0.grace: duplicate key 'grace'")
    assert f"also set at line {first}" in message
    assert "keep one `grace:`" in message


def test_a_key_yaml_reads_as_a_number(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    message = file_error(monkeypatch, tmp_path, "spark:\n  conf:\n    12: x\n")
    assert message.startswith("<file>:3:5: spark.conf: the key 12 reads as a int")
    assert "quote it ('12')" in message


def test_a_key_yaml_1_1_reads_as_a_boolean_keeps_its_name(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A lookup's `on:` (and `yes:`, `off:`...) is a name, not YAML 1.1's boolean."""
    path = tmp_path / "lambda.yaml"
    path.write_text("spark:\n  conf:\n    on: x\n    yes: y\n")
    monkeypatch.setenv("LAMBDA_CONFIG", str(path))
    assert load_settings().spark.conf == {"on": "x", "yes": "y"}


def test_a_value_yaml_reads_as_a_date(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    message = file_error(monkeypatch, tmp_path, "stack:\n  data_dir: 2026-01-01\n")
    assert message.startswith("<file>:2:13: stack.data_dir: 2026-01-01 reads as a timestamp")
    assert "quote it" in message


@pytest.mark.parametrize(
    ("written", "instead", "key", "words"),
    [
        (
            "grace: 2m",
            "grace: 99999999999999999999d",
            "metrics.0.grace: '99999999999999999999d' is longer than",
            "36500d",
        ),
        (
            "windows: [1m, 1h, 1d]",
            "windows: [\uff11m, 1h, 1d]",
            "metrics.0.windows.0: '\uff11m' is not a duration",
            "ASCII digits 0-9",
        ),
        (
            "schedule: hourly",
            "schedule: '61 * * * *'",
            "batch.schedule: cron '61 * * * *', minute field '61'",
            "outside 0-59",
        ),
    ],
    ids=["absurd-duration", "full-width-digit", "cron-out-of-range"],
)
def test_validation_errors_name_the_line(
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    written: str,
    instead: str,
    key: str,
    words: str,
) -> None:
    content = DESIGN_EXAMPLE.replace(written, instead)
    message = file_error(monkeypatch, tmp_path, content)
    setting = instead.split(":")[0]
    line = next(n for n, text in enumerate(content.splitlines(), 1) if f"{setting}:" in text)
    assert f"<file>:{line}: {key}" in message
    assert words in message


def test_a_missing_field_is_reported_at_its_mapping(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    content = DESIGN_EXAMPLE.replace("    windows: [1m, 1h, 1d]\n", "")
    message = file_error(monkeypatch, tmp_path, content)
    line = content.splitlines().index("  - name: views_by_page") + 1
    assert f"<file>:{line}: metrics.0.windows: Field required" in message


SLOW_VIEWS = """  - name: views_slow
    source: pageviews
    key: [page, bucket]
    value: latency_ms
    aggregations: [count, quantiles(slowness)]
    windows: [1m]
"""


@pytest.mark.parametrize(
    ("definition", "key", "words"),
    [
        (
            '    where: "latency_ms / 0 > 1"\n    fields: {bucket: "page"}\n',
            "where",
            "metric 'views_slow': where: never TRUE for any event ('latency_ms / 0' is always "
            "NULL: division by zero), so the metric would count nothing; fix or remove the filter",
        ),
        (
            '    where: "page = NULL OR latency_ms > 1 AND FALSE"\n    fields: {bucket: "page"}\n',
            "where",
            "'page = NULL' is always NULL: a comparison with NULL is NULL; test IS NULL",
        ),
        (
            "    fields: {bucket: \"CASE WHEN latency_ms % 0 > 1 THEN 'slow' END\"}\n",
            "metric",
            "metric 'views_slow': fields.bucket is NULL for every event (\"CASE WHEN (latency_ms "
            "% 0) > 1 THEN 'slow' ELSE NULL END\" is always NULL: no branch is ever taken), and "
            "the metric reads it as a key dimension: every event would be skipped as key_missing",
        ),
        (
            '    fields: {bucket: "page", slowness: "latency_ms + NULL"}\n',
            "metric",
            "fields.slowness is NULL for every event ('latency_ms + NULL' is always NULL: an "
            "operand is NULL), and the metric reads it as the field of quantiles(slowness): "
            "every event would be skipped as quantile_missing",
        ),
    ],
    ids=["division-by-zero", "null-comparison", "null-key", "null-sketch-field"],
)
def test_a_definition_that_counts_nothing_is_refused(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, definition: str, key: str, words: str
) -> None:
    """Before, each loaded without a word, and the metric counted nothing (or skipped every
    event) for good."""
    content = DESIGN_EXAMPLE.replace(
        "batch:", "  " + SLOW_VIEWS.strip() + "\n" + definition + "batch:"
    )
    message = file_error(monkeypatch, tmp_path, content)
    lines = content.splitlines()
    line = lines.index("  - name: views_slow") + 1
    if key == "where":
        line = next(n for n, text in enumerate(lines, 1) if text.startswith("    where:"))
    where = "metrics.1.where" if key == "where" else "metrics.1"
    assert f"<file>:{line}: {where}: " in message
    assert words in message


def test_a_definition_some_event_counts_in_loads(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    definition = (
        '    where: "latency_ms / 2 > 1 OR latency_ms / 0 > 1"\n'
        '    fields: {bucket: "COALESCE(latency_ms / 0, 1)", slowness: "latency_ms * 0"}\n'
    )
    content = DESIGN_EXAMPLE.replace(
        "batch:", "  " + SLOW_VIEWS.strip() + "\n" + definition + "batch:"
    )
    write_config(monkeypatch, tmp_path, content)
    assert [m.name for m in load_settings().metrics] == ["views_by_page", "views_slow"]


def test_an_env_override_is_named_instead_of_a_line(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("LAMBDA_SERVING__MAX_CELLS", "0")
    message = file_error(monkeypatch, tmp_path, DESIGN_EXAMPLE + "serving:\n  max_cells: 5\n")
    assert "  serving.max_cells (from LAMBDA_SERVING__MAX_CELLS): " in message
    assert "<file>" not in message


def test_merged_keys_are_not_duplicates(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """An explicit key overrides one merged from an anchor (`<<: *views`), as YAML says."""
    content = DESIGN_EXAMPLE.replace(
        "  - name: views_by_page\n", "  - &views\n    name: views_by_page\n"
    ).replace("    grace: 2m\n", "    grace: 2m\n  - <<: *views\n    name: again\n    grace: 5m\n")
    write_config(monkeypatch, tmp_path, content)
    settings = load_settings()
    assert [(m.name, m.grace) for m in settings.metrics] == [
        ("views_by_page", 2 * MIN),
        ("again", 5 * MIN),
    ]


def test_lambdactl_prints_one_line_and_no_traceback(tmp_path: Path) -> None:
    path = tmp_path / "broken.yaml"
    path.write_text(DESIGN_EXAMPLE.replace("    grace: 2m\n", "    grace: 2m\n    grace: 5m\n"))
    env = {k: v for k, v in os.environ.items() if not k.startswith("LAMBDA_")}
    done = subprocess.run(
        [sys.executable, "-m", "lambdactl", "topics", "check"],
        env={**env, "LAMBDA_CONFIG": str(path), "COLUMNS": "60"},
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    output = done.stdout + done.stderr
    assert done.returncode != 0
    assert "Traceback" not in output
    (line,) = output.strip().splitlines()
    assert line.startswith(f"{path}:")
    assert "duplicate key 'grace'" in line


# --------------------------------------------------------------------------- durations


@pytest.mark.parametrize(
    ("text", "ms"), [("30s", 30_000), (" 5m ", 5 * MIN), ("36500d", MAX_DURATION_MS), (0, 0)]
)
def test_durations(text: str | int, ms: int) -> None:
    assert parse_duration(text) == ms


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("36501d", "maximum 36500d"),
        ("9" * 5000 + "s", "maximum 36500d"),
        (MAX_DURATION_MS + 1, "maximum 36500d"),
        ("\uff11m", "ASCII digits"),
        ("\u0661m", "ASCII digits"),  # Arabic-Indic one
        ("1.5m", "<number><unit>"),
        (1.5, "such as '30s'"),
        (True, "such as '30s'"),
    ],
)
def test_bad_durations(text: object, why: str) -> None:
    with pytest.raises(ValueError, match=re.escape(why)):
        parse_duration(text)  # type: ignore[arg-type]


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


# --------------------------------------------------------------------------- sessions


def _session_metric(**session: str) -> dict[str, Any]:
    config = example()
    config["metrics"][0]["session"] = session
    return config


@pytest.mark.parametrize(
    ("session", "words"),
    [
        ({"gap": "30m", "max_duration": "30m"}, ["gap 30m must be shorter than max_duration 30m"]),
        ({"gap": "2h", "max_duration": "1h"}, ["gap 2h must be shorter than max_duration 1h"]),
        ({"gap": "0s", "max_duration": "1h"}, ["gap must be a positive duration"]),
        ({"gap": "30m"}, ["max_duration", "Field required"]),
        ({"gap": "30m", "max_duration": "12h", "timeout": "1h"}, ["timeout"]),
    ],
)
def test_a_bad_session_is_refused_at_load_with_what_to_change(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, session: dict[str, str], words: list[str]
) -> None:
    message = config_error(monkeypatch, tmp_path, _session_metric(**session))
    assert "metrics.0.session" in message
    for word in words:
        assert word in message


def test_a_session_metric_needs_a_session_key(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    config = _session_metric(gap="30m", max_duration="12h")
    config["metrics"][0]["key"] = []
    message = config_error(monkeypatch, tmp_path, config)
    assert "metrics.0" in message
    assert "a session metric needs a key" in message


def test_a_valid_session_metric_loads_with_its_parts(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    write_config(monkeypatch, tmp_path, _session_metric(gap="30m", max_duration="12h"))
    settings = load_settings()
    metric = settings.plan("views_by_page")
    assert metric is not None and metric.sessions is not None
    assert metric.sessions.rule.max_duration_ms == 12 * 3_600_000
    assert settings.plan("views_by_page(sessions)") is not None
    assert settings.plan("views_by_page(bounces)") is not None


# --------------------------------------------------------------------------- retention


def _retained(retention: dict[str, str]) -> dict[str, Any]:
    config = example()
    config["metrics"][0]["retention"] = retention
    return config


@pytest.mark.parametrize(
    ("retention", "words"),
    [
        ({"2h": "7d"}, ["retention names window 2h", "not one of the metric's windows"]),
        ({"1h": "30m"}, ["retention of window 1h is 30m, less than one window"]),
        ({"1m": "7d", "1h": "1d"}, ["window 1h must be kept at least as long as", "1d < 7d"]),
        ({"1h": "7d"}, ["window 1h must be kept at least as long as the finer 1m", "7d < forever"]),
        ({"1m": "soon"}, ["retention.1m", "soon"]),
    ],
)
def test_a_bad_retention_is_refused_at_load_with_what_to_change(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, retention: dict[str, str], words: list[str]
) -> None:
    message = config_error(monkeypatch, tmp_path, _retained(retention))
    assert "metrics.0" in message
    for word in words:
        assert word in message


def test_retention_loads_per_window_and_is_not_part_of_the_version() -> None:
    config = _retained({"1m": "7d", "1h": "400d"})
    settings = Settings(**config)
    plan = settings.plan("views_by_page")
    assert plan is not None
    assert plan.windows.retention_ms == ((MIN, 7 * DAY), (HOUR, 400 * DAY))
    assert version_of(config) == version_of(example()), "changing it needs no full run"


def test_a_session_metric_keeps_its_base_window_at_least_max_duration(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    config = _session_metric(gap="30m", max_duration="12h")
    config["metrics"][0]["retention"] = {"1m": "6h"}
    message = config_error(monkeypatch, tmp_path, config)
    assert "keeps its base window 1m at least max_duration (12h), not 6h" in message
    config["metrics"][0]["retention"] = {"1m": "12h"}
    write_config(monkeypatch, tmp_path, config)
    assert load_settings().plan("views_by_page") is not None


@pytest.mark.parametrize(
    ("source", "message"),
    [
        ({"id_field": None, "dedup_horizon": "7d"}, "dedup_horizon needs an id_field"),
        ({"dedup_horizon": "1m"}, "shorter than its base window plus grace (3m)"),
    ],
)
def test_a_dedup_horizon_needs_ids_and_must_outlast_the_speed_cells(
    source: dict[str, Any], message: str
) -> None:
    config: dict[str, Any] = {
        "sources": [{"name": "pv", "topic": "pv", "time_field": "ts", "id_field": "id", **source}],
        "metrics": [
            {"name": "m", "source": "pv", "windows": ["1m"], "grace": "2m"},
        ],
    }
    with pytest.raises(ValueError, match=re.escape(message)):
        Settings(**config)
    config["sources"][0]["dedup_horizon"] = "3m"
    config["sources"][0]["id_field"] = "id"
    assert Settings(**config).sources[0].dedup_horizon == 3 * 60_000
