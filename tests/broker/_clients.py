"""Kafka clients run as a separate process, so a test can kill them with SIGKILL.

Run as ``python _clients.py MODE JSON-ARGS``; the script imports nothing but confluent-kafka
(it is not run as part of the ``tests`` package). It reports on stdout, one JSON object a line,
each with an ``"event"`` key, and then stays alive until it is killed: a process killed with
SIGKILL sends nothing more to the broker (no LeaveGroup, no EndTxn), so whatever the broker
does next it must do on its own (session timeout, transaction timeout).

Modes:

* ``member``: a group member subscribed to ``topic`` in ``group`` with ``session_ms``; reports
  ``{"event": "assigned", "partitions": [...]}`` after every rebalance that gives it partitions
  (eager protocol: the complete new assignment) and ``{"event": "revoked", ...}``.
* ``open-transaction``: a transactional producer with ``transaction_timeout_ms`` that begins a
  transaction, produces ``count`` records to partition 0 of ``topic`` and reports
  ``{"event": "produced", "offsets": [...]}`` once they are acknowledged; it never ends the
  transaction.
"""

from __future__ import annotations

import json
import sys
import time
import uuid
from typing import Any

from confluent_kafka import Consumer, KafkaError, Message, Producer, TopicPartition


def report(event: str, **fields: Any) -> None:
    sys.stdout.write(json.dumps({"event": event, **fields}) + "\n")
    sys.stdout.flush()


def member(bootstrap: str, group: str, topic: str, session_ms: int) -> None:
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": group,
            "session.timeout.ms": session_ms,
            "heartbeat.interval.ms": 1000,
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
        }
    )

    def on_assign(_: Consumer, partitions: list[TopicPartition]) -> None:
        report("assigned", partitions=sorted(tp.partition for tp in partitions))

    def on_revoke(_: Consumer, partitions: list[TopicPartition]) -> None:
        report("revoked", partitions=sorted(tp.partition for tp in partitions))

    consumer.subscribe([topic], on_assign=on_assign, on_revoke=on_revoke)
    while True:  # until killed; polling serves the rebalance callbacks and the heartbeats
        msg = consumer.poll(0.2)
        if msg is not None and (err := msg.error()) is not None:
            report("error", error=str(err))


def open_transaction(bootstrap: str, topic: str, transaction_timeout_ms: int, count: int) -> None:
    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "transactional.id": f"conformance-abandoned-{uuid.uuid4().hex}",
            "transaction.timeout.ms": transaction_timeout_ms,
        }
    )
    producer.init_transactions(30)
    producer.begin_transaction()
    offsets: list[int] = []
    errors: list[str] = []

    def on_delivery(err: KafkaError | None, msg: Message) -> None:
        offset = msg.offset()
        if err is not None or offset is None:
            errors.append(str(err))
        else:
            offsets.append(offset)

    for i in range(count):
        producer.produce(topic, f"abandoned{i}".encode(), partition=0, on_delivery=on_delivery)
    producer.flush(30)
    if errors or len(offsets) != count:
        report("error", error=f"delivered {offsets}, errors {errors}")
    else:
        report("produced", offsets=sorted(offsets))
    while True:  # until killed, the transaction still open
        time.sleep(60)


def main() -> None:
    mode, args = sys.argv[1], json.loads(sys.argv[2])
    if mode == "member":
        member(**args)
    elif mode == "open-transaction":
        open_transaction(**args)
    else:
        raise SystemExit(f"unknown mode {mode!r}")


if __name__ == "__main__":
    main()
