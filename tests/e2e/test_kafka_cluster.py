"""The platform on a three-node Apache Kafka cluster (KRaft) started here (#14): source topics
take the cluster's replication factor 3 and `min.insync.replicas=2`, producers are idempotent
with `acks=all`. First the broker conformance suite (`tests/broker`) runs against the cluster;
then, with events streaming in, a speed worker consuming and a full run reading, the node
leading a source partition is killed with SIGKILL and left down: every acknowledged event is
in the log exactly once, the worker keeps applying, runs succeed with the node down, and the
batch view and the speed cells after W equal the oracle."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka.admin import ConfigResource

from batch_layer import execute_run
from shared.db.runs import RunRequest
from shared.kafka import create_topics
from tests.batch.helpers import queue, run_record
from tests.conftest import Platform, reconfigured
from tests.e2e.support import EventStream, rerun_suites, settles_exactly
from tests.kafka_cluster import KafkaCluster, local_kafka_cluster
from tests.speed.support import start_worker, stop_worker, wait_until_applied

pytestmark = [pytest.mark.services, pytest.mark.long(100), pytest.mark.timeout(600)]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KafkaCluster]:
    with local_kafka_cluster(tmp_path_factory.mktemp("kafka-cluster")) as running:
        yield running


def test_the_broker_conformance_suite_passes_on_the_cluster(cluster: KafkaCluster) -> None:
    env = {"LAMBDA_KAFKA__BOOTSTRAP_SERVERS": cluster.bootstrap}
    summary = rerun_suites(["tests/broker"], env, timeout_s=500)
    print(f"tests/broker on the three-node cluster: {summary}")


def test_a_node_killed_mid_stream_loses_nothing(
    cluster: KafkaCluster, platform: Platform, spark: Any, tmp_path: Path
) -> None:
    platform = reconfigured(platform, kafka={"bootstrap_servers": cluster.bootstrap})
    settings = platform.settings
    bootstrap, topic = cluster.bootstrap, settings.sources[0].topic
    create_topics(settings)
    admin = cluster.admin()
    partitions = admin.list_topics(topic, timeout=10).topics[topic].partitions
    assert {len(p.replicas) for p in partitions.values()} == {3}
    described = admin.describe_configs([ConfigResource("topic", topic)])
    config = next(iter(described.values())).result()
    assert config["min.insync.replicas"].value == "2"

    events = EventStream(bootstrap, topic)
    worker = start_worker(platform, tmp_path / "speed.log")
    wait_until_applied(platform, timeout_s=120, workers=[worker])
    in_flight = queue(settings, RunRequest("full"))
    reader = threading.Thread(target=execute_run, args=(settings, spark, in_flight))
    victim = partitions[0].leader
    controller = admin.list_topics(timeout=10).controller_id
    started = time.monotonic()
    try:
        events.start()
        time.sleep(2.0)
        reader.start()
        time.sleep(1.0)
        cluster.kill(victim)
        events.join(240)
        reader.join(300)
        assert not reader.is_alive()
        assert run_record(settings, in_flight).status == "succeeded"
        wait_until_applied(platform, timeout_s=180, workers=[worker])
        assert worker.poll() is None, "the speed worker died with a node"
    finally:
        stop_worker(worker)
    settles_exactly(platform, spark, events, "incremental")
    role = "leader of partition 0" + (" and the active controller" if victim == controller else "")
    print(
        f"killed node {victim} ({role}) mid-stream; {events.sent} events acknowledged, each "
        "in the log once; the in-flight and the next run succeeded with it down; the speed "
        f"view caught up and equals the oracle; {time.monotonic() - started:.0f} s"
    )
