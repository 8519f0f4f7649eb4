"""Kafka record values → Arrow rows of the `lambda_kafka` source (see `kafka_source`).

Two decoders that must agree ("Event validity" in docs/semantics.md): the shared parser
(`shared.events`, one record at a time, the definition) and a `pyarrow.json` fast path for a
whole block. The fast path only answers for blocks where it provably agrees; anything it
cannot vouch for goes to the shared parser. It refuses a block when:

- `batch_layer.json_lines` refuses it (a value missing, holding a line break, possibly nesting
  deeper than the shared parser reads; `NaN`/`Infinity` or a `\\u` escape in the block), or a
  value is not UTF-8;
- pyarrow fails on it: a field of another JSON type than the fast schema's (integer time and
  number value; text id, dimensions and distinct fields — so integer ids or dimensions, RFC
  3339 times, booleans, floats as times all fall back), a field given twice, a non-object;
- it yields another number of rows than records (two objects on a line, an empty value);
- any needed field is null or missing (the reasons differ: missing vs invalid), a time is out
  of range or after CreateTime + `max_future`, a value is not finite or so large that its
  integer spelling would decode differently (|v| >= 2**53).

A refused block is screened record by record with orjson (`Decoder._suspects`): the records
the fast path would refuse, as far as a parsed record shows (not an object, a needed field
missing, null or of another JSON type, a time out of range or too far in the future, a
number too large, a line break or `\\u` escape, deep nesting), go to the shared parser and
the rest is decoded fast again, in one `pyarrow.json` call: a call costs ~0.2-0.9 ms however
few its records, so isolating each bad record by its own calls would cost more than the slow
path.
The screen only chooses which path a record takes: what the fast path answers still comes
from a block pyarrow parsed whole and the checks above passed. What the screen cannot see
(a field given twice) is found by splitting the refused rest in halves down to `_MIN_SPLIT`
records, so such a record only sends its neighbourhood through the slow path. Measured on
blocks of 65,536 generator events with 0.5% malformed (the soak's mix): 9.7 µs of CPU per
record when every refused block was split in halves (70% of the records went through the
slow path), against 2.4 µs for clean blocks.
"""

from __future__ import annotations

import io
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import orjson
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as pj

from batch_layer.json_lines import json_lines, may_nest_deeply
from batch_layer.raw_reads import (
    JoinRead,
    RawRead,
    ZoneRead,
    arrow_columns,
    column_types,
    join_reads,
    python_columns,
    raw_reads,
    zone_reads,
)
from shared.config import SourceConfig
from shared.events import MAX_KEY_BYTES, MAX_TEXT_BYTES
from shared.metric_plan import MetricPlan

_RECORD_FIELDS = [
    ("partition", pa.int32()),
    ("offset", pa.int64()),
    ("time_ms", pa.int64()),
    ("clock_ms", pa.int64()),
    ("event_id", pa.string()),
    ("malformed", pa.string()),
]
"""Every row's record columns. `clock_ms` is how far the record moves its partition's stream
time: its event time, but never past its Kafka timestamp (rule 2). `event_id` is rule 4's
de-dup identity (`shared.events.dedup_identity`: the event time and the id), null without an
id field."""


@dataclass(frozen=True)
class InputLayout:
    """Where a source's metric inputs sit in a row: one column per source field the metrics
    read, not per metric. A field used as a dimension or fed to a text sketch (`distinct`) has
    a text column `t<j>` (its canonical text), a value field or one fed to a number sketch
    (`quantiles`) a number column `n<j>`; metric i's skip reason
    is `s<i>`. Flat columns of plain types, with no per-metric copies of a field, are what
    Spark caches cheaply: measured on 10M events, a per-metric `array<string>` layout cost
    twice the JVM time to persist and twice the cache memory (it spilled to disk)."""

    texts: tuple[str, ...]
    numbers: tuple[str, ...]
    metric_count: int
    raw: tuple[RawRead, ...] = ()
    """The JSON paths metrics with definitions read (their columns follow the skip reasons)."""
    zones: tuple[ZoneRead, ...] = ()
    """The zone offsets their zoned date parts read (columns `z<k>`, after the raw reads')."""
    joins: tuple[JoinRead, ...] = ()
    """The as-of joins of their lookups (columns added in Spark: `batch_layer.lookups`)."""

    @classmethod
    def of(cls, metrics: Sequence[MetricPlan]) -> InputLayout:
        texts = [name for m in metrics for name in m.text_fields]
        numbers = [name for m in metrics for name in m.number_fields]
        return cls(
            tuple(dict.fromkeys(texts)),
            tuple(dict.fromkeys(numbers)),
            len(metrics),
            raw_reads(metrics),
            zone_reads(metrics),
            join_reads(metrics),
        )

    def text_column(self, field: str) -> str:
        return f"t{self.texts.index(field)}"

    def number_column(self, field: str) -> str:
        return f"n{self.numbers.index(field)}"

    def raw_column(self, path: tuple[str, ...], part: str) -> str:
        """The column of one part (see `RawRead.parts`) of a path's read."""
        return f"r{[r.path for r in self.raw].index(path)}{part}"

    def join_of(self, metric: MetricPlan, alias: str) -> int:
        """The join (its index in `joins`) a metric's lookup named `alias` reads."""
        lookup = next(lookup for lookup in metric.lookups if lookup.alias == alias)
        return next(
            q
            for q, join in enumerate(self.joins)
            if join.table.name == lookup.table.name and join.on == lookup.on
        )

    def joined_column(self, join: int, path: tuple[str, ...], part: str) -> str:
        """The column of one part of a path read in a join's version (relative to the
        lookup's name)."""
        return f"j{join}r{[r.path for r in self.joins[join].reads].index(path)}{part}"

    def join_key_column(self, join: int) -> str:
        """The column of a join's key text (the lookup's `on`) in the event's row."""
        return f"j{join}"

    def definition_inputs(self) -> list[str]:
        """The columns only definitions read (raw paths, zone offsets, the joins' keys and
        joined versions), which a run drops once the metrics' inputs are computed: its
        persisted rows need not carry them."""
        joined = [
            self.joined_column(q, read.path, part)
            for q, join in enumerate(self.joins)
            for read in join.reads
            for part, _ in read.parts
        ]
        keys = [self.join_key_column(q) for q in range(len(self.joins))]
        return [name for name, _ in self.raw_fields()] + keys + joined

    def zone_column(self, path: tuple[str, ...] | None, zone: str) -> str:
        """The column of a zone's offsets at the event time (`path` None) or a field."""
        return f"z{self.zones.index(ZoneRead(path, zone))}"

    def raw_fields(self) -> list[tuple[str, pa.DataType]]:
        """The raw reads' and zone reads' columns, in order."""
        return column_types(self.raw, self.zones)

    def arrow_schema(self) -> pa.Schema:
        """One row per record: the record's columns, the text and number columns, the skip
        reasons, then the raw reads' columns."""
        return pa.schema(
            [
                *_RECORD_FIELDS,
                *[(f"t{j}", pa.string()) for j in range(len(self.texts))],
                *[(f"n{j}", pa.float64()) for j in range(len(self.numbers))],
                *[(f"s{i}", pa.string()) for i in range(self.metric_count)],
                *self.raw_fields(),
            ]
        )

    def ddl(self) -> str:
        """`arrow_schema` in Spark's DDL."""
        return spark_ddl(self.arrow_schema())


def spark_ddl(schema: pa.Schema) -> str:
    """An Arrow schema of the data sources' column types in Spark's DDL."""
    return ", ".join(f"{f.name} {_SPARK_TYPES[f.type]}" for f in schema)


_SPARK_TYPES = {
    pa.bool_(): "BOOLEAN",
    pa.int32(): "INT",
    pa.int64(): "BIGINT",
    pa.float64(): "DOUBLE",
    pa.string(): "STRING",
}
"""Spark's DDL names of the Arrow types of the source's columns."""

_MIN_SPLIT = 256
_BIG = float(2**53)
_SURELY_SHORT = MAX_TEXT_BYTES // 4 // 2
"""Texts of at most this many characters fit any key: screened without encoding them."""


class _Refused(Exception):
    """The fast path cannot vouch for this block."""


def _fast_number(value: object) -> bool:
    """A JSON number the fast path reads as the shared parser does."""
    return (type(value) is int or type(value) is float) and abs(value) < _BIG


class Decoder:
    """Decodes blocks of one source's records for its metrics."""

    def __init__(
        self, source: SourceConfig, metrics: Sequence[MetricPlan], *, fast: bool = True
    ) -> None:
        self.source = source
        self.metrics = list(metrics)
        self.fast = fast
        self.layout = InputLayout.of(self.metrics)
        fields: dict[str, pa.DataType] = {source.time_field: pa.int64()}
        if source.id_field is not None:
            fields.setdefault(source.id_field, pa.string())
        wanted = [(name, pa.string()) for name in self.layout.texts]
        wanted += [(name, pa.float64()) for name in self.layout.numbers]
        for name, kind in wanted:
            if fields.setdefault(name, kind) != kind:
                self.fast = False  # a field read both as text and as a number (or time)
        self._fields = fields
        self._multi_keys = [m.key for m in self.metrics if m.definitions is None and len(m.key) > 1]
        self.schema = pa.schema(list(fields.items()))
        self.arrow_schema = self.layout.arrow_schema()
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
        if not self.layout.raw and not self.layout.zones:
            yield from self._decode(partition, offsets, create_times, values, screened=False)
            return
        at = 0
        reads, zones = self.layout.raw, self.layout.zones
        for batch in self._decode(partition, offsets, create_times, values, screened=False):
            block, times = values[at : at + batch.num_rows], batch.column("time_ms")
            at += batch.num_rows
            raw = arrow_columns(reads, zones, block, times) if self.fast else None
            if raw is None:
                raw = python_columns(reads, zones, block, times.to_pylist())
            columns = batch.columns[: batch.num_columns - len(raw)] + raw
            yield pa.RecordBatch.from_arrays(columns, schema=self.arrow_schema)

    def _decode(
        self,
        partition: int,
        offsets: Sequence[int],
        create_times: Sequence[int],
        values: Sequence[bytes | None],
        *,
        screened: bool,
    ) -> Iterator[pa.RecordBatch]:
        if self.fast:
            try:
                yield self._fast(partition, offsets, create_times, values)
                self.fast_records += len(offsets)
                return
            except _Refused:
                pass
            suspects = [] if screened else self._suspects(create_times, values)
            if suspects:
                yield self._fast_rest(partition, offsets, create_times, values, suspects)
                return
            if len(offsets) > _MIN_SPLIT:
                half = len(offsets) // 2
                for part in (slice(None, half), slice(half, None)):
                    yield from self._decode(
                        partition,
                        offsets[part],
                        create_times[part],
                        values[part],
                        screened=True,
                    )
                return
        self.slow_records += len(offsets)
        yield self._slow(partition, offsets, create_times, values)

    def _fast_rest(
        self,
        partition: int,
        offsets: Sequence[int],
        create_times: Sequence[int],
        values: Sequence[bytes | None],
        suspects: Sequence[int],
    ) -> pa.RecordBatch:
        """The suspects through the shared parser, the rest decoded again: one batch in
        offset order."""
        slow = set(suspects)
        kept = [i for i in range(len(offsets)) if i not in slow]
        batches = [
            self._slow(
                partition,
                [offsets[i] for i in suspects],
                [create_times[i] for i in suspects],
                [values[i] for i in suspects],
            )
        ]
        self.slow_records += len(suspects)
        if kept:
            batches += self._decode(
                partition,
                [offsets[i] for i in kept],
                [create_times[i] for i in kept],
                [values[i] for i in kept],
                screened=True,
            )
        rows = pa.Table.from_batches(batches, schema=self.arrow_schema).sort_by("offset")
        return rows.combine_chunks().to_batches()[0]

    def _suspects(self, create_times: Sequence[int], values: Sequence[bytes | None]) -> list[int]:
        """Indices of the records the fast path would refuse, as far as orjson's reading of
        each record shows (see the module's docstring)."""
        from shared.events import MAX_EVENT_MS, MIN_EVENT_MS

        time_field, max_future = self.source.time_field, self.source.max_future
        texts = [name for name, kind in self._fields.items() if kind == pa.string()]
        numbers = [name for name, kind in self._fields.items() if kind == pa.float64()]
        suspects = []
        for i, (created, value) in enumerate(zip(create_times, values, strict=True)):
            if (
                not value
                or b"\n" in value
                or b"\r" in value
                or b"\\u" in value
                or may_nest_deeply(value)
            ):
                suspects.append(i)
                continue
            try:
                event = orjson.loads(value)
            except orjson.JSONDecodeError:
                suspects.append(i)
                continue
            if type(event) is not dict:
                suspects.append(i)
                continue
            time_ms = event.get(time_field)
            if (
                type(time_ms) is not int
                or not MIN_EVENT_MS <= time_ms <= MAX_EVENT_MS
                or time_ms > created + max_future
                or any(type(event.get(name)) is not str for name in texts)
                or any(not _fast_number(event.get(name)) for name in numbers)
                or (
                    any(len(event[name]) > _SURELY_SHORT for name in texts)
                    and self._too_long(pa.Table.from_pylist([event], schema=self.schema))
                )
            ):
                suspects.append(i)
        return suspects

    def _fast(
        self,
        partition: int,
        offsets: Sequence[int],
        create_times: Sequence[int],
        values: Sequence[bytes | None],
    ) -> pa.RecordBatch:
        from shared.events import MAX_EVENT_MS, MIN_EVENT_MS

        n = len(offsets)
        data = json_lines(values)
        if data is None:
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
        for name in self.layout.numbers:
            column = table.column(name)
            if (
                pc.any(pc.invert(pc.is_finite(column))).as_py()
                or pc.max(pc.abs(column)).as_py() >= _BIG
            ):
                raise _Refused
        if self._too_long(table):
            raise _Refused
        return self._fast_rows(partition, offsets, create, table)

    def _too_long(self, table: pa.Table) -> bool:
        """Whether an id or key text may exceed what the batch view stores (`MAX_TEXT_BYTES`
        each, `MAX_KEY_BYTES` a key): the shared parser decides those records' reasons."""
        lengths = {
            name: pc.binary_length(table.column(name))
            for name, kind in self._fields.items()
            if kind == pa.string()
        }
        if any(pc.max(length).as_py() > MAX_TEXT_BYTES for length in lengths.values()):
            return True
        for dims in self._multi_keys:
            total = lengths[dims[0]]
            for dim in dims[1:]:
                total = pc.add(total, lengths[dim])
            if pc.max(total).as_py() > MAX_KEY_BYTES:
                return True
        return False

    def _fast_rows(
        self, partition: int, offsets: Sequence[int], timestamps: pa.Array, table: pa.Table
    ) -> pa.RecordBatch:
        n = table.num_rows
        times = table.column(self.source.time_field).combine_chunks()
        ids = (
            pc.binary_join_element_wise(
                pc.cast(times, pa.string()),
                table.column(self.source.id_field).combine_chunks(),
                ":",
            )
            if self.source.id_field is not None
            else pa.nulls(n, pa.string())
        )
        columns = [
            pa.array(np.full(n, partition, dtype=np.int32)),
            pa.array(offsets, pa.int64()),
            times,
            pc.min_element_wise(times, timestamps),
            ids,
            pa.nulls(n, pa.string()),
        ]
        columns += [table.column(name).combine_chunks() for name in self.layout.texts]
        columns += [table.column(name).combine_chunks() for name in self.layout.numbers]
        columns += [pa.nulls(n, pa.string())] * len(self.metrics)
        columns += [pa.nulls(n, kind) for _, kind in self.layout.raw_fields()]
        return pa.RecordBatch.from_arrays(columns, schema=self.arrow_schema)

    def _slow(
        self,
        partition: int,
        offsets: Sequence[int],
        create_times: Sequence[int],
        values: Sequence[bytes | None],
    ) -> pa.RecordBatch:
        builder = _RowBuilder(self.source, self.layout, self.metrics)
        for offset, create_time, value in zip(offsets, create_times, values, strict=True):
            builder.add(partition, offset, create_time, value)
        return builder.flush()


class _RowBuilder:
    """Rows from the shared parser, one record at a time, emitted as an Arrow record batch.
    Each metric that takes the event fills its fields' columns (metrics sharing a field give
    it the same canonical value); a field no metric takes stays null."""

    def __init__(
        self, source: SourceConfig, layout: InputLayout, metrics: Sequence[MetricPlan]
    ) -> None:
        self.source = source
        self.metrics = metrics
        self.schema = layout.arrow_schema()
        self.columns: list[list[Any]] = [[] for _ in self.schema.names]
        first = len(_RECORD_FIELDS)
        numbers = first + len(layout.texts)
        self.skip_columns = [numbers + len(layout.numbers) + i for i in range(len(metrics))]
        self.targets: list[tuple[list[int], int | None, list[int]]] = [
            (
                [first + layout.texts.index(name) for name in m.key],
                None if m.value is None else numbers + layout.numbers.index(m.value),
                [
                    numbers + layout.numbers.index(i.field)
                    if i.number
                    else first + layout.texts.index(i.field)
                    for i in m.sketch_inputs
                ],
            )
            if m.definitions is None
            else ([], None, [])  # read in Spark from the raw reads' columns
            for m in metrics
        ]

    def add(self, partition: int, offset: int, create_time_ms: int, value: bytes | None) -> None:
        from shared.events import (
            Malformed,
            MetricInput,
            Skipped,
            dedup_identity,
            metric_input,
            parse_record,
        )

        event = parse_record(value, create_time_ms, self.source)
        row: list[Any] = [None] * len(self.columns)
        row[:2] = partition, offset
        if isinstance(event, Malformed):
            row[5] = event.reason
        else:
            time_ms, event_id = event.time_ms, event.event_id
            row[2:5] = (
                time_ms,
                min(time_ms, create_time_ms),
                None if event_id is None else dedup_identity(time_ms, event_id),
            )
            for metric, skip, (keys, value_at, sketch_fields) in zip(
                self.metrics, self.skip_columns, self.targets, strict=True
            ):
                if metric.definitions is not None:
                    continue
                contribution = metric_input(event, metric)
                if isinstance(contribution, Skipped):
                    row[skip] = contribution.reason
                    continue
                assert isinstance(contribution, MetricInput)
                for at, text in zip(keys, contribution.key, strict=True):
                    row[at] = text
                for at, item in zip(sketch_fields, contribution.sketch_items, strict=True):
                    row[at] = item
                if value_at is not None:
                    row[value_at] = contribution.value
        for column, item in zip(self.columns, row, strict=True):
            column.append(item)

    def flush(self) -> pa.RecordBatch:
        arrays = [
            pa.array(column, type=field.type)
            for column, field in zip(self.columns, self.schema, strict=True)
        ]
        return pa.RecordBatch.from_arrays(arrays, schema=self.schema)
