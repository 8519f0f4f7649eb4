"""Schemathesis against the app's own OpenAPI, in process: no 5xx for any generated input,
and every response matches the schema (status codes, content type, body)."""

from __future__ import annotations

import random

import pytest
import schemathesis
from fastapi import FastAPI
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, given, settings
from schemathesis.checks import (
    content_type_conformance,
    not_a_server_error,
    response_schema_conformance,
    status_code_conformance,
)

from serving_layer import create_app
from tests.conftest import Platform
from tests.serving.views import batch_rows, publish, random_events, write_speed

T0 = 1_767_225_600_000


CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_schema_conformance,
]


@pytest.mark.services
@pytest.mark.timeout(300)
def test_api_conforms_to_its_schema(platform: Platform) -> None:
    settings_ = platform.settings
    events = random_events(random.Random(2), T0 - 3_600_000, T0 + 3_600_000, 300, ["/", "/a"])
    rows, ws = [], {}
    for metric in settings_.plans.values():
        rows += batch_rows(settings_, metric, events, T0)
        ws[metric.name] = T0
        write_speed(settings_, metric, events, T0)
    publish(settings_, rows, ws)
    app: FastAPI = create_app(settings_)
    with TestClient(app):  # runs the lifespan: pools and clients live on app.state
        schema = schemathesis.openapi.from_asgi("/openapi.json", app)
        operations = [result.ok() for result in schema.get_all_operations()]
        assert len(operations) >= 10
        for operation in operations:

            @given(case=operation.as_strategy())
            @settings(
                max_examples=30,
                deadline=None,
                database=None,
                suppress_health_check=list(HealthCheck),
            )
            def conforms(case: schemathesis.Case) -> None:
                case.call_and_validate(checks=CHECKS)

            conforms()
