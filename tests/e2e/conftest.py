"""Fixtures of the end-to-end tests."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import Platform
from tests.e2e.fault_world import World, open_world


@pytest.fixture
def fault_world(platform: Platform, tmp_path: Path) -> Iterator[World]:
    """The platform on stores of its own, for the whole-platform fault tests."""
    with open_world(platform, tmp_path) as world:
        yield world
