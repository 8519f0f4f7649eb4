"""Every benchmark module imports. Benchmarks run by hand, so nothing else notices when a
refactoring leaves one importing a name that moved (bench/serve.py did, unnoticed for a day)."""

from __future__ import annotations

import importlib
import pkgutil

import pytest

import bench

MODULES = sorted(module.name for module in pkgutil.iter_modules(bench.__path__))


def test_every_benchmark_is_found() -> None:
    assert {"batch", "serve", "serve_sessions", "speed", "soak", "tables"} <= set(MODULES)


@pytest.mark.parametrize("name", MODULES)
def test_benchmark_imports(name: str) -> None:
    importlib.import_module(f"bench.{name}")
