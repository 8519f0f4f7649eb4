"""Redis clients for the speed view, built from `RedisSettings` alone: one server, or a Redis
Cluster (`redis.cluster: true`) whose nodes are discovered from the URL's node."""

from __future__ import annotations

from typing import Any, cast

import redis
import redis.asyncio as aioredis
from redis.asyncio.cluster import RedisCluster as AsyncRedisCluster
from redis.cluster import RedisCluster
from redis.commands.core import Script
from redis.exceptions import RedisClusterException

from shared.config import RedisSettings

SyncRedis = redis.Redis | RedisCluster
AsyncRedis = aioredis.Redis | AsyncRedisCluster

REDIS_FAILURES: tuple[type[Exception], ...] = (redis.RedisError, RedisClusterException)
"""What a Redis outage raises: redis-py's errors, and on a cluster also a slot no reachable
master covers (`SlotNotCoveredError` is not a `RedisError`)."""


def redis_client(settings: RedisSettings, **options: Any) -> SyncRedis:
    """A blocking client; `options` are redis-py's (timeouts, pool size)."""
    if settings.cluster:
        return cast(RedisCluster, _ClusterOnFirstUse(settings.url, options))
    return redis.Redis.from_url(settings.url, **options)


def redis_client_async(settings: RedisSettings, **options: Any) -> AsyncRedis:
    """An asyncio client; `options` are redis-py's (timeouts, pool size)."""
    if settings.cluster:
        return AsyncRedisCluster.from_url(settings.url, **options)
    return aioredis.Redis.from_url(settings.url, **options)


class _ClusterOnFirstUse:
    """A blocking `RedisCluster` built when first used. redis-py's blocking cluster client
    reads the cluster's slots as it is constructed, so a worker or an API started while the
    cluster is down would fail at once; built on first use, that failure is an outage like
    any other (`REDIS_FAILURES`), ridden out by the caller's backoff. The asyncio client
    already connects lazily."""

    def __init__(self, url: str, options: dict[str, Any]) -> None:
        self._url = url
        self._options = options
        self._client: RedisCluster | None = None

    def register_script(self, script: str) -> Script:
        return Script(cast(RedisCluster, self), script)  # its sha is local: no connection yet

    def close(self) -> None:
        if self._client is not None:
            self._client.close()

    def __getattr__(self, name: str) -> Any:
        if self._client is None:
            self._client = RedisCluster.from_url(self._url, **self._options)
        return getattr(self._client, name)
