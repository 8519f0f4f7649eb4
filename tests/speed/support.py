"""Helpers for the speed layer's tests: run workers as subprocesses against the test's
platform, wait for their fences, and read the speed view back in the oracle's cell form."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

from confluent_kafka import Consumer, TopicPartition

from shared.config import Settings
from shared.speed_view import EPOCH_KEY, REBUILDING_KEY, SyncRedis, fence_key, redis_client
from tests import oracle
from tests.conftest import Platform, reconfigured, redis_for_tests
from tests.views import speed_view_cells


def with_speed(platform: Platform, **speed: Any) -> Platform:
    """The same platform with extra `speed:` settings, in a config file of its own."""
    return reconfigured(platform, speed=speed)


def start_worker(
    platform: Platform, log_path: Path, fault: str | None = None
) -> subprocess.Popen[bytes]:
    env = dict(platform.env)
    if fault:
        env["LAMBDA_FAULT"] = fault
    return subprocess.Popen(
        [sys.executable, "-m", "lambdactl", "speed"],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=log_path.open("ab"),
        cwd=os.getcwd(),
    )


def stop_worker(worker: subprocess.Popen[bytes], timeout_s: float = 30) -> int:
    if worker.poll() is None:
        worker.terminate()
        try:
            return worker.wait(timeout_s)
        except subprocess.TimeoutExpired:
            worker.kill()
            worker.wait(10)
            raise AssertionError("the worker did not stop within 30 s of SIGTERM") from None
    return int(worker.returncode)


def drain_with_worker(platform: Platform, log_path: Path) -> None:
    """Run one worker until the speed view has every record of the topic, then stop it."""
    worker = start_worker(platform, log_path)
    try:
        wait_until_applied(platform, workers=[worker])
    finally:
        assert stop_worker(worker) == 0, f"the worker failed; see {log_path}"


def end_offsets(bootstrap: str, topic: str, partitions: int) -> dict[int, int]:
    """Each partition's end offset (high watermark), asked of the broker, not the cache."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "end-offsets-probe"})
    try:
        return {
            p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10, cached=False)[1]
            for p in range(partitions)
        }
    finally:
        consumer.close()


def fences(platform: Platform) -> list[int | None]:
    source = platform.settings.sources[0]
    client = redis_client(platform.settings.redis)
    raw = [client.hget(fence_key(source.topic, p), "offset") for p in range(source.partitions)]
    return [None if v is None else int(v) for v in raw]


def wait_until_applied(
    platform: Platform,
    timeout_s: float = 180,
    workers: list[subprocess.Popen[bytes]] | None = None,
) -> None:
    """Until every partition's fence has reached the topic's end and no rebuild is pending."""
    source = platform.settings.sources[0]
    ends = end_offsets(platform.settings.kafka.bootstrap_servers, source.topic, source.partitions)
    client = redis_client(platform.settings.redis)
    deadline = time.monotonic() + timeout_s
    current: list[int | None] = []
    while time.monotonic() < deadline:
        current = fences(platform)
        caught_up = all(
            end == 0 or (f is not None and f + 1 >= end)
            for f, end in zip(current, ends.values(), strict=True)
        )
        if caught_up and not client.scard(REBUILDING_KEY):
            return
        for worker in workers or []:
            assert worker.poll() is None, f"a worker exited with {worker.returncode}"
        time.sleep(0.25)
    raise AssertionError(f"the speed view did not catch up: fences {current}, ends {ends}")


def speed_cells(platform: Platform) -> dict[oracle.Cell, dict[str, Any]]:
    """Every base cell in Redis, its partition sub-cells merged, in the oracle's form."""
    base = {m.name: m.base_window_ms for m in platform.settings.plans.values()}
    cells = speed_view_cells(platform.settings)
    return {cell: values for cell, values in cells.items() if cell[1] == base[cell[0]]}


def expected_base_cells(
    platform: Platform, records: list[oracle.Record]
) -> tuple[dict[oracle.Cell, dict[str, Any]], oracle.OracleResult]:
    """The oracle's base cells over the non-late events (no batch run: W is None)."""
    result = oracle.compute(platform.config, records, late_rule=True)
    base = {m.name: m.base_window_ms for m in platform.settings.plans.values()}
    cells = {c: v for c, v in result.cells.items() if c[1] == base[c[0]]}
    return cells, result


def side_topic(platform: Platform, suffix: str) -> list[tuple[str, bytes | None, dict[str, str]]]:
    """(key, value, headers) of every record of `<source><suffix>` (`.dlq` or `.late`)."""
    topic = platform.settings.sources[0].topic + suffix
    out = []
    for record in read_with_headers(platform.settings.kafka.bootstrap_servers, topic):
        out.append(record)
    return out


def read_with_headers(
    bootstrap: str, topic: str, timeout_s: float = 30
) -> list[tuple[str, bytes | None, dict[str, str]]]:
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"speed-test-{time.monotonic_ns()}",
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
            "fetch.message.max.bytes": 4 * 1024 * 1024,
        }
    )
    try:
        metadata = consumer.list_topics(topic, timeout=10).topics[topic]
        ends = {}
        for p in metadata.partitions:
            low, high = consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)
            if high > low:
                ends[p] = high
        consumer.assign([TopicPartition(topic, p, 0) for p in ends])
        out: list[tuple[str, bytes | None, dict[str, str]]] = []
        done: Counter[int] = Counter()
        deadline = time.monotonic() + timeout_s
        while any(done[p] < end for p, end in ends.items()):
            assert time.monotonic() < deadline, f"could not read {topic} to its end"
            msg = consumer.poll(0.5)
            if msg is None or msg.error() is not None:
                continue
            partition, offset, key = msg.partition(), msg.offset(), msg.key()
            assert partition is not None and offset is not None and isinstance(key, bytes)
            done[partition] = offset + 1
            raw_headers: list[tuple[str, bytes]] = msg.headers() or []  # type: ignore[assignment]
            headers = {k: (v or b"").decode() for k, v in raw_headers}
            value = msg.value()
            out.append((key.decode(), value if isinstance(value, bytes) else None, headers))
        return out
    finally:
        consumer.close()


def late_counts(platform: Platform) -> Counter[str]:
    """Late events per metric from `.late`, each record counted once (keys dedupe replays)."""
    by_key = {key: headers for key, _, headers in side_topic(platform, ".late")}
    counts: Counter[str] = Counter()
    for headers in by_key.values():
        for metric in headers["metrics"].split(","):
            counts[metric] += 1
    return counts


def wait_for_log(log: Path, text: str, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while text not in (log.read_text() if log.exists() else ""):
        assert time.monotonic() < deadline, f"{log.name}: no {text!r} within {timeout_s} s"
        time.sleep(0.1)


USER_SESSIONS: dict[str, Any] = {
    "name": "user_sessions",
    "source": "pageviews",
    "key": ["user_id"],
    "value": "latency_ms",
    "aggregations": ["count", "sum", "max", "distinct(page)", "quantiles(latency_ms)"],
    "windows": ["1m", "1h"],
    "grace": "2m",
    "session": {"gap": "2m", "max_duration": "10m"},
}
"""A session metric per user (rule 13) over the sample events: sessions cut at 10 minutes, so
the sample's busiest user has many."""


def view_client(stack: Settings) -> SyncRedis:
    """The flushed test Redis (database or cluster), with the epoch marker."""
    client = redis_client(redis_for_tests(stack))
    client.flushdb()
    client.set(EPOCH_KEY, "epoch")
    return client
