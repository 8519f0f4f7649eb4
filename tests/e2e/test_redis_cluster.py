"""The speed view on a Redis Cluster (#14): three masters started here, and the speed layer's
exactness tests — the processor against the oracle, late and duplicate events, kill -9 and
restart, a lost view rebuilt, cleanup — plus the serving layer's merged series and the walking
skeleton, rerun with every test world keeping its speed view on the cluster. Each partition's
fenced apply stays in its slot (its keys share a hash tag); the serving layer reads across the
slots. Afterwards the view the last test left behind is on the cluster."""

from __future__ import annotations

from pathlib import Path

import pytest
import redis

from tests.e2e.support import rerun_suites
from tests.redis_cluster import local_redis_cluster

pytestmark = [pytest.mark.services, pytest.mark.long(180), pytest.mark.timeout(900)]

SUITES = [
    "tests/speed/test_processor.py",
    "tests/speed/test_late_and_duplicates.py",
    "tests/speed/test_crash_recovery.py::test_kill_after_apply_before_commit_then_restart",
    "tests/speed/test_crash_recovery.py::test_two_workers_one_killed_survivor_takes_over",
    "tests/speed/test_rebuild.py",
    "tests/speed/test_cleanup.py",
    "tests/speed/test_sessions.py",
    "tests/speed/test_speed_view_writer.py",
    "tests/serving/test_series.py",
    "tests/e2e/test_walking_skeleton.py",
]
"""The exactness tests rerun on the cluster: the speed layer's against Redis (not its pure
logic, dead letters or rebalancing, which the cluster does not touch), the merged series and
the walking skeleton."""


def test_the_exactness_tests_pass_with_the_speed_view_on_a_redis_cluster(tmp_path: Path) -> None:
    with local_redis_cluster(tmp_path) as masters:
        summary = rerun_suites(SUITES, {"LP_TEST_REDIS_CLUSTER": masters[0]}, timeout_s=840)
        print(f"on the Redis Cluster: {summary}")
        sizes = {url: redis.Redis.from_url(url).dbsize() for url in masters}
        print(f"keys the last test left on each master: {sizes}")
        assert sum(sizes.values()) > 0, "the test worlds wrote their speed view elsewhere"
