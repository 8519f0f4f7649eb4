"""What the metrics with definitions (rule 10 in docs/semantics.md) read from an event, as
columns beside the decoded row: the JSON paths their expressions and inputs read (`RawRead`)
and the zone offsets their zoned date parts read (`ZoneRead`). Spark evaluates the
expressions and checks the inputs over these columns (`batch_layer.defined_inputs`).

Two ways to compute them, which must agree:

- `python_columns` reads each record as the speed layer does (`decode_json`, `read_path`,
  `from_json`, `canonical`, `finite_number`): the definition, ~6 µs a record for three paths;
- `arrow_columns` parses a whole block with `pyarrow.json` against a schema of just those
  paths (~0.5 µs a record), each path typed as the first records that hold it say. pyarrow
  refuses any value of another JSON type than its column's, with one exception: a DOUBLE
  column takes integers too, so the rows where a DOUBLE is integral (an integer may have been
  written there; every value at or beyond 2**53 is integral) are read again by
  `python_columns`. A block it cannot vouch for (`None`) is read by `python_columns` whole:
  one `batch_layer.json_lines` refuses, one with `null` anywhere (Arrow reads JSON null and
  an absent path alike, rule 10 does not), a path that is
  an object or array in the first records, or a value pyarrow refuses (another type, a field
  given twice, a non-object, invalid UTF-8).
"""

from __future__ import annotations

import io
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

import numpy as np
import orjson
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as pj

from batch_layer.json_lines import json_lines
from shared.config import TableConfig
from shared.events import canonical, decode_json, finite_number
from shared.expressions import MISSING, from_json, read_path
from shared.expressions.evaluate import zone_offset_ms
from shared.expressions.syntax import BIGINT_MAX, BIGINT_MIN, Call, Field, Node, walk
from shared.metric_plan import MetricPlan


@dataclass(frozen=True)
class RawRead:
    """How the metrics with definitions read one JSON path: its columns `r<j><part>`."""

    path: tuple[str, ...]
    typed: bool
    """Read by an expression: the value's kind parts `b` (BOOLEAN), `i` (BIGINT), `d` (DOUBLE)
    and `s` (STRING), as `shared.expressions.from_json` reads it."""
    text: bool
    """Read as a text input (a key dimension, a distinct field): its canonical text `c`."""
    number: bool
    """Read as a number input (the value, a quantiles field): its finite number `n`."""

    @property
    def parts(self) -> tuple[tuple[str, pa.DataType], ...]:
        """(part, Arrow type) of the columns this read needs; `m` says the path is absent."""
        parts: list[tuple[str, pa.DataType]] = []
        if self.typed:
            parts += [("b", pa.bool_()), ("i", pa.int64()), ("d", pa.float64()), ("s", pa.string())]
        if self.text:
            parts.append(("c", pa.string()))
        if self.number:
            parts.append(("n", pa.float64()))
        if self.text or self.number:
            parts.append(("m", pa.bool_()))
        return tuple(parts)


@dataclass(frozen=True)
class ZoneRead:
    """A zone's UTC offset at an instant a zoned date part reads (`hour(ts, 'Europe/Berlin')`):
    the event time (`path` None) or a field. Computed in Python with the speed layer's tz
    database (`shared.expressions.zone_offset_ms`), so both layers agree on every instant."""

    path: tuple[str, ...] | None
    zone: str


def zone_reads(metrics: Sequence[MetricPlan]) -> tuple[ZoneRead, ...]:
    """Every (instant, zone) the metrics' zoned date parts read, once."""
    reads: dict[ZoneRead, None] = {}
    for m in metrics:
        for root in _roots(m):
            for node in walk(root):
                if isinstance(node, Call) and node.zone is not None:
                    instant = node.args[0]
                    path = instant.path if isinstance(instant, Field) else None
                    reads[ZoneRead(path, node.zone)] = None
    return tuple(reads)


def _roots(metric: MetricPlan) -> list[Node]:
    """The expressions of a metric's definitions (none without), its lookups' `on` first."""
    definitions = metric.definitions
    if definitions is None:
        return []
    roots = [lookup.on for lookup in metric.lookups]
    roots += [node for _, node in definitions.fields]
    return roots if definitions.where is None else [*roots, definitions.where]


def raw_reads(metrics: Sequence[MetricPlan]) -> tuple[RawRead, ...]:
    """Every JSON path of the events the metrics with definitions read, once, with all the
    ways they read it (not the paths of their lookups, which the joined tables give)."""
    return _reads(metrics, lambda metric, path: path[0] not in _aliases(metric))


def _aliases(metric: MetricPlan) -> set[str]:
    return {lookup.alias for lookup in metric.lookups}


def _reads(
    metrics: Sequence[MetricPlan],
    wanted: Callable[[MetricPlan, tuple[str, ...]], tuple[str, ...] | bool],
) -> tuple[RawRead, ...]:
    """The paths the metrics' definitions read that `wanted` keeps (as the path it gives, or
    as it is when it gives True), with every way they are read."""
    typed: dict[tuple[str, ...], None] = {}
    texts: dict[tuple[str, ...], None] = {}
    numbers: dict[tuple[str, ...], None] = {}

    def keep(metric: MetricPlan, path: tuple[str, ...], into: dict[tuple[str, ...], None]) -> None:
        kept = wanted(metric, path)
        if kept is True:
            into[path] = None
        elif kept:
            into[kept] = None

    for m in metrics:
        definitions = m.definitions
        if definitions is None:
            continue
        for root in _roots(m):
            for node in walk(root):
                if isinstance(node, Field):
                    keep(m, node.path, typed)
        for names, into in ((m.text_inputs, texts), (m.number_inputs, numbers)):
            for name in names:
                node = definitions.reference(name)
                if isinstance(node, Field):
                    keep(m, node.path, into)
    paths = dict.fromkeys([*typed, *texts, *numbers])
    return tuple(RawRead(p, p in typed, p in texts, p in numbers) for p in paths)


@dataclass(frozen=True)
class JoinRead:
    """One as-of join of a source's events with a table (rule 11 in docs/semantics.md), shared
    by every metric joining `table` on the same `on`: the event's key text is column `j<q>`,
    and each path the metrics read in the joined version (`reads`, relative to the lookup's
    name) has the columns `j<q>r<k><part>` of `RawRead.parts`."""

    table: TableConfig
    on: Node
    reads: tuple[RawRead, ...]


def join_reads(metrics: Sequence[MetricPlan]) -> tuple[JoinRead, ...]:
    """Every distinct (table, `on`) the metrics join, with what they read of it."""
    joins: dict[tuple[str, Node], TableConfig] = {}
    for m in metrics:
        for lookup in m.lookups:
            joins[(lookup.table.name, lookup.on)] = lookup.table
    return tuple(
        JoinRead(table, on, _reads(metrics, partial(_inside, name, on)))
        for (name, on), table in joins.items()
    )


def _inside(
    table: str, on: Node, metric: MetricPlan, path: tuple[str, ...]
) -> tuple[str, ...] | bool:
    """`path` relative to the version joined from `table` on `on`, when the metric reads it
    through such a lookup."""
    for lookup in metric.lookups:
        if lookup.table.name == table and lookup.on == on and path[0] == lookup.alias:
            return path[1:]
    return False


def column_types(
    reads: Sequence[RawRead], zones: Sequence[ZoneRead]
) -> list[tuple[str, pa.DataType]]:
    """The raw reads' columns `r<j><part>` and the zone reads' `z<k>`, in order."""
    fields = [(f"r{j}{part}", kind) for j, read in enumerate(reads) for part, kind in read.parts]
    return fields + [(f"z{k}", pa.int64()) for k in range(len(zones))]


def python_columns(
    reads: Sequence[RawRead],
    zones: Sequence[ZoneRead],
    values: Sequence[bytes | None],
    times: Sequence[int | None],
) -> list[pa.Array]:
    """The columns of `values` read record by record (a record that is not a JSON object
    reads as one without fields; its row is malformed anyway)."""
    columns: list[list[Any]] = []
    readers = []
    for read in reads:
        parts = {part: len(columns) + k for k, (part, _) in enumerate(read.parts)}
        columns += [[] for _ in read.parts]
        readers.append((read.path, parts))
    offsets: list[list[int | None]] = [[] for _ in zones]
    for value, time_ms in zip(values, times, strict=True):
        try:
            event = decode_json(value) if value is not None else None
        except (ValueError, RecursionError):
            event = None
        if type(event) is not dict:
            event = {}
        for path, parts in readers:
            raw = read_path(event, path)
            if "b" in parts:
                typed = from_json(raw)
                kind = type(typed)
                columns[parts["b"]].append(typed if kind is bool else None)
                columns[parts["i"]].append(typed if kind is int else None)
                columns[parts["d"]].append(typed if kind is float else None)
                columns[parts["s"]].append(typed if kind is str else None)
            if "c" in parts:
                columns[parts["c"]].append(canonical(raw))
            if "n" in parts:
                columns[parts["n"]].append(finite_number(raw))
            if "m" in parts:
                columns[parts["m"]].append(raw is MISSING)
        for zone, into in zip(zones, offsets, strict=True):
            instant = time_ms if zone.path is None else from_json(read_path(event, zone.path))
            into.append(zone_offset_ms(instant, zone.zone))
    kinds = [kind for _, kind in column_types(reads, ())]
    arrays = [pa.array(column, type=kind) for column, kind in zip(columns, kinds, strict=True)]
    return arrays + [pa.array(column, type=pa.int64()) for column in offsets]


_SAMPLE = 16
"""How many records are read to type a path for `arrow_columns`."""
_READ_OPTIONS = pj.ReadOptions(use_threads=False, block_size=1 << 26)
_JSON_KINDS: dict[type, pa.DataType] = {
    bool: pa.bool_(),
    int: pa.int64(),
    float: pa.float64(),
    str: pa.string(),
}


def arrow_columns(
    reads: Sequence[RawRead],
    zones: Sequence[ZoneRead],
    values: Sequence[bytes | None],
    times: pa.Array,
) -> list[pa.Array] | None:
    """The columns `python_columns` gives for `values`, from one `pyarrow.json` parse of the
    block, or None when it cannot vouch for the block (see the module's docstring)."""
    n = len(values)
    data = json_lines(values)
    if data is None or b"null" in data:
        return None
    kinds = _path_kinds([r.path for r in reads], values)
    schema = None if kinds is None else _nested_schema(kinds)
    if kinds is None or schema is None:
        return None
    try:
        data.decode("utf-8")
        table = pj.read_json(
            io.BytesIO(data),
            read_options=_READ_OPTIONS,
            parse_options=pj.ParseOptions(
                explicit_schema=schema,
                unexpected_field_behavior="ignore",
                newlines_in_values=False,
            ),
        )
    except (UnicodeDecodeError, pa.ArrowInvalid):
        return None
    if table.num_rows != n:
        return None
    leaves = {path: _leaf(table, path) for path in kinds}
    doubtful = np.zeros(n, dtype=bool)
    columns: list[pa.Array] = []
    for read in reads:
        leaf, kind = leaves[read.path], kinds[read.path]
        if kind == pa.float64() or kind == pa.int64():
            doubtful |= _maybe_other_number(leaf, kind)
        columns += [_part(leaf, kind, part, type_) for part, type_ in read.parts]
    columns += [
        _zone_offsets(times if zone.path is None else leaves[zone.path], zone.zone)
        for zone in zones
    ]
    if doubtful.any():
        rows = np.flatnonzero(doubtful)
        again = python_columns(
            reads,
            zones,
            [values[i] for i in rows.tolist()],
            pc.take(times, pa.array(rows)).to_pylist(),
        )
        mask = pa.array(doubtful)
        columns = [
            pc.replace_with_mask(column, mask, replacement)
            for column, replacement in zip(columns, again, strict=True)
        ]
    return columns


def _path_kinds(
    paths: Sequence[tuple[str, ...]], values: Sequence[bytes | None]
) -> dict[tuple[str, ...], pa.DataType] | None:
    """Each path's Arrow type, as the first records holding it say (STRING where none does:
    every value then must be absent); None when one holds an object, an array or an integer
    beyond 64 bits there."""
    kinds: dict[tuple[str, ...], pa.DataType] = {}
    for value in values[:_SAMPLE]:
        try:
            event = orjson.loads(value)  # type: ignore[arg-type]
        except orjson.JSONDecodeError:
            continue
        if type(event) is not dict:
            continue
        for path in paths:
            if path in kinds:
                continue
            raw = read_path(event, path)
            if raw is MISSING:
                continue
            kind = _JSON_KINDS.get(type(raw))
            if kind is None or (type(raw) is int and not BIGINT_MIN <= raw <= BIGINT_MAX):
                return None
            kinds[path] = kind
    return {path: kinds.get(path, pa.string()) for path in paths}


def _nested_schema(kinds: dict[tuple[str, ...], pa.DataType]) -> pa.Schema | None:
    """The paths as nested Arrow fields (`geo.country` a STRING inside a struct `geo`); None
    when a path is both a value and an object holding another."""
    tree: dict[str, Any] = {}
    for path, kind in kinds.items():
        node = tree
        for step in path[:-1]:
            child = node.setdefault(step, {})
            if not isinstance(child, dict):
                return None
            node = child
        if path[-1] in node:
            return None
        node[path[-1]] = kind

    def field(name: str, node: Any) -> pa.Field:
        if isinstance(node, dict):
            return pa.field(name, pa.struct([field(k, v) for k, v in node.items()]))
        return pa.field(name, node)

    return pa.schema([field(name, node) for name, node in tree.items()])


def _leaf(table: pa.Table, path: tuple[str, ...]) -> pa.Array:
    column: pa.Array = table.column(path[0]).combine_chunks()
    for step in path[1:]:
        column = pc.struct_field(column, step)
    return column


def _maybe_other_number(leaf: pa.Array, kind: pa.DataType) -> np.ndarray:
    """Rows whose number may read otherwise in Python: an integral DOUBLE (the record may hold
    an integer there), a BIGINT beyond 2**53 (converted to a number input)."""
    if kind == pa.float64():
        suspect = pc.equal(pc.floor(leaf), leaf)
    else:
        suspect = pc.greater(pc.abs(leaf), 2**53)
    return np.asarray(pc.fill_null(suspect, False))


def _part(leaf: pa.Array, kind: pa.DataType, part: str, type_: pa.DataType) -> pa.Array:
    """One part (`RawRead.parts`) of a path read from its Arrow leaf of type `kind`."""
    if part == "m":
        return pc.is_null(leaf)
    same = {"b": pa.bool_(), "i": pa.int64(), "d": pa.float64(), "s": pa.string()}
    if part in same:
        return leaf if kind == same[part] else pa.nulls(len(leaf), type_)
    if part == "c" and kind in (pa.string(), pa.int64()):
        return pc.cast(leaf, pa.string())
    if part == "n" and kind in (pa.float64(), pa.int64()):
        return pc.cast(leaf, pa.float64(), safe=False)
    return pa.nulls(len(leaf), type_)


def _zone_offsets(instants: pa.Array, zone: str) -> pa.Array:
    """A zone's offsets at each instant (BIGINT epoch ms; any other kind reads as none)."""
    if instants.type != pa.int64():
        return pa.nulls(len(instants), pa.int64())
    return pa.array([zone_offset_ms(ms, zone) for ms in instants.to_pylist()], pa.int64())
