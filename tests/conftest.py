"""Fixtures for tests that need the real services.

`stack` brings up the local stack (Apache Kafka, Redis, PostgreSQL) exactly as
`lambdactl stack up` does, or uses the services already reachable at the configured URLs; if
that fails the test fails loudly — it never skips. `platform` gives each test its own world:
a fresh PostgreSQL database with the schema, a flushed Redis database, uniquely named topics
and a consumer group, written to a YAML file that subprocesses read via `LAMBDA_CONFIG`.
"""

from __future__ import annotations

import contextlib
import os
import time
import uuid
import zoneinfo
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
import pytest
import yaml
from psycopg import sql

from shared.config import RedisSettings, Settings
from shared.speed_view import redis_client

# The product reads time zones from the pinned tzdata package only (shared/expressions/zones.py),
# never the host's /usr/share/zoneinfo; the tests' references (the oracle, windowing checks) do
# the same, so both sides hold one edition of the database.
zoneinfo.reset_tzpath(to=[])

XDIST_WORKER = os.environ.get("PYTEST_XDIST_WORKER", "gw0")
"""The pytest-xdist worker running this process (`./dev test` runs two); `gw0` without xdist."""
TEST_REDIS_DB = int(os.environ.get("LP_TEST_REDIS_DB", "15")) - int(XDIST_WORKER.removeprefix("gw"))
"""Tests flush this Redis database, one per xdist worker (15, 14, ...); engineers running
suites side by side set `LP_TEST_REDIS_DB` apart by at least the number of workers."""
assert TEST_REDIS_DB >= 1, f"LP_TEST_REDIS_DB leaves worker {XDIST_WORKER} database 0 or less"
TEST_REDIS_CLUSTER = os.environ.get("LP_TEST_REDIS_CLUSTER")
"""A node of a Redis Cluster the test worlds keep the speed view in instead (set by
`tests/e2e/test_redis_cluster.py` for the suites it reruns there)."""


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The modules marked `long(seconds)` first, longest first: `./dev test` hands whole
    modules to two xdist workers in collection order (`--dist loadscope`, which also keeps a
    module's fixtures and fixed ports on one worker), and a multi-minute module handed out
    last would leave the other worker idle for its length."""

    def seconds(item: pytest.Item) -> float:
        marker = item.get_closest_marker("long")
        return float(marker.args[0]) if marker else 0.0

    items.sort(key=seconds, reverse=True)


@pytest.fixture(scope="session")
def stack() -> Settings:
    from lambdactl.stack import stack_up

    settings = Settings()
    try:
        states = stack_up(settings)
    except Exception as exc:
        pytest.fail(f"the local stack could not be started: {exc}", pytrace=False)
    down = [s.name for s in states if not s.reachable]
    if down:
        pytest.fail(f"services unreachable after `stack up`: {down}", pytrace=False)
    return settings


@dataclass
class Platform:
    settings: Settings
    config: dict[str, Any]
    config_path: Path
    env: dict[str, str]
    """The environment a subprocess (`lambdactl ...`) needs to see this test's platform."""


def reconfigured(platform: Platform, **sections: dict[str, Any] | list[Any]) -> Platform:
    """The same platform with some config sections updated (a list section, e.g. `metrics`,
    replaced), in a config file of its own."""
    config = dict(platform.config)
    for name, values in sections.items():
        config[name] = values if isinstance(values, list) else {**config.get(name, {}), **values}
    path = platform.config_path.with_name(f"lambda-{uuid.uuid4().hex[:8]}.yaml")
    path.write_text(yaml.safe_dump(config))
    return Platform(Settings(**config), config, path, {**platform.env, "LAMBDA_CONFIG": str(path)})


def _url_with_db(url: str, dbname: str) -> str:
    base, _, _ = url.rpartition("/")
    return f"{base}/{dbname}"


def platform_config(tag: str, partitions: int = 4, *, quantiles: bool = True) -> dict[str, Any]:
    """The demo's source and metrics, with this test's topic name (`quantiles=False`: without
    `quantiles(latency_ms)`, the metrics benchmarks measured before quantiles existed)."""
    config = {
        "sources": [
            {
                "name": "pageviews",
                "topic": f"pv-{tag}",
                "time_field": "ts",
                "id_field": "event_id",
                "partitions": partitions,
            }
        ],
        "tables": [],  # none: not the repo's lambda.yaml's, which fills what a config omits
        "metrics": [
            {
                "name": "views_by_page",
                "source": "pageviews",
                "key": ["page"],
                "value": "latency_ms",
                "aggregations": [
                    "count",
                    "sum",
                    "min",
                    "max",
                    "avg",
                    "distinct(user_id)",
                    "quantiles(latency_ms)",
                ],
                "windows": ["1m", "1h", "1d"],
                "grace": "2m",
            },
            {
                "name": "views_total",
                "source": "pageviews",
                "key": [],
                "aggregations": ["count", "distinct(user_id)"],
                "windows": ["1m", "1h"],
                "grace": "2m",
            },
        ],
    }
    if not quantiles:
        for metric in config["metrics"]:
            metric["aggregations"] = [
                a for a in metric["aggregations"] if not a.startswith("quantiles(")
            ]
    return config


@contextmanager
def own_platform(
    stack: Settings,
    directory: Path,
    config_of: Callable[[str], dict[str, Any]] = platform_config,
) -> Iterator[Platform]:
    """A world of its own on the local stack: a fresh PostgreSQL database with the schema
    (dropped afterwards), the flushed test Redis database, the topics and consumer group of a
    new tag (`config_of(tag)` gives the sources and metrics), in `directory/lambda.yaml`."""
    from shared.db.migrate import upgrade

    tag = uuid.uuid4().hex[:10]
    dbname = f"lp_test_{tag}"
    with psycopg.connect(stack.postgres.url, autocommit=True) as admin:
        admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(dbname)))
    try:
        pg_url = _url_with_db(stack.postgres.url, dbname)
        redis_settings = redis_for_tests(stack)
        redis_client(redis_settings).flushdb()
        upgrade(pg_url)
        config = config_of(tag)
        config.setdefault("tables", [])  # the repo's lambda.yaml would fill an omitted one
        config.update(
            {
                "kafka": {"bootstrap_servers": stack.kafka.bootstrap_servers},
                "redis": redis_settings.model_dump(),
                "postgres": {"url": pg_url},
                "speed": {"app_id": f"speed-{tag}", "session_timeout_s": 6.0},
                "spark": {"max_offsets_per_slice": 5000},
            }
        )
        config_path = directory / "lambda.yaml"
        config_path.write_text(yaml.safe_dump(config))
        env = {k: v for k, v in os.environ.items() if not k.startswith("LAMBDA_")}
        env["LAMBDA_CONFIG"] = str(config_path)
        yield Platform(Settings(**config), config, config_path, env)
    finally:
        drop_database(stack.postgres.url, dbname)
        delete_topics(stack.kafka.bootstrap_servers, tag)


def delete_topics(bootstrap_servers: str, tag: str) -> None:
    """Deletes every topic whose name holds `tag` (a world's source, its dead-letter and
    late topics, the speed worker's changelogs). Left behind, a suite run adds ~1,000
    partitions to the local broker, and a broker holding tens of thousands loads them for
    minutes at its next start. Best effort: a broker refusing deletes fails no test."""
    from confluent_kafka.admin import AdminClient

    admin = AdminClient({"bootstrap.servers": bootstrap_servers})
    with contextlib.suppress(Exception):
        names = [name for name in admin.list_topics(timeout=10).topics if tag in name]
        if names:
            for future in admin.delete_topics(names, operation_timeout=10).values():
                with contextlib.suppress(Exception):
                    future.result()


def redis_for_tests(stack: Settings) -> RedisSettings:
    """Where the test worlds keep the speed view: the stack's Redis in `TEST_REDIS_DB`, or
    the Redis Cluster of `TEST_REDIS_CLUSTER`."""
    if TEST_REDIS_CLUSTER:
        return RedisSettings(url=TEST_REDIS_CLUSTER, cluster=True)
    return RedisSettings(url=_url_with_db(stack.redis.url, str(TEST_REDIS_DB)))


@pytest.fixture
def platform(stack: Settings, tmp_path: Path) -> Iterator[Platform]:
    with own_platform(stack, tmp_path) as world:
        yield world


def drop_database(url: str, dbname: str, limit_s: float = 300.0) -> None:
    """`DROP DATABASE ... WITH (FORCE)`, retried while an autovacuum worker is in it: FORCE
    cannot end one without superuser, which the local stack's role is not (a test's writes
    can set autovacuum going in its database within a second)."""
    drop = sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(dbname))
    deadline = time.monotonic() + limit_s
    with psycopg.connect(url, autocommit=True) as admin:
        while True:
            try:
                admin.execute(drop)
                return
            except psycopg.errors.InsufficientPrivilege:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.5)


@pytest.fixture(scope="session")
def spark(stack: Settings) -> Any:
    """One in-process Spark session shared by the in-process tests (keeps CI in budget)."""
    from batch_layer import spark_session

    session = spark_session(stack)
    yield session
    session.stop()
