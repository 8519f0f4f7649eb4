"""Group membership: a member that dies without leaving is expired and its partitions move on.

A speed-layer worker can die without a word (OOM kill, kill -9, a lost machine): it never sends
LeaveGroup. The group coordinator must then expire it after its ``session.timeout.ms`` and
rebalance, handing its partitions to the surviving members, or those partitions would go
unread for good.

Observed against Apache Kafka 4.3.1 (classic group protocol, eager rebalancing, 4 partitions,
``session.timeout.ms=6000``, heartbeats every 1 s): the victim, a confluent-kafka consumer in
its own process killed with SIGKILL while it owned 2 partitions, was expired and the survivor
owned all 4 partitions 5.9-6.0 s after the kill (the session timeout counts from the victim's
last heartbeat; the rebalance that follows takes well under a second), with a confluent-kafka
and with an aiokafka survivor alike; the survivor then read every record of the victim's
partitions (nothing had been committed). The broker does not act on the closed connection: it
waits for the session timeout.
"""

from __future__ import annotations

import asyncio
import threading
import uuid

import pytest
from aiokafka import AIOKafkaConsumer

from ._kafka import (
    ClientFactory,
    TopicFactory,
    eventually,
    make_consumer,
    make_producer,
    produce_all,
)

SESSION_MS = 6000
#: After the session timeout: the coordinator's expiry check, the survivor's next heartbeat
#: (which learns of the rebalance), its JoinGroup and SyncGroup. Generous: CI machines are busy.
REBALANCE_ALLOWANCE_S = 15
PARTITIONS = 4
PER_PARTITION = 5
ALL_PARTITIONS = frozenset(range(PARTITIONS))


class _Survivor(threading.Thread):
    """A group member polling in a background thread (so it keeps heartbeating while the test
    waits); exposes its current assignment and the offsets it has read per partition."""

    def __init__(self, bootstrap: str, group: str, topic: str) -> None:
        super().__init__(daemon=True, name=f"survivor-{group}")
        self.bootstrap, self.group, self.topic = bootstrap, group, topic
        self._halt = threading.Event()
        self._lock = threading.Lock()
        self._assignment: frozenset[int] = frozenset()
        self._read: dict[int, set[int]] = {}
        self._failure: BaseException | None = None

    def run(self) -> None:
        try:
            self.consume()
        except BaseException as exc:  # surfaced to the test by assignment()/read()
            self._failure = exc

    def consume(self) -> None:
        raise NotImplementedError

    def halted(self) -> bool:
        return self._halt.is_set()

    def update(self, assignment: set[int], read: list[tuple[int, int]]) -> None:
        with self._lock:
            self._assignment = frozenset(assignment)
            for partition, offset in read:
                self._read.setdefault(partition, set()).add(offset)

    def _check(self) -> None:
        assert self._failure is None, f"survivor failed: {self._failure!r}"
        assert self.is_alive(), "survivor thread ended"

    def assignment(self) -> frozenset[int]:
        self._check()
        with self._lock:
            return self._assignment

    def read(self) -> dict[int, frozenset[int]]:
        self._check()
        with self._lock:
            return {p: frozenset(offsets) for p, offsets in self._read.items()}

    def stop(self) -> None:
        self._halt.set()
        self.join(30)


class _ConfluentSurvivor(_Survivor):
    def consume(self) -> None:
        consumer = make_consumer(
            self.bootstrap,
            self.group,
            config={"session.timeout.ms": SESSION_MS, "heartbeat.interval.ms": 1000},
        )
        consumer.subscribe([self.topic])
        try:
            while not self.halted():
                msg = consumer.poll(0.2)
                read: list[tuple[int, int]] = []
                if msg is not None:
                    assert msg.error() is None, f"consume error: {msg.error()}"
                    partition, offset = msg.partition(), msg.offset()
                    assert partition is not None and offset is not None
                    read.append((partition, offset))
                self.update({tp.partition for tp in consumer.assignment()}, read)
        finally:
            consumer.close()


class _AiokafkaSurvivor(_Survivor):
    def consume(self) -> None:
        asyncio.run(self._consume())

    async def _consume(self) -> None:
        consumer = AIOKafkaConsumer(
            self.topic,
            bootstrap_servers=self.bootstrap,
            group_id=self.group,
            enable_auto_commit=False,
            auto_offset_reset="earliest",
            session_timeout_ms=SESSION_MS,
            heartbeat_interval_ms=1000,
        )
        await consumer.start()
        try:
            while not self.halted():
                batches = await consumer.getmany(timeout_ms=200)
                read = [(tp.partition, r.offset) for tp, rs in batches.items() for r in rs]
                self.update({tp.partition for tp in consumer.assignment()}, read)
        finally:
            await consumer.stop()


SURVIVORS: dict[str, type[_Survivor]] = {
    "confluent-kafka": _ConfluentSurvivor,
    "aiokafka": _AiokafkaSurvivor,
}


@pytest.mark.timeout(120)
@pytest.mark.parametrize("survivor_client", sorted(SURVIVORS))
def test_killed_member_is_expired_and_its_partitions_reassigned(
    kafka_bootstrap: str,
    create_topic: TopicFactory,
    spawn_client: ClientFactory,
    survivor_client: str,
) -> None:
    """A member killed with SIGKILL loses its partitions to the survivor within
    session timeout + one rebalance, and the survivor reads them from the committed position.
    """
    topic = create_topic(partitions=PARTITIONS)
    produce_all(
        make_producer(kafka_bootstrap),
        topic,
        [
            {"value": f"p{p}-{i}".encode(), "partition": p}
            for p in range(PARTITIONS)
            for i in range(PER_PARTITION)
        ],
    )
    group = f"conformance-expiry-{uuid.uuid4().hex}"
    victim = spawn_client(
        "member", bootstrap=kafka_bootstrap, group=group, topic=topic, session_ms=SESSION_MS
    )
    victim.expect("assigned", 30, lambda e: set(e["partitions"]) == ALL_PARTITIONS)

    survivor = SURVIVORS[survivor_client](kafka_bootstrap, group, topic)
    survivor.start()
    try:
        # The survivor's join rebalances the group: the partitions are split between the two.
        shared = victim.expect("assigned", 30, lambda e: 0 < len(e["partitions"]) < PARTITIONS)
        victim_share = frozenset(shared["partitions"])
        eventually(
            survivor.assignment,
            lambda assigned: assigned == ALL_PARTITIONS - victim_share,
            timeout=30,
            what=f"survivor owning the partitions the victim does not ({victim_share} are its)",
        )

        victim.kill()
        bound = SESSION_MS / 1000 + REBALANCE_ALLOWANCE_S
        _, took = eventually(
            survivor.assignment,
            lambda assigned: assigned == ALL_PARTITIONS,
            timeout=bound,
            what=(
                f"the killed member's partitions {sorted(victim_share)} reassigned to the "
                f"survivor (session.timeout.ms={SESSION_MS})"
            ),
        )
        print(f"TOOK {took:.2f}")  # TEMP
        # Nothing was committed, so the survivor reads the dead member's partitions from the
        # beginning (its own too: the eager rebalance revoked and re-assigned them).
        eventually(
            survivor.read,
            lambda read: read == {p: frozenset(range(PER_PARTITION)) for p in ALL_PARTITIONS},
            timeout=15,
            what="survivor reading every record of every partition",
        )
    finally:
        survivor.stop()
