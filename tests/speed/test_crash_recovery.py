"""Rule 3 under faults and rebalances, with real worker subprocesses on Apache Kafka: kill -9
at the worst moment (after the Redis apply, before the offset commit) and at a random moment,
then a restart in the same consumer group; two workers, one killed, the survivor taking over
its partitions once the broker expires the dead member; a third worker joining and one stopped
with SIGTERM mid-stream. After each, the cells equal the oracle's: the fences decide what is
applied, so no rebalance, redelivery or zombie write counts an event twice or loses one."""

from __future__ import annotations

import random
import re
import signal
import subprocess
import threading
import time
from pathlib import Path

import pytest
from confluent_kafka import Consumer, TopicPartition

from lambdactl.generator import GeneratorSpec, generate, produce
from shared.kafka import create_topics
from tests import oracle
from tests.conftest import Platform
from tests.speed.support import (
    expected_base_cells,
    fences,
    late_counts,
    speed_cells,
    start_worker,
    stop_worker,
    wait_for_log,
    wait_until_applied,
    with_speed,
)

pytestmark = [pytest.mark.services, pytest.mark.timeout(240)]

MINUTE = 60_000


def committed_offsets(platform: Platform) -> dict[int, int]:
    settings = platform.settings
    topic = settings.sources[0].topic
    consumer = Consumer(
        {"bootstrap.servers": settings.kafka.bootstrap_servers, "group.id": settings.speed.app_id}
    )
    try:
        tps = [TopicPartition(topic, p) for p in range(settings.sources[0].partitions)]
        return {tp.partition: tp.offset for tp in consumer.committed(tps, timeout=10)}
    finally:
        consumer.close()


def assert_matches_oracle(platform: Platform) -> None:
    records = oracle.read_topic(
        platform.settings.kafka.bootstrap_servers, platform.config["sources"][0]["topic"]
    )
    want, result = expected_base_cells(platform, records)
    assert oracle.compare(want, speed_cells(platform)) == []
    assert late_counts(platform) == {m: n for m, n in result.late.items() if n}


def small_batches_with_history(platform: Platform, events: int, seed: int) -> Platform:
    """The platform with small fetches (many applies to crash between), its topics created
    and `events` of the last 30 minutes produced."""
    platform = with_speed(
        platform, max_poll_records=300, cleanup_interval_s=3600.0, rebalance_timeout_s=8.0
    )
    create_topics(platform.settings)
    now = int(time.time() * 1000) // MINUTE * MINUTE
    produce(
        platform.settings.kafka.bootstrap_servers,
        platform.settings.sources[0].topic,
        generate(GeneratorSpec(now - 30 * MINUTE, now, events, seed=seed)),
    )
    return platform


def test_kill_after_apply_before_commit_then_restart(platform: Platform, tmp_path: Path) -> None:
    platform = small_batches_with_history(platform, 6000, seed=21)
    settings = platform.settings
    topic = settings.sources[0].topic
    bootstrap = settings.kafka.bootstrap_servers
    now = int(time.time() * 1000) // MINUTE * MINUTE

    crashing = start_worker(
        platform, tmp_path / "w1.log", fault="after_redis_apply_before_commit@5"
    )
    try:
        assert crashing.wait(60) == -signal.SIGKILL
    finally:
        if crashing.poll() is None:
            crashing.kill()
    applied = fences(platform)
    assert any(f is not None for f in applied), "the fault fired before any apply"
    for partition, offset in committed_offsets(platform).items():
        if offset >= 0:
            fence = applied[partition]
            assert fence is not None and offset <= fence + 1, "committed ahead of Redis"

    produce(bootstrap, topic, generate(GeneratorSpec(now - 10 * MINUTE, now, 6000, seed=22)))
    second = start_worker(platform, tmp_path / "w2.log")
    try:
        wait_for_log(tmp_path / "w2.log", "event=position")
        time.sleep(random.uniform(0.0, 0.8))
    finally:
        second.send_signal(signal.SIGKILL)
        second.wait(10)

    last = start_worker(platform, tmp_path / "w3.log")
    try:
        wait_for_log(tmp_path / "w3.log", "event=position")
        wait_until_applied(platform, workers=[last])
    finally:
        assert stop_worker(last) == 0
    assert_matches_oracle(platform)


def assigned_partitions(log: Path) -> list[set[int]]:
    """Each assignment a worker logged, as its set of source partitions."""
    return [
        {int(p) for p in re.findall(r"partition=(\d+)", line)}
        for line in log.read_text().splitlines()
        if "event=assigned" in line
    ]


def wait_for_assignment(log: Path, want: set[int], timeout_s: float) -> float:
    """Seconds until the worker's latest assignment is exactly `want`."""
    started = time.monotonic()
    while (got := assigned_partitions(log)) == [] or got[-1] != want:
        assert time.monotonic() - started < timeout_s, (
            f"{log.name}: assignments {got}, not {sorted(want)} within {timeout_s:.0f} s"
        )
        time.sleep(0.1)
    return time.monotonic() - started


def start_second_worker_after_first(
    platform: Platform, logs: list[Path], every: set[int]
) -> list[subprocess.Popen[bytes]]:
    """Two workers of one group; the second joins once the first holds every partition, so
    its arrival is a rebalance of a running group."""
    workers = [start_worker(platform, logs[0])]
    wait_for_assignment(logs[0], every, 60)
    workers.append(start_worker(platform, logs[1]))
    return workers


def test_two_workers_one_killed_survivor_takes_over(platform: Platform, tmp_path: Path) -> None:
    platform = small_batches_with_history(platform, 3000, seed=31)
    settings = platform.settings
    topic = settings.sources[0].topic
    bootstrap = settings.kafka.bootstrap_servers
    every = set(range(settings.sources[0].partitions))
    now = int(time.time() * 1000) // MINUTE * MINUTE

    logs = [tmp_path / "a.log", tmp_path / "b.log"]
    workers = start_second_worker_after_first(platform, logs, every)
    try:
        for log in logs:
            wait_for_log(log, "event=position")
        shares = [assigned_partitions(log)[-1] for log in logs]
        assert shares[0] | shares[1] == every and not shares[0] & shares[1], shares
        live = GeneratorSpec(now - 20 * MINUTE, now, 12_000, seed=32)
        producer = threading.Thread(target=produce, args=(bootstrap, topic, generate(live)))
        producer.start()
        time.sleep(1.0)
        victim = random.choice(workers)
        victim.send_signal(signal.SIGKILL)
        victim.wait(10)
        survivor = next(w for w in workers if w is not victim)
        # The broker expires the dead member after its session timeout; one rebalance
        # (bounded by the rebalance timeout) then gives the survivor every partition.
        bound = settings.speed.session_timeout_s + settings.speed.rebalance_timeout_s + 5.0
        took = wait_for_assignment(logs[workers.index(survivor)], every, bound)
        print(f"takeover after kill -9: {took:.1f} s (bound {bound:.0f} s)")
        producer.join(60)
        wait_until_applied(platform, timeout_s=120, workers=[survivor])
        assert stop_worker(survivor) == 0
    finally:
        for worker in workers:
            if worker.poll() is None:
                worker.kill()
    assert_matches_oracle(platform)


def wait_for_cover(logs: list[Path], every: set[int], timeout_s: float) -> list[set[int]]:
    """Until the workers' latest assignments split `every` between them, each partition once."""
    deadline = time.monotonic() + timeout_s
    while True:
        shares = [(assigned_partitions(log) or [set()])[-1] for log in logs]
        if set().union(*shares) == every and sum(map(len, shares)) == len(every):
            return shares
        assert time.monotonic() < deadline, f"assignments {shares} do not split {every}"
        time.sleep(0.1)


def test_a_worker_joins_and_one_leaves_mid_stream(platform: Platform, tmp_path: Path) -> None:
    """Two rebalances while events flow: a third worker joins (Faust's sticky assignor may
    leave it idle: 4 partitions stay 2 + 2), then a worker holding partitions is stopped with
    SIGTERM (it leaves the group at once) and the others take them; after each, the cells
    equal the oracle's."""
    platform = small_batches_with_history(platform, 2000, seed=41)
    settings = platform.settings
    topic = settings.sources[0].topic
    bootstrap = settings.kafka.bootstrap_servers
    every = set(range(settings.sources[0].partitions))
    now = int(time.time() * 1000) // MINUTE * MINUTE
    logs = [tmp_path / f"w{i}.log" for i in range(3)]
    workers = start_second_worker_after_first(platform, logs, every)
    try:
        wait_for_log(logs[1], "event=position")

        def live(seed: int) -> threading.Thread:
            spec = GeneratorSpec(now - 20 * MINUTE, now, 8000, seed=seed)
            thread = threading.Thread(target=produce, args=(bootstrap, topic, generate(spec)))
            thread.start()
            return thread

        producer = live(42)
        time.sleep(0.5)
        workers.append(start_worker(platform, logs[2]))
        wait_for_log(logs[2], "event=assigned")
        producer.join(60)
        wait_until_applied(platform, timeout_s=120, workers=workers)
        shares = wait_for_cover(logs, every, 30)
        assert_matches_oracle(platform)

        producer = live(43)
        time.sleep(0.5)
        leaving = next(w for w, share in zip(workers, shares, strict=True) if share)
        assert stop_worker(leaving) == 0
        producer.join(60)
        staying = [w for w in workers if w is not leaving]
        wait_for_cover([logs[workers.index(w)] for w in staying], every, 60)
        wait_until_applied(platform, timeout_s=120, workers=staying)
        for worker in staying:
            assert stop_worker(worker) == 0
    finally:
        for worker in workers:
            if worker.poll() is None:
                worker.kill()
    assert_matches_oracle(platform)
