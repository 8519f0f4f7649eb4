"""The lookup tables as the speed worker joins them (rule 11 in docs/semantics.md).

Every worker reads every partition of every joined table from the beginning, as Kafka Streams
reads a GlobalKTable: the versions do not follow the events' partitioning, so each worker needs
all of them. `TableFeeds.catch_up` reads each table up to its end offsets, asked of the broker
then: the worker calls it before its first batch and before every batch, so a version produced
before an event is joined with it. It keeps, per table, a `shared.tables.TableVersions` holding
only the paths the metrics read of a record (`LookupPlan.reads`) and, once pruned (`prune`),
only the versions an event at or after the oldest W of the metrics joining it can join.

Invalid table records are skipped here; `TableDeadLetters` publishes them, once however many
workers run.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass, field

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaException, Message, TopicPartition
from prometheus_client import CollectorRegistry, Counter, Gauge

from shared.config import Settings, TableConfig
from shared.events import AsOf, Malformed
from shared.faults import fault_point
from shared.kafka import client_config
from shared.tables import TableVersions, parse_table_record, project
from speed_layer.errors import TableFeedError
from speed_layer.processor import Publish, Rejected

log = logging.getLogger(__name__)

_FETCH = 10_000
_PRUNED_KEYS = 20_000
"""Keys one prune visits at most: it runs on the event loop (~9 µs a key), and the rest waits
for the next watermark refresh."""
_TIMEOUT_S = 10.0


@dataclass
class _Table:
    config: TableConfig
    reads: tuple[tuple[str, ...], ...]
    versions: TableVersions = field(default_factory=TableVersions)
    newest_joined: int | None = None
    """The newest event time a batch joined with this table (a version valid from at or before
    it arrived late: some event may have joined the version before it)."""
    oldest_w: int | None = None
    """The smallest W of the metrics joining the table, as `prune` last had it."""


class TableFeeds:
    """The worker's copy of every table its metrics join, kept up to date by `catch_up`."""

    def __init__(self, settings: Settings, registry: CollectorRegistry) -> None:
        reads: dict[str, dict[tuple[str, ...], None]] = {}
        for plan in settings.plans.values():
            for lookup in plan.lookups:
                reads.setdefault(lookup.table.name, {}).update(dict.fromkeys(lookup.reads))
        self.tables = {
            name: _Table(settings.table(name), tuple(paths)) for name, paths in reads.items()
        }
        self.joins: Mapping[str, AsOf] = {
            name: table.versions.as_of for name, table in self.tables.items()
        }
        """Table name -> its as-of join, as `shared.events.metric_inputs` takes them."""
        self.late_records = Counter(
            "speed_late_table_records",
            "Table versions valid from at or before the newest event time already joined with "
            "the table: cells counted before the version arrived keep the old join until the "
            "next batch run",
            ["table"],
            registry=registry,
        )
        self.versions_kept = Gauge(
            "speed_table_versions",
            "Table versions the worker keeps for joins, by table",
            ["table"],
            registry=registry,
        )
        self._consumer: Consumer | None = None
        self._probe: Consumer | None = None
        """Asks the broker for the tables' end offsets on a connection of its own: on the
        reading consumer's, the request waits behind its fetch's long poll (measured: 490 ms
        a query, against 0.65 ms here)."""
        self._partitions: list[TopicPartition] = []
        self._owner: dict[str, _Table] = {}
        self._rejoins: set[str] = set()
        if self.tables:
            config = {
                **client_config(settings.kafka),
                "group.id": f"{settings.speed.app_id}-tables",
                "enable.auto.commit": False,
                "isolation.level": "read_committed",
                "enable.partition.eof": False,
            }
            self._consumer = Consumer(config)
            self._probe = Consumer(config)
            for table in self.tables.values():
                self._owner[table.config.topic] = table
                self._partitions += [
                    TopicPartition(table.config.topic, p, OFFSET_BEGINNING)
                    for p in range(table.config.partitions)
                ]
            self._consumer.assign(self._partitions)

    def catch_up(self) -> int:
        """Read every joined table up to its end offsets as the broker gives them now; how
        many records were read. Raises TableFeedError when the broker does not answer or the
        read makes no progress for `_TIMEOUT_S`."""
        consumer, probe = self._consumer, self._probe
        if consumer is None or probe is None:
            return 0
        try:
            ends = [
                probe.get_watermark_offsets(tp, timeout=_TIMEOUT_S, cached=False)[1]
                for tp in self._partitions
            ]
        except KafkaException as exc:
            raise TableFeedError(f"could not read the tables' end offsets: {exc}") from exc
        unknown = [  # an end below 0 is no answer (seen: -1001 as a leader was killed)
            f"{tp.topic}[{tp.partition}]"
            for tp, end in zip(self._partitions, ends, strict=True)
            if end < 0
        ]
        if unknown:
            raise TableFeedError(
                f"the broker gave no end offset for {', '.join(unknown)}; is its leader up?"
            )
        read, progress = 0, time.monotonic()
        while True:
            positions = consumer.position(
                [TopicPartition(t.topic, t.partition) for t in self._partitions]
            )
            if all(end == 0 or p.offset >= end for p, end in zip(positions, ends, strict=True)):
                return read
            if time.monotonic() - progress > _TIMEOUT_S:
                raise TableFeedError(
                    f"reading the tables stalled before their end offsets {ends}; is the "
                    "broker healthy?"
                )
            for message in consumer.consume(_FETCH, timeout=0.2):
                error = message.error()
                if error is not None:
                    if error.fatal() or message.topic() is not None:
                        raise TableFeedError(f"could not read a table: {error}")
                    continue
                self._apply(message)
                fault_point("mid_table_read")
                read += 1
                progress = time.monotonic()

    def _apply(self, message: Message) -> None:
        topic, partition, offset = message.topic(), message.partition(), message.offset()
        assert topic is not None and partition is not None and offset is not None, "a record"
        table = self._owner[topic]
        record = parse_table_record(
            message.key(), message.value(), message.timestamp()[1], table.config
        )
        if isinstance(record, Malformed):
            return
        if record.fields is not None:
            record = record._replace(fields=project(record.fields, table.reads))
        until = table.versions.add(record, partition, offset)
        if table.newest_joined is not None and record.valid_from <= table.newest_joined:
            self.late_records.labels(table.config.name).inc()
            if until is None or table.oldest_w is None or until > table.oldest_w:
                self._rejoins.add(table.config.name)

    def take_rejoins(self) -> set[str]:
        """The tables that received, since the last call, a late version joining events the
        speed view may hold (valid until after the oldest W): their sources' partitions are
        rebuilt (rule 11)."""
        rejoins, self._rejoins = self._rejoins, set()
        return rejoins

    def joined(self, tables: Mapping[str, None], newest_event_ms: int | None) -> None:
        """Note that a batch joined `tables` with events up to `newest_event_ms`."""
        if newest_event_ms is None:
            return
        for name in tables:
            table = self.tables[name]
            if table.newest_joined is None or newest_event_ms > table.newest_joined:
                table.newest_joined = newest_event_ms

    def prune(self, oldest_w: Mapping[str, int]) -> None:
        """Forget the versions no event the worker may still count can join: per table, those
        superseded by the oldest W (`oldest_w`: table name -> the smallest W of the metrics
        joining it; a table without one keeps everything)."""
        for name, table in self.tables.items():
            w = table.oldest_w = oldest_w.get(name)
            if w is not None:
                dropped = table.versions.prune(w, _PRUNED_KEYS)
                if dropped:
                    log.info("event=table_pruned table=%s versions=%d", name, dropped)
            self.versions_kept.labels(name).set(len(table.versions))

    def close(self) -> None:
        for consumer in (self._consumer, self._probe):
            if consumer is not None:
                consumer.close()


def oldest_joined_w(settings: Settings, watermarks: Mapping[str, int | None]) -> dict[str, int]:
    """Table name -> the smallest W of the metrics joining it, when every one has a W (an
    event before it is late for all of them, rule 11)."""
    by_table: dict[str, list[int]] = {}
    unknown: set[str] = set()
    for plan in settings.plans.values():
        for lookup in plan.lookups:
            w = watermarks.get(plan.name)
            if w is None:
                unknown.add(lookup.table.name)
            else:
                by_table.setdefault(lookup.table.name, []).append(w)
    return {name: min(ws) for name, ws in by_table.items() if name not in unknown}


class TableDeadLetters:
    """Publishes the invalid records of every table to `<table>.dlq` (rule 11), once per
    record however many workers run: the workers share the tables' partitions in a consumer
    group of their own (`<app_id>-table-dlq`), and each commits what it has published, so a
    record is published again only after a crash between the two (at least once; keyed
    `topic:partition:offset`, as the sources' dead letters)."""

    def __init__(self, settings: Settings, publish: Publish) -> None:
        self._publish = publish
        self._tables = {t.topic: t for t in settings.tables}
        self._consumer: Consumer | None = None
        if self._tables:
            self._consumer = Consumer(
                {
                    **client_config(settings.kafka),
                    "group.id": f"{settings.speed.app_id}-table-dlq",
                    "session.timeout.ms": int(settings.speed.session_timeout_s * 1000),
                    "enable.auto.commit": False,
                    "auto.offset.reset": "earliest",
                    "isolation.level": "read_committed",
                }
            )
            self._consumer.subscribe(sorted(self._tables))

    def drain(self) -> int:
        """Publish the invalid records among those read since the last call, then commit;
        how many were published. Raises TableFeedError or SideTopicError when Kafka fails."""
        consumer = self._consumer
        if consumer is None:
            return 0
        published = 0
        while True:
            messages = consumer.consume(_FETCH, timeout=0.5)
            if not messages:
                return published
            dead: dict[tuple[str, int], list[Rejected]] = {}
            for message in messages:
                error = message.error()
                if error is not None:
                    if error.fatal() or message.topic() is not None:
                        raise TableFeedError(f"could not read a table: {error}")
                    continue
                topic, partition, offset = message.topic(), message.partition(), message.offset()
                assert topic is not None and partition is not None and offset is not None
                record = parse_table_record(
                    message.key(), message.value(), message.timestamp()[1], self._tables[topic]
                )
                if isinstance(record, Malformed):
                    letter = Rejected(offset, message.value(), record.reason, record.detail)
                    dead.setdefault((topic, partition), []).append(letter)
            for (topic, partition), letters in dead.items():
                self._publish(topic, partition, letters, [])
                published += len(letters)
            try:
                consumer.commit(asynchronous=False)
            except KafkaException as exc:
                raise TableFeedError(f"could not commit the table dead letters: {exc}") from exc

    def close(self) -> None:
        if self._consumer is not None:
            self._consumer.close()
