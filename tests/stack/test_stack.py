"""`stack up|down|status` against real services, on non-default ports and a temporary data dir,
so it neither meets nor disturbs a stack (or another engineer's broker) on the default ports."""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypeVar

import psycopg
import pytest
import redis
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from lambdactl.kafka_broker import kafka_version
from lambdactl.stack import ServiceState, memory_bytes, stack_down, stack_status, stack_up
from shared.config import Settings
from shared.errors import ServiceUnavailableError

T = TypeVar("T")

pytestmark = [pytest.mark.services, pytest.mark.timeout(300)]

KAFKA = "127.0.0.1:19392"
REDIS = "redis://127.0.0.1:16399/0"
POSTGRES = "postgresql://lambda:lambda@127.0.0.1:15499/lambda"
PORTS = (19392, 16399, 15499)
SERVICES = ("kafka", "redis", "postgres")
COORDINATOR_MOVING = (
    KafkaError.NOT_COORDINATOR,
    KafkaError.COORDINATOR_LOAD_IN_PROGRESS,
    KafkaError.COORDINATOR_NOT_AVAILABLE,
)
"""What a client is told while the group coordinator starts: the offsets topic is created on
a new broker's first group request, and loaded after a restart."""


def _while_coordinator_moves(call: Callable[[], T], limit_s: float = 30.0) -> T:
    """`call()`, retried while the group coordinator is not ready yet."""
    deadline = time.monotonic() + limit_s
    while True:
        try:
            return call()
        except KafkaException as exc:
            assert exc.args[0].code() in COORDINATOR_MOVING, exc
            assert time.monotonic() < deadline, exc
            time.sleep(0.5)


def _settings(data_dir: Path, kafka: str = KAFKA) -> Settings:
    return Settings(
        kafka={"bootstrap_servers": kafka},
        redis={"url": REDIS},
        postgres={"url": POSTGRES},
        stack={"data_dir": data_dir},
    )


def _port_open(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1):
            return True
    except OSError:
        return False


def _alive(pid: int) -> bool:
    """Zombies (exited, not yet reaped) have an empty command line."""
    try:
        return bool(Path(f"/proc/{pid}/cmdline").read_bytes())
    except OSError:
        return False


@pytest.fixture
def settings(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Settings]:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("LAMBDA_CONFIG", raising=False)
    busy = [port for port in PORTS if _port_open(port)]
    if busy:
        pytest.fail(f"ports {busy} are taken; this test needs them free")
    settings = _settings(tmp_path / ".lambda")
    clusters: list[Path] = []
    yield settings
    for state in stack_down(settings):
        match = re.search(r"cluster (\S+) \(moved", state.detail)
        if match:
            clusters.append(Path(match.group(1)).parent)
    for cluster in clusters:
        shutil.rmtree(cluster, ignore_errors=True)


def _by_name(states: list[ServiceState]) -> dict[str, ServiceState]:
    return {state.name: state for state in states}


def _pids(states: list[ServiceState]) -> dict[str, int]:
    pids = {}
    for name in SERVICES:
        match = re.search(r"\bpid (\d+)", _by_name(states)[name].detail)
        assert match, _by_name(states)[name]
        pids[name] = int(match.group(1))
    return pids


def _topics() -> set[str]:
    admin = AdminClient({"bootstrap.servers": KAFKA})
    return set(admin.list_topics(timeout=10).topics)


def test_up_is_idempotent_answers_and_down_stops_it(settings: Settings) -> None:
    first = _by_name(stack_up(settings))
    for name in SERVICES:
        assert first[name].reachable and first[name].started_by_us, first[name]
        assert first[name].detail.startswith("started"), first[name]
    assert first["java"].reachable, first["java"]
    pids = _pids(list(first.values()))

    second = stack_up(settings)
    assert _pids(second) == pids
    for name in SERVICES:
        assert _by_name(second)[name].detail.startswith("already running"), _by_name(second)

    admin = AdminClient({"bootstrap.servers": KAFKA})
    admin.create_topics([NewTopic("kept", num_partitions=2, replication_factor=1)])["kept"].result(
        timeout=10
    )
    assert "kept" in _topics()
    assert redis.Redis.from_url(REDIS).ping()
    with psycopg.connect(POSTGRES) as conn:
        assert conn.execute("select 1, current_user").fetchone() == (1, "lambda")
        assert conn.execute("show max_connections").fetchone() == ("200",)
        buffers_mb = conn.execute(
            "SELECT setting::bigint * 8192 / 1048576 FROM pg_settings WHERE name = 'shared_buffers'"
        ).fetchone()
        quarter_mb = memory_bytes() // 4 // 1048576
        assert buffers_mb == (min(max(quarter_mb, 128), 8192),), "a quarter of memory, <= 8 GB"

    status = _by_name(stack_status(settings))
    assert all(status[name].reachable and status[name].started_by_us for name in SERVICES)

    down = _by_name(stack_down(settings))
    for name in SERVICES:
        assert not down[name].reachable and not down[name].started_by_us, down[name]
    assert not any(_port_open(port) for port in PORTS)
    assert not any(_alive(pid) for pid in pids.values())

    restarted = _by_name(stack_up(settings))
    assert all(restarted[name].started_by_us for name in SERVICES)
    assert "kept" in _topics(), "Kafka keeps topics across a restart"
    with psycopg.connect(POSTGRES) as conn:
        assert conn.execute("select 1").fetchone() == (1,)


def test_kafka_is_apache_kafka_and_keeps_records_and_offsets_across_restarts(
    settings: Settings,
) -> None:
    """One KRaft node from the pinned jars, heap <= 1 GB, data and log under the data dir;
    records and a group's committed offsets survive `stack down`/`up` and a kill -9."""
    (state,) = [s for s in stack_up(settings, ("kafka",)) if s.name == "kafka"]
    match = re.search(r"\bpid (\d+)", state.detail)
    assert match, state
    pid = int(match.group(1))
    cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    assert b"kafka.Kafka" in cmdline and b"-Xmx1g" in cmdline
    assert any(b"kafka_2.13-" + kafka_version().encode() in arg for arg in cmdline)
    data = settings.stack.data_dir / "kafka"
    assert (data / "meta.properties").exists()
    log = (settings.stack.data_dir / "logs" / "kafka.log").read_text()
    assert f"Kafka version: {kafka_version()}" in log

    admin = AdminClient({"bootstrap.servers": KAFKA})
    admin.create_topics([NewTopic("durable", 2, 1)])["durable"].result(timeout=10)
    producer = Producer({"bootstrap.servers": KAFKA, "acks": "all"})
    for i in range(100):
        producer.produce("durable", str(i).encode(), partition=i % 2)
    assert producer.flush(30) == 0
    committed = [TopicPartition("durable", 0, 30), TopicPartition("durable", 1, 40)]
    group = Consumer({"bootstrap.servers": KAFKA, "group.id": "durable-group"})
    _while_coordinator_moves(lambda: group.commit(offsets=committed, asynchronous=False))
    group.close()

    def survived() -> None:
        probe = Consumer({"bootstrap.servers": KAFKA, "group.id": "durable-group"})
        try:
            parts = [TopicPartition("durable", p) for p in (0, 1)]
            got = _while_coordinator_moves(lambda: probe.committed(parts, timeout=10))
            assert [(tp.partition, tp.offset) for tp in got] == [(0, 30), (1, 40)]
            ends = [probe.get_watermark_offsets(tp, timeout=10)[1] for tp in parts]
            assert ends == [50, 50]
        finally:
            probe.close()

    stack_down(settings, ("kafka",))
    assert not _alive(pid)
    stack_up(settings, ("kafka",))
    survived()
    (restarted,) = [s for s in stack_status(settings) if s.name == "kafka"]
    match = re.search(r"\bpid (\d+)", restarted.detail)
    assert match, restarted
    os.kill(int(match.group(1)), signal.SIGKILL)
    time.sleep(1.0)
    stack_up(settings, ("kafka",))
    survived()


def test_services_found_running_are_used_and_never_stopped(
    settings: Settings, tmp_path: Path
) -> None:
    stack_up(settings)
    other = _settings(tmp_path / "other")

    found = _by_name(stack_up(other))
    for name in SERVICES:
        assert found[name].reachable and not found[name].started_by_us, found[name]

    stack_down(other)
    time.sleep(0.5)
    assert all(_port_open(port) for port in PORTS)
    assert all(state.reachable for state in stack_status(settings) if state.name in SERVICES)


def test_unreachable_remote_service_is_reported_not_started(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    remote = _settings(tmp_path / ".lambda", kafka="192.0.2.1:9092")
    with pytest.raises(ServiceUnavailableError, match="LAMBDA_KAFKA__BOOTSTRAP_SERVERS"):
        stack_up(remote)
    assert not (tmp_path / ".lambda" / "run" / "kafka.pid").exists()


def test_a_port_that_accepts_but_speaks_no_kafka_is_not_up(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A broker still loading its data accepts connections and answers nothing: `stack up`
    must not report it up (the next command would fail on metadata), nor start a second one
    over it."""
    monkeypatch.chdir(tmp_path)
    with socket.create_server(("127.0.0.1", 0)) as silent:
        port = silent.getsockname()[1]
        settings = _settings(tmp_path / ".lambda", kafka=f"127.0.0.1:{port}")
        kafka = _by_name(stack_status(settings))["kafka"]
        assert not kafka.reachable, kafka
        with pytest.raises(ServiceUnavailableError, match="answers no metadata request"):
            stack_up(settings)
    assert not (tmp_path / ".lambda" / "run" / "kafka.pid").exists()
