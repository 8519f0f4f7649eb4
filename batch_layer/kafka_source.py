"""A reusable Spark Python Data Source that reads an offset range of a Kafka topic and yields
Arrow record batches of *metric inputs*, validated by the shared parser so both layers agree.

Format name `lambda_kafka`. Options:
- `bootstrap`: Kafka bootstrap servers;
- `source`: the source config as JSON (`SourceConfig.model_dump_json()`);
- `metrics`: a JSON list of the source's metric configs;
- `slices`: a JSON list of `[partition, start_offset, end_offset]` (end exclusive), at most
  `max_offsets_per_slice` offsets each: one Spark input partition per slice;
- `fast_path` (default `true`): decode blocks of records with `pyarrow.json` where that
  provably agrees with the shared parser (`batch_layer.decode`), else with the shared parser.

Example::

    spark.dataSource.register(KafkaMetricInputs)
    rows = (spark.read.format("lambda_kafka").option("bootstrap", "127.0.0.1:9092")
            .option("source", source.model_dump_json()).option("metrics", metrics_json)
            .option("slices", json.dumps(plan_slices({}, ends, 250_000))).load())

Each record gives one row (`batch_layer.decode.arrow_schema`): partition, offset, time_ms,
event_id and the malformed reason, then per metric i (in the order of the `metrics` option) its
key `k<i>`, value `v<i>` and distinct values `d<i>`, or the reason `s<i>` it skips the event.
Slices are read with `isolation.level=read_committed`
and end when the consumer's position reaches the end offset (transaction markers take offsets
too), never by counting records.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import orjson
import pyarrow as pa
from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition
from pyspark.sql.types import StructType

from batch_layer.decode import Decoder, schema_ddl

_RECORDS_PER_BLOCK = 8192
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
        return schema_ddl(len(orjson.loads(self.options["metrics"])))

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
        decoder = Decoder(source, metrics, fast=self.options.get("fast_path", "true") == "true")
        offsets: list[int] = []
        create_times: list[int] = []
        values: list[bytes | None] = []
        for _partition, offset, create_time_ms, value in read_slice(
            self.options["bootstrap"], source.topic, partition
        ):
            offsets.append(offset)
            create_times.append(create_time_ms)
            values.append(value)
            if len(offsets) >= _RECORDS_PER_BLOCK:
                yield from decoder.decode(partition.partition, offsets, create_times, values)
                offsets, create_times, values = [], [], []
        yield from decoder.decode(partition.partition, offsets, create_times, values)


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
