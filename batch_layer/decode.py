"""Kafka record values → Arrow rows of the `lambda_kafka` source (see `kafka_source`).

Two decoders that must agree ("Event validity" in DESIGN.md): the shared parser
(`shared.events`, one record at a time, the definition) and a `pyarrow.json` fast path for a
whole block. The fast path only answers for blocks where it provably agrees; anything it
cannot vouch for goes to the shared parser. It refuses a block when:

- a value is missing, holds a line break (blocks are newline-delimited), is not UTF-8, or the
  block contains `NaN`/`Infinity` (pyarrow accepts them, JSON does not) or a `\\u` escape
  (lone surrogates are rejected by one parser and not always by the other);
- pyarrow fails on it: a field of another JSON type than the fast schema's (integer time and
  number value; text id, dimensions and distinct fields — so integer ids or dimensions, RFC
  3339 times, booleans, floats as times all fall back), a field given twice, a non-object;
- it yields another number of rows than records (two objects on a line, an empty value);
- any needed field is null or missing (the reasons differ: missing vs invalid), a time is out
  of range or after CreateTime + `max_future`, a value is not finite or so large that its
  integer spelling would decode differently (|v| >= 2**53).

A refused block is split in halves down to `_MIN_SPLIT` records, so one malformed record only
sends its neighbourhood through the slow path.
"""

from __future__ import annotations

import io
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as pj

from shared.config import MetricConfig, SourceConfig

_RECORD_FIELDS = [
    ("partition", pa.int32()),
    ("offset", pa.int64()),
    ("time_ms", pa.int64()),
    ("event_id", pa.string()),
    ("malformed", pa.string()),
]
_TEXT_LIST = pa.list_(pa.string())


def arrow_schema(n_metrics: int) -> pa.Schema:
    """One row per record: the record's columns, then per metric i (in configured order) its
    key `k<i>`, value `v<i>`, distinct values `d<i>` and skip reason `s<i>`."""
    fields = list(_RECORD_FIELDS)
    for i in range(n_metrics):
        fields += [(f"k{i}", _TEXT_LIST), (f"v{i}", pa.float64()), (f"d{i}", _TEXT_LIST)]
        fields.append((f"s{i}", pa.string()))
    return pa.schema(fields)


def schema_ddl(n_metrics: int) -> str:
    """`arrow_schema` in Spark's DDL."""
    columns = ["partition INT", "offset BIGINT", "time_ms BIGINT", "event_id STRING"]
    columns.append("malformed STRING")
    for i in range(n_metrics):
        columns += [f"k{i} ARRAY<STRING>", f"v{i} DOUBLE", f"d{i} ARRAY<STRING>", f"s{i} STRING"]
    return ", ".join(columns)


_MIN_SPLIT = 256
_BIG = float(2**53)


class _Refused(Exception):
    """The fast path cannot vouch for this block."""


class Decoder:
    """Decodes blocks of one source's records for its metrics."""

    def __init__(
        self, source: SourceConfig, metrics: Sequence[MetricConfig], *, fast: bool = True
    ) -> None:
        self.source = source
        self.metrics = list(metrics)
        self.fast = fast
        fields: dict[str, pa.DataType] = {source.time_field: pa.int64()}
        if source.id_field is not None:
            fields.setdefault(source.id_field, pa.string())
        for metric in self.metrics:
            for name in (*metric.key, *metric.distinct_fields):
                if fields.setdefault(name, pa.string()) != pa.string():
                    self.fast = False  # a field used both as time and as text
            if (
                metric.value is not None
                and fields.setdefault(metric.value, pa.float64()) != pa.float64()
            ):
                self.fast = False
        self.schema = pa.schema(list(fields.items()))
        self.arrow_schema = arrow_schema(len(self.metrics))
        self.parse_options = pj.ParseOptions(
            explicit_schema=self.schema,
            unexpected_field_behavior="ignore",
            newlines_in_values=False,
        )
        self.read_options = pj.ReadOptions(use_threads=False, block_size=1 << 26)
        self.fast_records = 0
        self.slow_records = 0

    def decode(
        self,
        partition: int,
        offsets: Sequence[int],
        create_times: Sequence[int],
        values: Sequence[bytes | None],
    ) -> Iterator[pa.RecordBatch]:
        if not offsets:
            return
        if self.fast:
            try:
                yield self._fast(partition, offsets, create_times, values)
                self.fast_records += len(offsets)
                return
            except _Refused:
                pass
            if len(offsets) > _MIN_SPLIT:
                half = len(offsets) // 2
                yield from self.decode(
                    partition, offsets[:half], create_times[:half], values[:half]
                )
                yield from self.decode(
                    partition, offsets[half:], create_times[half:], values[half:]
                )
                return
        self.slow_records += len(offsets)
        yield self._slow(partition, offsets, create_times, values)

    def _fast(
        self,
        partition: int,
        offsets: Sequence[int],
        create_times: Sequence[int],
        values: Sequence[bytes | None],
    ) -> pa.RecordBatch:
        from shared.events import MAX_EVENT_MS, MIN_EVENT_MS

        n = len(offsets)
        if any(v is None for v in values):
            raise _Refused
        data = b"\n".join(values)  # type: ignore[arg-type]
        if (
            data.count(b"\n") != n - 1
            or b"\r" in data
            or b"NaN" in data
            or b"Infinity" in data
            or b"\\u" in data
        ):
            raise _Refused
        try:
            data.decode("utf-8")
            table = pj.read_json(
                io.BytesIO(data), read_options=self.read_options, parse_options=self.parse_options
            )
        except (UnicodeDecodeError, pa.ArrowInvalid) as exc:
            raise _Refused from exc
        if table.num_rows != n or any(col.null_count for col in table.columns):
            raise _Refused
        times = table.column(self.source.time_field)
        create = pa.array(create_times, pa.int64())
        if (
            pc.min(times).as_py() < MIN_EVENT_MS
            or pc.max(times).as_py() > MAX_EVENT_MS
            or pc.any(pc.greater(times, pc.add(create, self.source.max_future))).as_py()
        ):
            raise _Refused
        for metric in self.metrics:
            if metric.value is not None:
                column = table.column(metric.value)
                if (
                    pc.any(pc.invert(pc.is_finite(column))).as_py()
                    or pc.max(pc.abs(column)).as_py() >= _BIG
                ):
                    raise _Refused
        return self._fast_rows(partition, offsets, table)

    def _fast_rows(self, partition: int, offsets: Sequence[int], table: pa.Table) -> pa.RecordBatch:
        n = table.num_rows
        ids = (
            table.column(self.source.id_field).combine_chunks()
            if self.source.id_field is not None
            else pa.nulls(n, pa.string())
        )
        columns = [
            pa.array(np.full(n, partition, dtype=np.int32)),
            pa.array(offsets, pa.int64()),
            table.column(self.source.time_field).combine_chunks(),
            ids,
            pa.nulls(n, pa.string()),
        ]
        for metric in self.metrics:
            columns.append(_lists(table, metric.key, n))
            columns.append(
                table.column(metric.value).combine_chunks()
                if metric.value is not None
                else pa.nulls(n, pa.float64())
            )
            columns.append(_lists(table, metric.distinct_fields, n))
            columns.append(pa.nulls(n, pa.string()))
        return pa.RecordBatch.from_arrays(columns, schema=self.arrow_schema)

    def _slow(
        self,
        partition: int,
        offsets: Sequence[int],
        create_times: Sequence[int],
        values: Sequence[bytes | None],
    ) -> pa.RecordBatch:
        builder = _RowBuilder(self.source, self.metrics)
        for offset, create_time, value in zip(offsets, create_times, values, strict=True):
            builder.add(partition, offset, create_time, value)
        return builder.flush()


def _lists(table: pa.Table, names: Sequence[str], n: int) -> pa.Array:
    """A list<string> column of the named text columns, row by row."""
    k = len(names)
    if k == 0:
        return pa.ListArray.from_arrays(
            pa.array(np.zeros(n + 1, np.int32)), pa.array([], pa.string())
        )
    flat = pa.concat_arrays([table.column(name).combine_chunks() for name in names])
    if k > 1:
        order = (np.arange(n)[:, None] + np.arange(k)[None, :] * n).ravel()
        flat = flat.take(pa.array(order))
    return pa.ListArray.from_arrays(pa.array(np.arange(0, n * k + 1, k, dtype=np.int32)), flat)


class _RowBuilder:
    """Rows from the shared parser, one record at a time, emitted as an Arrow record batch."""

    def __init__(self, source: SourceConfig, metrics: Sequence[MetricConfig]) -> None:
        self.source = source
        self.metrics = metrics
        self.schema = arrow_schema(len(metrics))
        self.columns: list[list[Any]] = [[] for _ in self.schema.names]

    def add(self, partition: int, offset: int, create_time_ms: int, value: bytes | None) -> None:
        from shared.events import Malformed, Skipped, metric_input, parse_record

        event = parse_record(value, create_time_ms, self.source)
        row: list[Any]
        if isinstance(event, Malformed):
            row = [partition, offset, None, None, event.reason]
            row += [None, None, None, None] * len(self.metrics)
        else:
            row = [partition, offset, event.time_ms, event.event_id, None]
            for metric in self.metrics:
                contribution = metric_input(event, metric)
                if isinstance(contribution, Skipped):
                    row += [None, None, None, contribution.reason]
                else:
                    row.append(list(contribution.key))
                    row.append(contribution.value)
                    row.append(list(contribution.distincts))
                    row.append(None)
        for column, item in zip(self.columns, row, strict=True):
            column.append(item)

    def flush(self) -> pa.RecordBatch:
        arrays = [
            pa.array(column, type=field.type)
            for column, field in zip(self.columns, self.schema, strict=True)
        ]
        return pa.RecordBatch.from_arrays(arrays, schema=self.schema)
