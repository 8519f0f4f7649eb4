"""Small confluent-kafka helpers shared by the broker conformance tests."""

from __future__ import annotations

import json
import queue
import subprocess
import sys
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from confluent_kafka import Consumer, KafkaError, Message, Producer, TopicPartition

POLL_S = 0.2
CLIENTS_SCRIPT = Path(__file__).with_name("_clients.py")

T = TypeVar("T")

#: ``create_topic(partitions=1, config=None) -> topic name`` (see conftest).
TopicFactory = Callable[..., str]
#: ``spawn_client(mode, **args) -> ChildClient`` (see conftest).
ClientFactory = Callable[..., "ChildClient"]


@dataclass(frozen=True)
class Delivered:
    """Where the broker put one produced record (from the delivery report)."""

    key: bytes | None
    value: bytes | None
    partition: int
    offset: int
    timestamp: tuple[int, int]


def make_producer(bootstrap: str, config: Mapping[str, Any] | None = None) -> Producer:
    settings: dict[str, Any] = {"bootstrap.servers": bootstrap, "linger.ms": 5, "acks": "all"}
    settings.update(config or {})
    return Producer(settings)


def make_consumer(
    bootstrap: str, group_id: str | None = None, config: Mapping[str, Any] | None = None
) -> Consumer:
    settings: dict[str, Any] = {
        "bootstrap.servers": bootstrap,
        "group.id": group_id or f"conformance-{uuid.uuid4().hex}",
        "enable.auto.commit": False,
        "auto.offset.reset": "earliest",
        "enable.partition.eof": False,
    }
    settings.update(config or {})
    return Consumer(settings)


def produce_all(
    producer: Producer,
    topic: str,
    records: Iterable[Mapping[str, Any]],
    timeout: float = 15.0,
) -> list[Delivered]:
    """Produce ``records`` (kwargs for ``Producer.produce``), flush, fail on any delivery error.

    Returns the delivery reports in produce order.
    """
    reports: list[Delivered | None] = []
    errors: list[str] = []

    def make_callback(index: int) -> Any:
        def on_delivery(err: KafkaError | None, msg: Message) -> None:
            if err is not None:
                errors.append(f"record {index}: {err}")
                return
            partition, offset = msg.partition(), msg.offset()
            assert partition is not None and offset is not None
            reports[index] = Delivered(
                key=msg.key(),
                value=msg.value(),
                partition=partition,
                offset=offset,
                timestamp=msg.timestamp(),
            )

        return on_delivery

    for record in records:
        reports.append(None)
        producer.produce(topic, on_delivery=make_callback(len(reports) - 1), **record)
        producer.poll(0)
    remaining = producer.flush(timeout)
    assert remaining == 0, f"{remaining} record(s) still undelivered after {timeout} s"
    assert not errors, f"delivery failed: {errors[:5]}"
    assert all(r is not None for r in reports), "missing delivery report(s)"
    return [r for r in reports if r is not None]


def read_until(
    consumer: Consumer, ends: Mapping[tuple[str, int], int], timeout: float = 15.0
) -> list[Message]:
    """Poll an assigned/subscribed consumer until each (topic, partition)'s position >= its end.

    This is how the batch layer slices the log: it stops when the *position* reaches the end
    offset, never by counting records (transaction markers and aborted records occupy offsets
    but are never delivered). Partitions whose end is 0 are empty and need no reading.
    """
    pending = {tp: end for tp, end in ends.items() if end > 0}
    messages: list[Message] = []
    deadline = time.monotonic() + timeout

    def positions() -> dict[tuple[str, int], int]:
        tps = consumer.position([TopicPartition(t, p) for t, p in pending])
        return {(tp.topic, tp.partition): tp.offset for tp in tps}

    while any(positions()[tp] < end for tp, end in pending.items()):
        assert time.monotonic() < deadline, (
            f"positions {positions()} did not reach {pending} within {timeout} s; "
            f"read {len(messages)} record(s)"
        )
        msg = consumer.poll(POLL_S)
        if msg is None:
            continue
        if (err := msg.error()) is not None:
            assert err.code() == KafkaError._PARTITION_EOF, f"consume error: {err}"
            continue
        messages.append(msg)
    return messages


def poll_for(consumer: Consumer, duration: float) -> list[Message]:
    """Poll for ``duration`` seconds and return every record delivered meanwhile."""
    messages: list[Message] = []
    deadline = time.monotonic() + duration
    while time.monotonic() < deadline:
        msg = consumer.poll(POLL_S)
        if msg is None:
            continue
        if (err := msg.error()) is not None:
            assert err.code() == KafkaError._PARTITION_EOF, f"consume error: {err}"
            continue
        messages.append(msg)
    return messages


def eventually(
    probe: Callable[[], T], ok: Callable[[T], bool], timeout: float, what: str
) -> tuple[T, float]:
    """Call ``probe`` every 0.1 s until ``ok(value)``; return (value, seconds it took).

    Fails with ``what`` and the last value if that does not happen within ``timeout`` s.
    """
    start = time.monotonic()
    while not ok(value := probe()):
        elapsed = time.monotonic() - start
        assert elapsed < timeout, f"{what}: not within {timeout:.0f} s (last value {value!r})"
        time.sleep(0.1)
    return value, time.monotonic() - start


class ChildClient:
    """A client of ``_clients.py`` in its own process, killable with SIGKILL.

    Its stdout (and stderr) is read by a thread: JSON lines are its events, anything else
    (librdkafka logs) is kept for failure messages.
    """

    def __init__(self, mode: str, **args: Any) -> None:
        self.mode = mode
        self.process = subprocess.Popen(
            [sys.executable, str(CLIENTS_SCRIPT), mode, json.dumps(args)],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        self.events: queue.Queue[dict[str, Any]] = queue.Queue()
        self.output: deque[str] = deque(maxlen=30)
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.output.append(line.rstrip())
            try:
                event = json.loads(line)
            except ValueError:
                continue
            if isinstance(event, dict) and "event" in event:
                self.events.put(event)

    def expect(
        self, event: str, timeout: float, ok: Callable[[dict[str, Any]], bool] = lambda _: True
    ) -> dict[str, Any]:
        """The next ``event`` for which ``ok`` holds (earlier events are dropped)."""
        deadline = time.monotonic() + timeout
        while True:
            remaining = deadline - time.monotonic()
            assert remaining > 0, (
                f"{self.mode} client: no matching {event!r} event within {timeout:.0f} s; "
                f"output:\n" + "\n".join(self.output)
            )
            try:
                got = self.events.get(timeout=min(remaining, 0.2))
            except queue.Empty:
                assert self.process.poll() is None, (
                    f"{self.mode} client exited with {self.process.returncode}; output:\n"
                    + "\n".join(self.output)
                )
                continue
            assert got["event"] != "error", f"{self.mode} client failed: {got}"
            if got["event"] == event and ok(got):
                return got

    def kill(self) -> None:
        """SIGKILL: the client gets no chance to say goodbye to the broker."""
        if self.process.poll() is None:
            self.process.kill()  # SIGKILL on POSIX
        self.process.wait(10)
        self._reader.join(10)
