"""Serving tests: an app over this test's platform (fresh PostgreSQL database, flushed Redis)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from fastapi.testclient import TestClient

from serving_layer import create_app
from tests.conftest import Platform


@pytest.fixture
def client(platform: Platform) -> Iterator[TestClient]:
    with TestClient(create_app(platform.settings)) as test_client:
        yield test_client
