"""Security rules on the running platform: `lambdactl serve` outside the local profile refuses
to start without tokens (exit 2, naming the variables) unless told to run open; tokens appear
in no log line, the access log included; oversize targets, parameters and bodies are refused
(414, 400, 413) by the real server and by the app under its configured limits; a PostgreSQL
URL's TLS parameters reach libpq; and an explicitly configured PLAINTEXT Kafka works for
every client translation (no TLS or SASL broker runs here: those are unit-tested)."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import psycopg
import pytest
from fastapi.testclient import TestClient

from batch_layer.kafka_source import Slice, read_slice
from serving_layer import create_app
from serving_layer.kafka_probe import KafkaProbe
from shared.config import KafkaSettings, ServingSettings
from shared.db.connect import connect
from shared.kafka import client_config_of_options, create_topics, reader_options
from tests.conftest import Platform, own_platform
from tests.serving.api_process import running_api, start_serve

pytestmark = [pytest.mark.services, pytest.mark.timeout(180)]

READER, OPERATOR = "rdr-7f3a9c1e5b2d", "opr-2b8e6d4f0a1c"
WRONG = "wrong-9d1c7e3a5f0b"
SERIES = "/v1/metrics/views_total/series"
PRODUCTION = {"LAMBDA_PROFILE": "production", "PYTHONUNBUFFERED": "1"}


def _serve(
    platform: Platform, env: dict[str, str], log: Path, *args: str
) -> subprocess.Popen[bytes]:
    return start_serve({**platform.env, **env}, log, *args)


@contextmanager
def _server(platform: Platform, env: dict[str, str], log: Path, *args: str) -> Iterator[str]:
    with running_api({**platform.env, **env}, log, *args) as (base, _):
        yield base


def test_production_refuses_to_serve_open_unless_told(platform: Platform, tmp_path: Path) -> None:
    for workers in ("1", "2"):  # with several workers too: checked before any process starts
        log = tmp_path / f"refused-{workers}.log"
        refused = _serve(platform, {**PRODUCTION, "LAMBDA_SERVING__WORKERS": workers}, log)
        assert refused.wait(60) == 2
        said = " ".join(log.read_text().split())
        assert "profile 'production' needs API tokens" in said, said
        for name in ("LAMBDA_AUTH__READER_TOKENS", "LAMBDA_AUTH__OPERATOR_TOKENS"):
            assert name in said
        assert "LAMBDA_AUTH__ALLOW_OPEN=true" in said
    with _server(
        platform, {**PRODUCTION, "LAMBDA_AUTH__ALLOW_OPEN": "true"}, tmp_path / "open.log"
    ) as base:
        assert httpx.get(f"{base}/v1/metrics", timeout=10).status_code == 200


@pytest.fixture(scope="module")
def guarded(stack: object, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    """A production API with tokens and the access log on, its output in a file."""
    directory = tmp_path_factory.mktemp("guarded")
    log = directory / "serve.log"
    env = {
        **PRODUCTION,
        "LAMBDA_AUTH__READER_TOKENS": READER,
        "LAMBDA_AUTH__OPERATOR_TOKENS": f'["{OPERATOR}"]',
    }
    with (
        own_platform(stack, directory) as platform,  # type: ignore[arg-type]
        _server(platform, env, log, "--access-log") as base,
    ):
        yield base, log


def _bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def test_tokens_are_never_logged(guarded: tuple[str, Path]) -> None:
    base, log = guarded
    query = {"window": "1m", "start": "0", "end": "60000"}
    with httpx.Client(base_url=base, timeout=10) as client:
        assert client.get(SERIES, params=query).status_code == 401
        refused = client.get(SERIES, params=query, headers=_bearer(WRONG))
        assert refused.status_code == 401 and WRONG not in refused.text
        assert client.get(SERIES, params=query, headers=_bearer(READER)).status_code == 200
        runs = "/v1/batch/runs"
        assert client.post(runs, json={"mode": "full"}, headers=_bearer(READER)).status_code == 403
        queued = client.post(runs, json={"mode": "full"}, headers=_bearer(OPERATOR))
        assert queued.status_code == 202
        bad = client.post(runs, json={"mode": "sideways"}, headers=_bearer(OPERATOR))
        assert bad.status_code == 400 and OPERATOR not in bad.text
    deadline = time.monotonic() + 10
    while log.read_text().count('"GET /v1/metrics/views_total/series') < 3:
        assert time.monotonic() < deadline, f"the access log shows no requests: {log.read_text()}"
        time.sleep(0.1)
    logged = log.read_text()
    assert '" 401' in logged and '" 200' in logged and '" 202' in logged, "the access log runs"
    assert not [t for t in (READER, OPERATOR, WRONG) if t in logged], logged


def test_the_real_server_bounds_targets_parameters_and_bodies(guarded: tuple[str, Path]) -> None:
    base, _ = guarded
    limits = ServingSettings()
    query = {"window": "1m", "start": "0", "end": "60000"}

    def chunks(total: int) -> Iterator[bytes]:
        for _ in range(total // 4096):
            yield b" " * 4096

    with httpx.Client(base_url=base, timeout=10, headers=_bearer(OPERATOR)) as client:
        long_url = client.get(SERIES, params={**query, "pad": "x" * limits.max_url_bytes})
        assert long_url.status_code == 414, long_url.text
        assert "LAMBDA_SERVING__MAX_URL_BYTES" in long_url.json()["detail"]
        long_value = client.get(
            "/v1/metrics/views_by_page/keys",
            params={"start": "0", "end": "60000", "prefix": "/" * (limits.max_param_chars + 1)},
        )
        assert long_value.status_code == 400, long_value.text
        assert f"limit of {limits.max_param_chars}" in long_value.json()["detail"]
        oversize = b"{" + b" " * limits.max_body_bytes + b"}"
        announced = client.post("/v1/batch/runs", content=oversize)
        assert announced.status_code == 413, announced.text
        assert "LAMBDA_SERVING__MAX_BODY_BYTES" in announced.json()["detail"]
        streamed = client.post("/v1/batch/runs", content=chunks(2 * limits.max_body_bytes))
        assert streamed.status_code == 413, streamed.text
        assert "LAMBDA_SERVING__MAX_BODY_BYTES" in streamed.json()["detail"]
        assert client.post("/v1/batch/runs", json={"mode": "full"}).status_code == 202


def test_the_app_applies_its_configured_limits(platform: Platform) -> None:
    serving = platform.settings.serving.model_copy(
        update={"max_url_bytes": 400, "max_param_chars": 20, "max_body_bytes": 100}
    )
    settings = platform.settings.model_copy(update={"serving": serving})
    keys = "/v1/metrics/views_by_page/keys"
    with TestClient(create_app(settings)) as client:
        assert client.get(SERIES, params={"window": "1m", "pad": "x" * 400}).status_code == 414
        at_limit = {"start": "0", "end": "60000", "prefix": "é" * 20}  # 20 characters, 120 bytes
        assert client.get(keys, params=at_limit).status_code == 200
        over = client.get(keys, params={**at_limit, "page": "p" * 21})
        assert over.status_code == 400, over.text
        assert over.json()["detail"].startswith("query parameter 'page' is 21 characters long")
        assert "LAMBDA_SERVING__MAX_PARAM_CHARS" in over.json()["detail"]
        runs, json_type = "/v1/batch/runs", {"content-type": "application/json"}
        body = b'{"mode": "full"' + b" " * 100 + b"}"
        assert client.post(runs, content=body, headers=json_type).status_code == 413
        assert client.post(runs, content=iter([body]), headers=json_type).status_code == 413
        fits = iter([b'{"mode": ', b'"full"}'])  # streamed, within the limit
        assert client.post(runs, content=fits, headers=json_type).status_code == 202


def test_postgres_tls_parameters_reach_libpq(platform: Platform) -> None:
    """The local PostgreSQL has TLS off: a URL that requires it is refused by libpq, which
    shows the parameter reached it through the platform's connection helper."""
    with pytest.raises(psycopg.OperationalError, match="SSL was required"):
        connect(platform.settings.postgres.url + "?sslmode=require").close()
    connect(platform.settings.postgres.url + "?sslmode=disable").close()


def test_explicit_plaintext_kafka_works_for_every_client(platform: Platform) -> None:
    create_topics(platform.settings)
    env = {**platform.env, "LAMBDA_KAFKA__SECURITY_PROTOCOL": "PLAINTEXT"}
    produced = subprocess.run(
        [sys.executable, "-m", "lambdactl", "produce", "--events", "300", "--duplicates", "0"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert produced.returncode == 0, produced.stdout + produced.stderr
    sent = int(produced.stdout.split("sent ")[1].split()[0])
    kafka = KafkaSettings(
        bootstrap_servers=platform.settings.kafka.bootstrap_servers, security_protocol="PLAINTEXT"
    )
    with TestClient(create_app(platform.settings.model_copy(update={"kafka": kafka}))) as api:
        assert api.get("/readyz").json()["checks"]["kafka"] == "ok"
    source = platform.settings.sources[0]
    probe = KafkaProbe(kafka, timeout_s=10)
    ends = probe.end_offsets(source.topic, source.partitions)
    probe.close()
    assert ends is not None and sum(ends.values()) == sent
    client = client_config_of_options(reader_options(kafka))
    read = sum(
        len(records.offsets)
        for partition, end in ends.items()
        for records in read_slice(client, source.topic, Slice(partition, 0, end))
    )
    assert read == sent
