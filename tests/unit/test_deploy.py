"""The production deployment files, checked without a container engine (none runs here): they
parse; every `lambdactl` command and option they use exists in the CLI; every `LAMBDA_*` name
they (and docs/operations.md) set is a setting; images are pinned; `depends_on` names real
services; the Kafka cluster keeps 3 replicas with min.insync.replicas 2; Prometheus scrapes
services that exist; the Grafana dashboard queries only metrics the code declares."""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path
from typing import Any

import pytest
import typer.main
import yaml
from pydantic import BaseModel

from lambdactl.cli import app as cli_app
from shared.config import Settings

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
COMPOSE = yaml.safe_load((DEPLOY / "compose.yaml").read_text())
SERVICES: dict[str, Any] = COMPOSE["services"]
ENV_NAME = re.compile(r"\bLAMBDA_[A-Z0-9_]+\b")
NOT_SETTINGS = {"LAMBDA_CONFIG", "LAMBDA_FAULT"}
"""The config file's path and the fault points of tests: read by the code, not settings."""


def setting_exists(name: str) -> bool:
    """Whether `LAMBDA_A__B` names a field of `Settings` (nested models walked by `__`)."""
    model: type[BaseModel] = Settings
    parts = name.removeprefix("LAMBDA_").lower().split("__")
    for n, part in enumerate(parts):
        field = model.model_fields.get(part)
        if field is None:
            return False
        inner = field.annotation
        if n < len(parts) - 1:
            if not (isinstance(inner, type) and issubclass(inner, BaseModel)):
                return False
            model = inner
    return True


def cli_accepts(argv: list[str]) -> str | None:
    """None when `lambdactl <argv>` names a command and only options it has; else why not."""
    command: Any = typer.main.get_command(cli_app)  # typer's own click: groups duck-typed
    words = list(argv)
    while hasattr(command, "commands") and words and not words[0].startswith("-"):
        sub = command.commands.get(words[0])
        if sub is None:
            return f"no command {words[0]!r} in `lambdactl {' '.join(argv)}`"
        command, words = sub, words[1:]
    if hasattr(command, "commands"):
        return f"`lambdactl {' '.join(argv)}` names a group, not a command"
    known = {opt for p in command.params for opt in getattr(p, "opts", [])}
    unknown = [w.split("=")[0] for w in words if w.startswith("--")]
    missing = [w for w in unknown if w not in known]
    return f"`lambdactl {' '.join(argv)}`: unknown {missing}" if missing else None


def _lambdactl_commands() -> list[list[str]]:
    """Every lambdactl command line of the deployment: compose commands of app services (the
    image's entry point is lambdactl) and the systemd units' ExecStart lines."""
    lines = []
    for service in SERVICES.values():
        if service.get("image", "").startswith("lambda-platform") and "entrypoint" not in service:
            lines.append([str(w) for w in service.get("command", [])])
    for unit in (DEPLOY / "systemd").glob("*.service"):
        for exec_line in re.findall(r"^ExecStart=(.*)$", unit.read_text(), re.M):
            words = shlex.split(exec_line)
            lines.append(words[1:])
    return lines


def _deployment_texts() -> dict[str, str]:
    files = [DEPLOY / "compose.yaml", DEPLOY / ".env.example", *DEPLOY.glob("systemd/*")]
    texts = {str(f.relative_to(ROOT)): f.read_text() for f in files}
    operations = (ROOT / "docs" / "operations.md").read_text()
    texts["docs/operations.md (code)"] = "\n".join(re.findall(r"`([^`]+)`", operations))
    return texts


def test_the_checks_themselves_can_fail() -> None:
    assert setting_exists("LAMBDA_KAFKA__BOOTSTRAP_SERVERS")
    assert setting_exists("LAMBDA_SERVING__WORKERS") and setting_exists("LAMBDA_PROFILE")
    assert not setting_exists("LAMBDA_KAFKA__BOOTSTRAP")
    assert not setting_exists("LAMBDA_PROFILE__X")
    assert cli_accepts(["serve", "--workers", "2"]) is None
    assert cli_accepts(["serve", "--threads", "2"]) is not None
    assert cli_accepts(["batch", "runner"]) is None
    assert cli_accepts(["batch"]) is not None
    assert cli_accepts(["speeds"]) is not None


def test_every_lambdactl_command_exists() -> None:
    commands = _lambdactl_commands()
    assert len(commands) >= 8, commands  # compose's app services and the systemd units
    assert [problem for argv in commands if (problem := cli_accepts(argv))] == []


def test_every_environment_name_is_a_setting() -> None:
    used = {
        (where, name)
        for where, text in _deployment_texts().items()
        for name in ENV_NAME.findall(text)
    }
    assert len({name for _, name in used}) >= 8
    wrong = sorted(
        (where, name)
        for where, name in used
        if name not in NOT_SETTINGS and not setting_exists(name)
    )
    assert wrong == []


def test_images_are_pinned_and_dependencies_exist() -> None:
    for name, service in SERVICES.items():
        image = service["image"]
        tag = image.rpartition(":")[2]
        assert ":" in image and tag not in ("latest", ""), f"{name}: pin {image}"
        depends = service.get("depends_on", [])
        for needed in depends if isinstance(depends, list) else depends.keys():
            assert needed in SERVICES, f"{name} depends on unknown service {needed}"


@pytest.mark.parametrize("broker", ["kafka-1", "kafka-2", "kafka-3"])
def test_kafka_keeps_three_replicas_and_two_in_sync(broker: str) -> None:
    env = SERVICES[broker]["environment"]
    assert env["KAFKA_DEFAULT_REPLICATION_FACTOR"] == "3"
    assert env["KAFKA_MIN_INSYNC_REPLICAS"] == "2"
    assert env["KAFKA_OFFSETS_TOPIC_REPLICATION_FACTOR"] == "3"
    assert env["KAFKA_CONTROLLER_QUORUM_VOTERS"].count("@") == 3
    app_env = SERVICES["speed"]["environment"]
    assert broker in app_env["LAMBDA_KAFKA__BOOTSTRAP_SERVERS"]


def test_the_platform_runs_as_production_through_spark() -> None:
    env = SERVICES["batch-runner"]["environment"]
    assert env["LAMBDA_PROFILE"] == "production"
    assert env["LAMBDA_SPARK__MASTER"] == "spark://spark-master:7077"
    assert "spark://spark-master:7077" in SERVICES["spark-worker"]["entrypoint"]
    assert SERVICES["speed"]["deploy"]["replicas"] >= 2
    example = (DEPLOY / ".env.example").read_text()
    for secret in ("LAMBDA_AUTH__READER_TOKENS", "LAMBDA_AUTH__OPERATOR_TOKENS"):
        assert secret in example  # production refuses to serve without them


def test_prometheus_scrapes_services_that_exist() -> None:
    config = yaml.safe_load((DEPLOY / "prometheus.yml").read_text())
    hosts = set()
    for job in config["scrape_configs"]:
        for static in job.get("static_configs", []):
            hosts |= {t.split(":")[0] for t in static["targets"]}
        for sd in job.get("dns_sd_configs", []):
            hosts |= set(sd["names"])
    assert hosts and hosts <= set(SERVICES), hosts - set(SERVICES)
    speed_port = SERVICES["speed"]["environment"]["LAMBDA_SPEED__METRICS_PORT"]
    ports = {sd["port"] for j in config["scrape_configs"] for sd in j.get("dns_sd_configs", [])}
    assert int(speed_port) in ports


def test_grafana_dashboard_queries_declared_metrics() -> None:
    dashboard = json.loads((DEPLOY / "grafana" / "lambda-platform.json").read_text())
    exprs = re.findall(r'"expr":\s*"((?:[^"\\]|\\.)*)"', json.dumps(dashboard))
    assert exprs
    declared = "\n".join(
        p.read_text()
        for layer in ("serving_layer", "speed_layer", "batch_layer")
        for p in (ROOT / layer).rglob("*.py")
    )
    names = {m for expr in exprs for m in re.findall(r"\b([a-z_]+)\{", expr)}
    assert names

    def is_declared(name: str) -> bool:  # prometheus-client adds _total, _bucket...
        bare = re.sub(r"_(bucket|total|count|sum)$", "", name)
        return f'"{name}"' in declared or f'"{bare}"' in declared

    missing = sorted(n for n in names if not is_declared(n))
    assert missing == []
    provisioning = DEPLOY / "grafana" / "provisioning"
    for path in provisioning.rglob("*.yml"):
        assert yaml.safe_load(path.read_text())["apiVersion"] == 1
