"""The speed view on a Redis Cluster (#14): three masters started here, and the speed layer's
exactness tests — the processor against the oracle, late and duplicate events, kill -9 and
restart, a lost view rebuilt, cleanup — plus the serving layer's merged series and the walking
skeleton, rerun with every test world keeping its speed view on the cluster. Each partition's
fenced apply stays in its slot (its keys share a hash tag); the serving layer reads across the
slots. Afterwards the view the last test left behind is on the cluster."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import redis

from tests.redis_cluster import local_redis_cluster

pytestmark = [pytest.mark.services, pytest.mark.timeout(900)]

SUITES = [
    "tests/speed",
    "tests/serving/test_series.py",
    "tests/e2e/test_walking_skeleton.py",
]
"""The exactness tests rerun on the cluster (tests of pure logic in them run again too, which
costs little and keeps the list simple)."""


def test_the_exactness_tests_pass_with_the_speed_view_on_a_redis_cluster(tmp_path: Path) -> None:
    with local_redis_cluster(tmp_path) as masters:
        env = {**os.environ, "LP_TEST_REDIS_CLUSTER": masters[0]}
        run = subprocess.run(
            [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *SUITES],
            env=env,
            capture_output=True,
            text=True,
            timeout=840,
        )
        summary = run.stdout.strip().splitlines()[-1] if run.stdout.strip() else ""
        print(f"on the Redis Cluster: {summary}")
        assert run.returncode == 0, f"{run.stdout[-6000:]}\n{run.stderr[-3000:]}"
        assert " passed" in summary and "skipped" not in summary, summary
        sizes = {url: redis.Redis.from_url(url).dbsize() for url in masters}
        print(f"keys the last test left on each master: {sizes}")
        assert sum(sizes.values()) > 0, "the test worlds wrote their speed view elsewhere"
