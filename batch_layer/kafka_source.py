"""A reusable Spark Python Data Source that reads an offset range of a Kafka topic and yields
Arrow record batches of *metric inputs*, validated by the shared parser so both layers agree.

Format name `lambda_kafka`. Options:
- `bootstrap`: Kafka bootstrap servers;
- `source`: the source config as JSON (`SourceConfig.model_dump_json()`);
- `metrics`: a JSON list of the source's metric configs;
- `slices`: a JSON list of `[partition, start_offset, end_offset]` (end exclusive), at most
  `max_offsets_per_slice` offsets each: one Spark input partition per slice.

Each source-valid or malformed record gives one *record row* (`metric` null: partition, offset,
time_ms, event_id, malformed reason); each (source-valid record, metric) gives one *metric row*
(key, value, distincts) or a `skip` reason. Slices are read with `isolation.level=read_committed`
and end when the consumer's position reaches the end offset (transaction markers take offsets
too), never by counting records.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import orjson
import pyarrow as pa
from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition
from pyspark.sql.types import StructType

SCHEMA_DDL = (
    "partition INT, offset BIGINT, time_ms BIGINT, event_id STRING, malformed STRING, "
    "metric STRING, key ARRAY<STRING>, value DOUBLE, distincts ARRAY<STRING>, skip STRING"
)
ARROW_SCHEMA = pa.schema(
    [
        ("partition", pa.int32()),
        ("offset", pa.int64()),
        ("time_ms", pa.int64()),
        ("event_id", pa.string()),
        ("malformed", pa.string()),
        ("metric", pa.string()),
        ("key", pa.list_(pa.string())),
        ("value", pa.float64()),
        ("distincts", pa.list_(pa.string())),
        ("skip", pa.string()),
    ]
)
_ROWS_PER_BATCH = 20_000
_STALL_S = 30.0


@dataclass(frozen=True)
class Slice(InputPartition):
    partition: int
    start: int
    end: int


def plan_slices(
    start_offsets: dict[int, int], end_offsets: dict[int, int], max_per_slice: int
) -> list[list[int]]:
    """`[partition, start, end)` slices of at most `max_per_slice` offsets."""
    slices = []
    for partition, end in sorted(end_offsets.items()):
        position = start_offsets.get(partition, 0)
        while position < end:
            stop = min(position + max_per_slice, end)
            slices.append([partition, position, stop])
            position = stop
    return slices


class KafkaMetricInputs(DataSource):
    @classmethod
    def name(cls) -> str:
        return "lambda_kafka"

    def schema(self) -> str:
        return SCHEMA_DDL

    def reader(self, schema: StructType) -> DataSourceReader:
        return _Reader(dict(self.options))


class _Reader(DataSourceReader):
    def __init__(self, options: dict[str, str]) -> None:
        self.options = options

    def partitions(self) -> Sequence[InputPartition]:
        return [Slice(*s) for s in orjson.loads(self.options["slices"])]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        from shared.config import MetricConfig, SourceConfig  # executor-side import

        source = SourceConfig.model_validate_json(self.options["source"])
        metrics = [MetricConfig.model_validate(m) for m in orjson.loads(self.options["metrics"])]
        assert isinstance(partition, Slice)
        builder = _RowBuilder(source, metrics)
        for partition_no, offset, create_time_ms, value in read_slice(
            self.options["bootstrap"], source.topic, partition
        ):
            builder.add(partition_no, offset, create_time_ms, value)
            if builder.size >= _ROWS_PER_BATCH:
                yield builder.flush()
        if builder.size:
            yield builder.flush()


def read_slice(
    bootstrap: str, topic: str, part: Slice
) -> Iterator[tuple[int, int, int, bytes | None]]:
    """(partition, offset, CreateTime ms, value) of every committed record in the slice."""
    from confluent_kafka import Consumer, KafkaException, TopicPartition

    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": "lambda-batch-reader",
            "enable.auto.commit": False,
            "isolation.level": "read_committed",
            "enable.partition.eof": False,
        }
    )
    try:
        tp = TopicPartition(topic, part.partition, part.start)
        consumer.assign([tp])
        position = part.start
        last_progress = time.monotonic()
        while position < part.end:
            messages = consumer.consume(10_000, timeout=0.5)
            for message in messages:
                if message.error():
                    raise KafkaException(message.error())
                offset = message.offset()
                if offset is None or offset >= part.end:
                    continue
                yield part.partition, offset, message.timestamp()[1], message.value()
            current = consumer.position([TopicPartition(topic, part.partition)])[0].offset
            if current > position:
                position, last_progress = current, time.monotonic()
            elif time.monotonic() - last_progress > _STALL_S:
                raise TimeoutError(
                    f"reading {topic}[{part.partition}] stalled at offset {position} before the "
                    f"snapshot end {part.end}; is the broker healthy?"
                )
    finally:
        consumer.close()


class _RowBuilder:
    """Accumulates rows column-wise and emits Arrow record batches."""

    def __init__(self, source: Any, metrics: Sequence[Any]) -> None:
        self.source = source
        self.metrics = metrics
        self.columns: dict[str, list[Any]] = {name: [] for name in ARROW_SCHEMA.names}
        self.size = 0

    def _row(self, *values: Any) -> None:
        for column, value in zip(self.columns.values(), values, strict=True):
            column.append(value)
        self.size += 1

    def add(self, partition: int, offset: int, create_time_ms: int, value: bytes | None) -> None:
        from shared.events import Malformed, Skipped, metric_input, parse_record

        event = parse_record(value, create_time_ms, self.source)
        if isinstance(event, Malformed):
            self._row(partition, offset, None, None, event.reason, None, None, None, None, None)
            return
        self._row(
            partition, offset, event.time_ms, event.event_id, None, None, None, None, None, None
        )
        for metric in self.metrics:
            contribution = metric_input(event, metric)
            if isinstance(contribution, Skipped):
                self._row(
                    partition,
                    offset,
                    event.time_ms,
                    event.event_id,
                    None,
                    metric.name,
                    None,
                    None,
                    None,
                    contribution.reason,
                )
            else:
                self._row(
                    partition,
                    offset,
                    event.time_ms,
                    event.event_id,
                    None,
                    metric.name,
                    list(contribution.key),
                    contribution.value,
                    list(contribution.distincts),
                    None,
                )

    def flush(self) -> pa.RecordBatch:
        batch = pa.RecordBatch.from_pydict(self.columns, schema=ARROW_SCHEMA)
        self.columns = {name: [] for name in ARROW_SCHEMA.names}
        self.size = 0
        return batch
