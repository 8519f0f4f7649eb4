"""Sample pageview events with a realistic shape: skewed pages and users, noisy latencies,
out-of-order and late event times, producer-retry duplicates (same key, same payload), and
an optional sprinkle of malformed records."""

from __future__ import annotations

import random
from collections.abc import Iterator
from dataclasses import dataclass

import orjson
from confluent_kafka import KafkaError, Producer

from shared.config import KafkaSettings, Settings, SourceConfig
from shared.errors import LambdaError
from shared.kafka import client_config

PAGES = [f"/page/{i}" for i in range(40)] + ["/", "/search", "/cart", "/checkout"]
COUNTRIES = ["de", "fr", "us", "in", "br", "jp", "gb"]
"""A nested `geo.country`, for metrics reading a nested field (rule 10 in docs/semantics.md)."""


@dataclass(frozen=True)
class GeneratorSpec:
    start_ms: int
    end_ms: int
    events: int
    disorder_ms: int = 20_000
    late_fraction: float = 0.02
    late_by_ms: int = 15 * 60_000
    duplicate_fraction: float = 0.02
    malformed_fraction: float = 0.0
    seed: int = 7
    keyed_by_user: bool = False
    """Key each record by its user (all of a user's events on one partition, as a session
    metric per user needs for exact speed sessions, rule 13); else by its event id."""


@dataclass(frozen=True)
class SampleRecord:
    key: bytes
    value: bytes


def _malformed(rng: random.Random, ts: int) -> bytes:
    return rng.choice(
        [
            b"not json at all",
            b"[1, 2, 3]",
            orjson.dumps({"page": "/", "event_id": "x"}),
            orjson.dumps({"ts": "yesterday", "event_id": "y"}),
            orjson.dumps({"ts": ts, "event_id": 1.5}),
        ]
    )


def generate(spec: GeneratorSpec) -> Iterator[SampleRecord]:
    """Events spread evenly over [start, end) in production order, with noise on top."""
    rng = random.Random(spec.seed)
    step = (spec.end_ms - spec.start_ms) / max(spec.events, 1)
    weights = [1 / (rank + 1) for rank in range(len(PAGES))]
    for i in range(spec.events):
        nominal = spec.start_ms + int(i * step)
        ts = nominal - rng.randrange(spec.disorder_ms + 1)
        if rng.random() < spec.late_fraction:
            ts -= spec.late_by_ms
        event_id = f"{spec.seed}-{i}"
        if rng.random() < spec.malformed_fraction:
            yield SampleRecord(event_id.encode(), _malformed(rng, ts))
            continue
        page = rng.choices(PAGES, weights)[0]
        user = int(rng.paretovariate(1.2)) % 5000
        payload = {
            "ts": ts,
            "event_id": event_id,
            "page": page,
            "user_id": f"u{user}",
            "latency_ms": round(rng.lognormvariate(4.0, 0.6), 3),
            "geo": {"country": COUNTRIES[user % len(COUNTRIES)]},  # a user's, no draw
        }
        key = f"u{user}" if spec.keyed_by_user else event_id
        record = SampleRecord(key.encode(), orjson.dumps(payload))
        yield record
        if rng.random() < spec.duplicate_fraction:
            yield record


def sessions_on(settings: Settings, source: SourceConfig) -> bool:
    """Whether a session metric reads `source`: then its sample events are keyed by user, so
    a user's events share a partition (rule 13)."""
    return any(p.sessions is not None for p in settings.plans_of(source))


class ProduceError(LambdaError):
    """Records were not delivered; the CLI prints the message instead of a traceback."""


def produce(kafka: KafkaSettings | str, topic: str, records: Iterator[SampleRecord]) -> int:
    """Send with an idempotent producer keyed by event id (copies share a partition); fails
    loudly when the broker refused any record (e.g. the topic does not exist). `kafka`: the
    configured cluster, or the bootstrap servers of a PLAINTEXT one (tests, benchmarks)."""
    cluster = kafka if isinstance(kafka, KafkaSettings) else KafkaSettings(bootstrap_servers=kafka)
    producer = Producer({**client_config(cluster), "enable.idempotence": True, "linger.ms": 20})
    failed: list[KafkaError] = []

    def delivered(error: KafkaError | None, _message: object) -> None:
        if error is not None:
            failed.append(error)

    sent = 0
    for record in records:
        while True:
            try:
                producer.produce(topic, key=record.key, value=record.value, on_delivery=delivered)
                break
            except BufferError:
                producer.poll(0.1)
        sent += 1
        if sent % 10_000 == 0:
            producer.poll(0)
    remaining = producer.flush(60)
    if remaining:
        raise ProduceError(f"{remaining} records were not delivered to {topic!r} within 60 s")
    if failed:
        raise ProduceError(
            f"{len(failed)} of {sent} records were refused by {topic!r}: {failed[0]} "
            "(`lambdactl topics create` creates the configured topics)"
        )
    return sent
