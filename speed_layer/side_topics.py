"""The speed layer's side outputs: dead letters to `<source>.dlq` and late events to
`<source>.late`, keyed `topic:partition:offset` so replays do not inflate counts, delivered
(and checked) before the batch they come from is applied to Redis (rule 3: a crash after the
apply never loses them)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from confluent_kafka import KafkaError, KafkaException, Producer

from shared.config import Settings
from shared.kafka import client_config
from speed_layer.errors import SideTopicError
from speed_layer.processor import Rejected

_CUT_BYTES = 64 * 1024


def _too_large(error: Exception) -> bool:
    code = error.args[0].code() if error.args and isinstance(error.args[0], KafkaError) else None
    return code == KafkaError.MSG_SIZE_TOO_LARGE


class SideTopicPublisher:
    """One producer for the worker's dead letters and late events (`publish_rejected` is the
    processor's `Publish`)."""

    def __init__(self, settings: Settings) -> None:
        self.producer = Producer(
            {
                **client_config(settings.kafka),
                "linger.ms": 5,
                "message.max.bytes": 16 * 1024 * 1024,
            }
        )

    def publish_rejected(
        self, topic: str, partition: int, dead: Sequence[Rejected], late: Sequence[Rejected]
    ) -> None:
        """Dead letters and late events, keyed `topic:partition:offset` so replays dedupe,
        delivered (and checked) before the batch is applied. A value the broker refuses as
        too large goes out cut to its first `_CUT_BYTES`, with header `truncated: <size>`."""
        failures: list[tuple[str, Rejected, str, Exception]] = []
        for target, rejected, header in ((".dlq", dead, "reason"), (".late", late, "metrics")):
            for item in rejected:
                self._produce(topic + target, partition, item, header, failures)
        if not (dead or late):
            return
        self._flush()
        retry, failures = failures, []
        for target_topic, item, header, error in retry:
            if not _too_large(error) or item.value is None:
                raise SideTopicError(
                    f"could not publish {target_topic} record {item.offset}: {error}; the "
                    "batch is not applied (it is read again after a backoff)"
                )
            cut = item._replace(value=item.value[:_CUT_BYTES])
            self._produce(
                target_topic,
                partition,
                cut,
                header,
                failures,
                extra=[("truncated", str(len(item.value)).encode())],
            )
        if retry:
            self._flush()
        if failures:
            raise SideTopicError(f"could not publish dead letters / late events: {failures[0][3]}")

    def _produce(
        self,
        target_topic: str,
        partition: int,
        item: Rejected,
        header: str,
        failures: list[tuple[str, Rejected, str, Exception]],
        extra: Sequence[tuple[str, bytes]] = (),
    ) -> None:
        source_topic = target_topic[: target_topic.rindex(".")]

        def delivered(error: Any, _message: Any) -> None:
            if error is not None:
                failures.append((target_topic, item, header, KafkaException(error)))

        details = [("detail", item.detail.encode())] if item.detail else []
        while True:
            try:
                self.producer.produce(
                    target_topic,
                    key=f"{source_topic}:{partition}:{item.offset}",
                    value=item.value,
                    partition=partition,
                    headers=[(header, item.why.encode()), *details, *extra],
                    on_delivery=delivered,
                )
                return
            except BufferError:
                self.producer.poll(0.1)
            except KafkaException as exc:
                failures.append((target_topic, item, header, exc))
                return

    def _flush(self) -> None:
        remaining = self.producer.flush(30)
        if remaining:
            raise SideTopicError(
                f"{remaining} dead letters / late events were not delivered to Kafka within "
                "30 s; the batch is not applied (it is read again after a backoff)"
            )
