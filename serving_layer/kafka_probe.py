"""Kafka as the serving layer sees it: reachable or not, and each source partition's end
offset (for the speed layer's lag). One lazily created consumer, never used to consume."""

from __future__ import annotations

import threading
from typing import Any

from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition

from shared.config import KafkaSettings
from shared.kafka import client_config


class KafkaProbe:
    def __init__(self, kafka: KafkaSettings, timeout_s: float) -> None:
        self._kafka = kafka
        self._timeout = timeout_s
        self._lock = threading.Lock()
        self._consumer: Consumer | None = None

    def _client(self) -> Consumer:
        if self._consumer is None:
            self._consumer = Consumer(
                {
                    **client_config(self._kafka),
                    "group.id": "lambda-serving-probe",
                    "enable.auto.commit": False,
                    "socket.timeout.ms": int(self._timeout * 1000),
                    "error_cb": _ignore,
                    "log_level": 0,
                }
            )
        return self._consumer

    def check(self) -> str:
        """`ok`, or `down: <why>`."""
        with self._lock:
            try:
                self._client().list_topics(timeout=self._timeout)
            except (KafkaException, RuntimeError) as exc:
                return f"down: {exc}"
        return "ok"

    def end_offsets(self, topic: str, partitions: int) -> dict[int, int] | None:
        """The end offset of each partition, or None when Kafka does not answer in time; a
        partition given an offset below 0 (no answer, e.g. -1001 while its leader changes) is
        left out, so its lag is unknown rather than 0."""
        with self._lock:
            try:
                consumer = self._client()
                consumer.list_topics(topic, timeout=self._timeout)
                ends = {
                    p: consumer.get_watermark_offsets(
                        TopicPartition(topic, p), timeout=self._timeout, cached=False
                    )[1]
                    for p in range(partitions)
                }
            except (KafkaException, RuntimeError, TypeError):
                return None
        return {p: end for p, end in ends.items() if end >= 0}

    def close(self) -> None:
        with self._lock:
            if self._consumer is not None:
                self._consumer.close()
                self._consumer = None


def _ignore(error: KafkaError | Any) -> None:
    """librdkafka reports a down broker on every retry; `/readyz` tells it once per call."""
