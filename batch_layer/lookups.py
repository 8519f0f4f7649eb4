"""Lookups in the batch layer (rule 11 in docs/semantics.md): the joined tables' versions read
from Kafka, and the as-of join of a source's events with them, in Spark.

`KafkaTableVersions` (format `lambda_kafka_table`) reads a table's topic up to the snapshot:
one row per record with its validity (`shared.tables.parse_table_record`: the key, the time it
is valid from, whether it deletes the key, or why it is malformed) and the columns of the paths
the metrics read in it (`batch_layer.raw_reads.RawRead`, computed as for an event's paths).

`with_lookups` adds, per join of the source's metrics (`batch_layer.raw_reads.JoinRead`), the
event's key text `j<q>` (the lookup's `on`, compiled to Spark columns as any expression) and
the joined version's columns `j<q>r<k><part>`. Each key's versions are ordered by (valid-from,
offset, partition) and given the valid-from of the next as the end of their range
(`read_versions`); an event joins the version whose range holds its time: a range join on the
key, with no window over the events. A table of at most `spark.broadcast_table_records`
records is broadcast (the events are probed where they are read, never shuffled); a bigger one
is joined by sorting both sides by key, with nothing gathered in the driver. A version that
deletes its key, or none, gives NULL parts and an absent path (`m` true), as the speed layer's
`TableVersions` does.

Measured on 1M events and a 300k-record table (docs/performance.md): the sort-merge join made
the run 34.1 s, broadcasting 29.8 s, broadcasting a table read in as many slices as there are
cores 25.8 s (the table's read comes before any event's).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import orjson
import pyarrow as pa
from pyspark.sql import Column, DataFrame, SparkSession, Window
from pyspark.sql import functions as F
from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition
from pyspark.sql.types import StructType

from batch_layer.decode import InputLayout, spark_ddl
from batch_layer.expressions import SparkValue, Stages, compile_value, text_of
from batch_layer.kafka_source import Records, Slice, SliceReader, plan_slices, read_slice
from batch_layer.raw_reads import JoinRead, RawRead, arrow_columns, column_types, python_columns
from shared.config import Settings, TableConfig
from shared.events import Malformed
from shared.expressions.syntax import Field
from shared.gc_tuning import collector_paused
from shared.kafka import client_config_of_options, reader_options
from shared.tables import parse_table_record

_VERSION_FIELDS = [
    ("partition", pa.int32()),
    ("offset", pa.int64()),
    ("key", pa.string()),
    ("valid_from", pa.int64()),
    ("deleted", pa.bool_()),
    ("malformed", pa.string()),
]


def _schema(reads: Sequence[RawRead]) -> pa.Schema:
    return pa.schema([*_VERSION_FIELDS, *column_types(reads, ())])


class KafkaTableVersions(DataSource):
    """A table's records as versions. Options: `kafka.<setting>` (as `lambda_kafka`), `table`
    (`TableConfig` as JSON), `reads` (the paths read: a JSON list of `[path, typed, text,
    number]`), `slices` (`[partition, start, end]`) and `fast_path` (the read columns through
    `pyarrow.json` where it agrees; as `lambda_kafka`)."""

    @classmethod
    def name(cls) -> str:
        return "lambda_kafka_table"

    def schema(self) -> str:
        return spark_ddl(_schema(_reads(self.options)))

    def reader(self, schema: StructType) -> DataSourceReader:
        return _VersionReader(dict(self.options))


def _reads(options: Mapping[str, str]) -> list[RawRead]:
    return [RawRead(tuple(p), t, x, n) for p, t, x, n in orjson.loads(options["reads"])]


class _VersionReader(SliceReader):
    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        if not isinstance(partition, Slice):
            return
        table = TableConfig.model_validate_json(self.options["table"])
        reads = _reads(self.options)
        client = client_config_of_options(self.options)
        fast = self.options.get("fast_path", "true") == "true"
        with collector_paused():
            for batch in read_slice(client, table.topic, partition, keys=True):
                yield _versions(table, reads, partition.partition, batch, fast=fast)


def _versions(
    table: TableConfig, reads: Sequence[RawRead], partition: int, batch: Records, *, fast: bool
) -> pa.RecordBatch:
    """One fetch of a table's records as version rows."""
    rows: list[list[Any]] = [[] for _ in _VERSION_FIELDS]
    assert batch.keys is not None
    for offset, key, value, timestamp in zip(
        batch.offsets, batch.keys, batch.values, batch.create_times, strict=True
    ):
        record = parse_table_record(key, value, timestamp, table)
        if isinstance(record, Malformed):
            fields = [partition, offset, None, None, None, record.reason]
        else:
            fields = [partition, offset, record.key, record.valid_from, record.fields is None, None]
        for column, item in zip(rows, fields, strict=True):
            column.append(item)
    kinds = [kind for _, kind in _VERSION_FIELDS]
    arrays = [pa.array(column, kind) for column, kind in zip(rows, kinds, strict=True)]
    times = pa.array(batch.create_times, pa.int64())
    read = arrow_columns(reads, (), batch.values, times) if fast else None
    if read is None:
        read = python_columns(reads, (), batch.values, batch.create_times)
    arrays += read
    return pa.RecordBatch.from_arrays(arrays, schema=_schema(reads))


def read_versions(
    spark: SparkSession, settings: Settings, join: JoinRead, ends: Mapping[str, int]
) -> DataFrame:
    """The valid versions of a join's table up to the snapshot's `ends` (partition -> end
    offset), each with the time its key's next version is valid from (`valid_to`, NULL for the
    last), marked for broadcast when the table is small (see the module's docstring)."""
    records = _table_records(spark, settings, join.table, join.reads, {}, ends)
    by_key = Window.partitionBy("key").orderBy("valid_from", "offset", "partition")
    ranged = (
        records.where(F.col("malformed").isNull())
        .withColumn("valid_to", F.lead("valid_from").over(by_key))
        .select(
            "key",
            "valid_from",
            "valid_to",
            "deleted",
            *[name for name, _ in column_types(join.reads, ())],
        )
    )
    if sum(ends.values()) <= settings.spark.broadcast_table_records:
        return F.broadcast(ranged)
    return ranged


def earliest_change(
    spark: SparkSession,
    settings: Settings,
    table: TableConfig,
    starts: Mapping[str, int],
    ends: Mapping[str, int],
) -> int | None:
    """The earliest valid-from time of the table's valid records in `[starts, ends)` (partition
    -> offset; None: no valid record there): the versions an incremental run has not read."""
    earliest = (
        _table_records(spark, settings, table, [], starts, ends)
        .where(F.col("malformed").isNull())
        .agg(F.min("valid_from"))
        .collect()[0][0]
    )
    return None if earliest is None else int(earliest)


def _table_records(
    spark: SparkSession,
    settings: Settings,
    table: TableConfig,
    reads: Sequence[RawRead],
    starts: Mapping[str, int],
    ends: Mapping[str, int],
) -> DataFrame:
    """The table's records in `[starts, ends)` (partition -> offset) as version rows, read in
    slices of at most a core's share of them (a table often has one partition, and a
    broadcast join reads it before any event)."""
    records = sum(end - starts.get(p, 0) for p, end in ends.items())
    cores = spark.sparkContext.defaultParallelism
    slices = plan_slices(
        {int(p): start for p, start in starts.items()},
        {int(p): end for p, end in ends.items()},
        max(1, min(settings.spark.max_offsets_per_slice, -(-records // cores))),
    )
    return (
        spark.read.format("lambda_kafka_table")
        .options(**reader_options(settings.kafka))
        .option("table", table.model_dump_json())
        .option(
            "reads",
            orjson.dumps([[list(r.path), r.typed, r.text, r.number] for r in reads]).decode(),
        )
        .option("slices", orjson.dumps(slices).decode())
        .option("fast_path", "true" if settings.spark.fast_path else "false")
        .load()
    )


def with_lookups(
    rows: DataFrame, layout: InputLayout, versions: Mapping[JoinRead, DataFrame]
) -> DataFrame:
    """`rows` with every join's key text and joined columns (see the module's docstring)."""
    for q, join in enumerate(layout.joins):
        rows = _join(rows, q, join, layout, versions[join])
    return rows


def _join(
    rows: DataFrame, q: int, join: JoinRead, layout: InputLayout, versions: DataFrame
) -> DataFrame:
    stages = Stages(f"_j{q}_")
    on = compile_value(
        join.on,
        lambda path: SparkValue(*(F.col(layout.raw_column(path, part)) for part in "bids")),
        _no_computed,
        F.col("time_ms"),
        lambda instant, zone: F.col(
            layout.zone_column(instant.path if isinstance(instant, Field) else None, zone)
        ),
        stages,
    )
    rows = stages.apply(rows)
    key = layout.join_key_column(q)
    rows = rows.withColumn(key, text_of(on))
    rows = rows.select(*[c for c in rows.columns if not c.startswith(f"_j{q}_")])
    v = f"_v{q}_"
    ranged = versions.select(*[F.col(c).alias(v + c) for c in versions.columns])
    time = F.col("time_ms")
    matched = rows.join(
        ranged,
        (F.col(key) == F.col(v + "key"))
        & (F.col(v + "valid_from") <= time)
        & (F.col(v + "valid_to").isNull() | (time < F.col(v + "valid_to"))),
        "left",
    )
    found: Column = F.col(v + "key").isNotNull() & ~F.col(v + "deleted")
    joined = []
    for k, read in enumerate(join.reads):
        for part, _ in read.parts:
            column = F.col(f"{v}r{k}{part}")
            value = (
                F.when(found, column).otherwise(F.lit(True))
                if part == "m"
                else F.when(found, column)
            )
            joined.append(value.alias(layout.joined_column(q, read.path, part)))
    return matched.select(*[F.col(c) for c in rows.columns], *joined)


def _no_computed(name: str) -> SparkValue:
    raise AssertionError(f"a lookup's `on` reads no computed field ({name})")
