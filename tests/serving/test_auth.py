"""The auth matrix: open endpoints, reader routes, operator routes; 401/403 with a message."""

from __future__ import annotations

import logging

import pytest
from fastapi.testclient import TestClient

from serving_layer import create_app
from shared.config import AuthSettings
from tests.conftest import Platform

pytestmark = [pytest.mark.services, pytest.mark.timeout(120)]

READER, OPERATOR = "r3ader-t0ken", "0perator-t0ken"
OPEN = ["/healthz", "/metrics", "/", "/docs", "/openapi.json", "/static/app.js"]
READ = [
    "/v1/metrics",
    "/v1/metrics/views_total/series?window=1m&start=0&end=60000",
    "/v1/metrics/views_total/top?window=1m&at=0",
    "/v1/metrics/views_total/keys?start=0&end=60000",
    "/v1/status",
]
OPERATE = [("GET", "/v1/batch/runs"), ("POST", "/v1/batch/runs"), ("GET", "/v1/batch/runs/1")]


def _call(client: TestClient, method: str, path: str, token: str | None) -> int:
    headers = {} if token is None else {"Authorization": f"Bearer {token}"}
    if method == "POST":
        return client.post(path, json={"mode": "full"}, headers=headers).status_code
    return client.get(path, headers=headers).status_code


def test_auth_matrix(platform: Platform, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    settings = platform.settings.model_copy(
        update={"auth": AuthSettings(reader_tokens=(READER,), operator_tokens=(OPERATOR,))}
    )
    with TestClient(create_app(settings)) as client:
        for path in OPEN:
            assert _call(client, "GET", path, None) == 200, path
        for path in READ:
            assert _call(client, "GET", path, None) == 401, path
            assert _call(client, "GET", path, "wrong") == 401, path
            assert _call(client, "GET", path, READER) == 200, path
            assert _call(client, "GET", path, OPERATOR) == 200, path
        for method, path in OPERATE:
            assert _call(client, method, path, None) == 401, path
            assert _call(client, method, path, READER) == 403, path
            assert _call(client, method, path, OPERATOR) in (200, 202, 404), path
        missing = client.get("/v1/metrics")
        assert "Authorization: Bearer" in missing.json()["detail"]
        assert missing.headers["www-authenticate"] == "Bearer"
        assert (
            "unknown token"
            in client.get("/v1/metrics", headers={"Authorization": "Bearer nope"}).json()["detail"]
        )
        forbidden = client.get("/v1/batch/runs", headers={"Authorization": f"Bearer {READER}"})
        assert "operator token" in forbidden.json()["detail"]
        assert client.get("/readyz").status_code in (200, 503)
    logged = caplog.text
    assert READER not in logged and OPERATOR not in logged


def test_open_when_no_tokens(client: TestClient) -> None:
    assert client.get("/v1/metrics").status_code == 200
    assert client.post("/v1/batch/runs", json={"mode": "full"}).status_code == 202
