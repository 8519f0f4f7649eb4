"""A reusable Spark Python Data Source that reads an offset range of a Kafka topic and yields
Arrow record batches of *metric inputs*, validated by the shared parser so both layers agree.

Format name `lambda_kafka`. Options:
- `kafka.<setting>`: the confluent-kafka client settings that reach the cluster (bootstrap
  servers, TLS, SASL), from `shared.kafka.reader_options`;
- `source`: the source config as JSON (`SourceConfig.model_dump_json()`);
- `metrics`: a JSON list of the source's metric configs;
- `tables`: a JSON list of the table configs their lookups join (rule 11);
- `slices`: a JSON list of `[partition, start_offset, end_offset]` (end exclusive), at most
  `max_offsets_per_slice` offsets each: one Spark input partition per slice;
- `fast_path` (default `true`): decode blocks of records with `pyarrow.json` where that
  provably agrees with the shared parser (`batch_layer.decode`), else with the shared parser.

Example::

    spark.dataSource.register(KafkaMetricInputs)
    rows = (spark.read.format("lambda_kafka").options(**reader_options(settings.kafka))
            .option("source", source.model_dump_json()).option("metrics", metrics_json)
            .option("slices", json.dumps(plan_slices({}, ends, 250_000))).load())

Each record gives one row (`batch_layer.decode.InputLayout`): partition, offset, time_ms,
event_id and the malformed reason, then one column per field the metrics read (the canonical
text `t<j>` of a dimension or distinct field, the number `n<j>` of a value field), then per
metric i (in the order of the `metrics` option) the reason `s<i>` it skips the event.
Slices are read with `isolation.level=read_committed`
and end when the consumer's position reaches the end offset (transaction markers take offsets
too), never by counting records.
"""

from __future__ import annotations

import logging
import time
from bisect import bisect_left
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from itertools import pairwise
from typing import Any

import orjson
import pyarrow as pa
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition
from pyspark.sql.types import StructType

from batch_layer.decode import Decoder, InputLayout
from batch_layer.errors import ReadStalledError
from shared.config import MetricConfig, Settings, SourceConfig, TableConfig
from shared.gc_tuning import collector_paused
from shared.kafka import client_config_of_options, reader_options
from shared.metric_plan import MetricPlan, compile_plan, read_plans

log = logging.getLogger(__name__)

_RECORDS_PER_BLOCK = 65536
_FETCH_RECORDS = 10_000
_STALL_S = 30.0
_QUEUED_RECORDS = 1_000_000


@dataclass(frozen=True)
class Slice(InputPartition):
    partition: int
    start: int
    end: int


def plan_slices(
    start_offsets: dict[int, int], end_offsets: dict[int, int], max_per_slice: int
) -> list[list[int]]:
    """`[partition, start, end)` slices of at most `max_per_slice` offsets, each partition's
    range cut into equal slices (no small remainder slice that would leave a core idle)."""
    slices = []
    for partition, end in sorted(end_offsets.items()):
        start = start_offsets.get(partition, 0)
        if start >= end:
            continue
        count = -(-(end - start) // max_per_slice)
        bounds = [start + (end - start) * i // count for i in range(count + 1)]
        slices += [[partition, lo, hi] for lo, hi in pairwise(bounds)]
    return slices


class KafkaMetricInputs(DataSource):
    @classmethod
    def name(cls) -> str:
        return "lambda_kafka"

    def schema(self) -> str:
        return InputLayout.of(_plans(self.options)).ddl()

    def reader(self, schema: StructType) -> DataSourceReader:
        return _Reader(dict(self.options))


class SliceReader(DataSourceReader):
    """A reader of the `slices` option's offset ranges, one Spark input partition each."""

    def __init__(self, options: dict[str, str]) -> None:
        self.options = options

    def partitions(self) -> Sequence[InputPartition]:
        return [Slice(*s) for s in orjson.loads(self.options["slices"])]


class _Reader(SliceReader):
    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        if not isinstance(partition, Slice):
            return  # no slices (nothing new to read): Spark still reads one default partition
        source = _source(self.options)
        decoder = Decoder(
            source, _plans(self.options), fast=self.options.get("fast_path", "true") == "true"
        )
        offsets: list[int] = []
        create_times: list[int] = []
        values: list[bytes | None] = []
        with collector_paused():
            client = client_config_of_options(self.options)
            for batch in read_slice(client, source.topic, partition):
                offsets += batch.offsets
                create_times += batch.create_times
                values += batch.values
                while len(offsets) >= _RECORDS_PER_BLOCK:
                    yield from decoder.decode(
                        partition.partition,
                        offsets[:_RECORDS_PER_BLOCK],
                        create_times[:_RECORDS_PER_BLOCK],
                        values[:_RECORDS_PER_BLOCK],
                    )
                    del offsets[:_RECORDS_PER_BLOCK]
                    del create_times[:_RECORDS_PER_BLOCK]
                    del values[:_RECORDS_PER_BLOCK]
            yield from decoder.decode(partition.partition, offsets, create_times, values)


def _source(options: Mapping[str, str]) -> SourceConfig:
    return SourceConfig.model_validate_json(options["source"])


def _plans(options: Mapping[str, str]) -> list[MetricPlan]:
    """The metrics' plans, compiled from the options' definitions (the plan itself does not
    cross to the Python workers: the definitions are its one serialized form)."""
    source = _source(options)
    tables = [TableConfig.model_validate(t) for t in orjson.loads(options.get("tables", "[]"))]
    return [
        compile_plan(MetricConfig.model_validate(m), source, tables)
        for m in orjson.loads(options["metrics"])
    ]


@dataclass
class Records:
    """One fetch of a slice's records, column by column."""

    offsets: list[int]
    create_times: list[int]
    values: list[bytes | None]
    keys: list[bytes | None] | None = None
    """The records' keys, when asked for (`read_slice(keys=True)`)."""


def read_slice(
    client: Mapping[str, str], topic: str, part: Slice, *, keys: bool = False
) -> Iterator[Records]:
    """The offsets, CreateTimes (ms), values (and `keys`) of every committed record in the
    slice, one fetch at a time (columns built by comprehensions: no per-record Python frames).
    `client`: the settings that reach the cluster (`shared.kafka.client_config`)."""
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer(
        {
            **client,
            "group.id": "lambda-batch-reader",
            "enable.auto.commit": False,
            "isolation.level": "read_committed",
            "enable.partition.eof": False,
            # librdkafka stops fetching once its queue holds `queued.min.messages` and then
            # waits `fetch.queue.backoff.ms` (1 s) before the next fetch: with the default
            # 100k a slice sat idle ~70% of its read (measured: 1.2 s wall, 0.3 s CPU per
            # 250k records). A queue of 1M (still capped at 64 MB) keeps the fetches going.
            "queued.min.messages": _QUEUED_RECORDS,
        }
    )
    try:
        tp = TopicPartition(topic, part.partition, part.start)
        consumer.assign([tp])
        position = part.start
        last_progress = time.monotonic()
        while position < part.end:
            # Never ask for more records than offsets remain: `consume` waits its whole
            # timeout for a count it cannot reach (transaction markers take offsets too, so
            # the last call may still come up short; the timeout bounds that wait).
            messages = consumer.consume(min(_FETCH_RECORDS, part.end - position), timeout=0.1)
            if any(m.error() is not None for m in messages):
                messages = _records_only(messages)
            offsets: list[int] = [m.offset() for m in messages]  # type: ignore[misc]
            if offsets and offsets[-1] >= part.end:
                inside = bisect_left(offsets, part.end)
                messages, offsets = messages[:inside], offsets[:inside]
            if messages:
                yield Records(
                    offsets,
                    [m.timestamp()[1] for m in messages],
                    [m.value() for m in messages],
                    [m.key() for m in messages] if keys else None,
                )
            current = consumer.position([TopicPartition(topic, part.partition)])[0].offset
            if current > position:
                position, last_progress = current, time.monotonic()
            elif time.monotonic() - last_progress > _STALL_S:
                raise ReadStalledError(
                    f"reading {topic}[{part.partition}] stalled at offset {position} before the "
                    f"snapshot end {part.end}; is the broker healthy?"
                )
    finally:
        consumer.close()


def _records_only(messages: list[Any]) -> list[Any]:
    """The records among `messages`. An error about the partition itself (e.g. its offsets
    were deleted) or a fatal one fails the read; a client-level, non-fatal one (seen: a
    coordinator lookup answered with a malformed response under load; the consumer's group
    is only there because the client requires one) is logged, and the client retries it —
    the stall timeout still ends a read that makes no progress."""
    from confluent_kafka import KafkaException

    records = []
    for message in messages:
        error = message.error()
        if error is None:
            records.append(message)
        elif error.fatal() or message.topic() is not None:
            raise KafkaException(error)
        else:
            log.warning("kafka client error while reading a slice (retried): %s", error)
    return records


def source_rows(
    spark: SparkSession,
    settings: Settings,
    source: SourceConfig,
    metrics: Sequence[MetricPlan],
    slices: Sequence[Any],
) -> DataFrame:
    """The metric-input rows of `source`'s records in `slices` (`plan_slices`), for the
    metrics read from the events (`read_plans`)."""
    return (
        spark.read.format("lambda_kafka")
        .options(**reader_options(settings.kafka))
        .option("source", source.model_dump_json())
        .option(
            "metrics",
            orjson.dumps([m.config.model_dump(mode="json") for m in read_plans(metrics)]).decode(),
        )
        .option("tables", orjson.dumps([t.model_dump() for t in settings.tables]).decode())
        .option("slices", orjson.dumps(slices).decode())
        .option("fast_path", "true" if settings.spark.fast_path else "false")
        .load()
    )


def earliest_event(
    spark: SparkSession,
    settings: Settings,
    source: SourceConfig,
    starts: Mapping[int, int],
    ends: Mapping[int, int],
) -> int | None:
    """The earliest event time of `source`'s valid records in `[starts, ends)` (partition ->
    offset; None: no valid record there)."""
    slices = plan_slices(dict(starts), dict(ends), settings.spark.max_offsets_per_slice)
    if not slices:
        return None
    rows = source_rows(spark, settings, source, [], slices)
    earliest = rows.where(F.col("malformed").isNull()).agg(F.min("time_ms")).collect()[0][0]
    return None if earliest is None else int(earliest)
