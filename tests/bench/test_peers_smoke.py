"""`bench/speed.py --peers`: each peer (Kafka Streams at_least_once and exactly_once_v2,
quix-streams) starts, reads a small topic from its beginning and counts it exactly: per page,
count, sum, min and max of `latency_ms` over all windows equal a brute-force tally of the
records (duplicates included: the peers do not de-duplicate). The grace spans the whole topic,
so nothing is late.

The first run builds the Kafka Streams peer with Maven (~30 s with an empty ~/.m2) and makes
quix-streams' virtualenv (~1 min); later runs take well under a minute. Without Java 17+ or
Maven the test fails with what to install: it never skips."""

from __future__ import annotations

import time
import uuid

import orjson
import pytest
from confluent_kafka.admin import AdminClient, NewTopic

from bench import peers
from lambdactl.generator import GeneratorSpec, generate, produce
from shared.config import Settings

pytestmark = [pytest.mark.services, pytest.mark.long(60), pytest.mark.timeout(420)]

MINUTE = 60_000
EVENTS = 2000


def brute_force(values: list[bytes]) -> dict[str, list[float]]:
    pages: dict[str, list[float]] = {}
    for value in values:
        event = orjson.loads(value)
        latency = float(event["latency_ms"])
        tally = pages.setdefault(event["page"], [0, 0.0, latency, latency])
        tally[0] += 1
        tally[1] += latency
        tally[2] = min(tally[2], latency)
        tally[3] = max(tally[3], latency)
    return pages


def test_each_peer_counts_a_small_topic_exactly(stack: Settings) -> None:
    try:
        peers.kstreams_jar()
        peers.quix_python()
    except peers.PeerError as exc:
        pytest.fail(f"the peers could not be prepared: {exc}", pytrace=False)
    bootstrap = stack.kafka.bootstrap_servers
    topic = f"peers-smoke-{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(topic, 4, 1)])[topic].result(30)
    try:
        now = int(time.time() * 1000) // MINUTE * MINUTE
        records = list(generate(GeneratorSpec(now - 10 * MINUTE, now, EVENTS, late_fraction=0)))
        assert produce(bootstrap, topic, iter(records)) == len(records)
        expected = brute_force([r.value for r in records])
        given = {"bootstrap": bootstrap, "topic": topic, "events": len(records)}
        grace_ms = 3 * 60 * MINUTE
        runs = [
            peers.run_kstreams(**given, grace_ms=grace_ms, guarantee="at_least_once"),
            peers.run_kstreams(**given, grace_ms=grace_ms, guarantee="exactly_once_v2"),
            peers.run_quix(**given, grace_ms=grace_ms),
        ]
        for run in runs:
            name = f"{run.peer} {run.guarantee}"
            assert (run.aggregated, run.late) == (len(records), 0), name
            assert run.events_per_s > 0, name
            assert sorted(run.pages) == sorted(expected), name
            for page, (count, total, low, high) in expected.items():
                got = run.pages[page]
                assert got[0] == count, f"{name}: {page} counted {got[0]}, not {count}"
                assert got[1] == pytest.approx(total, rel=1e-9), f"{name}: {page} sum"
                assert (got[2], got[3]) == (low, high), f"{name}: {page} min/max"
    finally:
        admin.delete_topics([topic])[topic].result(30)
