"""`lambdactl tables load`: a lookup table's versions from a CSV or JSON Lines file (rule 11 in
docs/semantics.md), checked before anything is sent.

A JSON Lines file holds one JSON object per line, sent as it is. A CSV file's first row names
the fields; an empty cell is an absent field, an integer written without leading zeros
(`-12`, `7`) is a JSON integer and every other cell is text, so `valid_from` may be epoch
milliseconds or RFC 3339. Every row must be a valid table record (its key, its time: the rules
of `shared.tables.parse_table_record`); a file with an invalid row is refused whole, naming
its lines, so a table is never half loaded. Records are keyed by the table key, so a key's
versions share a partition and keep their order.
"""

from __future__ import annotations

import csv
import io
import re
import time
from collections.abc import Iterator
from pathlib import Path

import orjson

from lambdactl.generator import SampleRecord, produce
from shared.config import Settings, TableConfig
from shared.errors import LambdaError
from shared.events import Malformed
from shared.tables import parse_table_record

_INTEGER = re.compile(r"-?(0|[1-9][0-9]{0,18})")
_SHOWN = 10


class TableFileError(LambdaError):
    """A table file that cannot be loaded; the message names the lines and what to fix."""


def _csv_rows(text: str) -> Iterator[tuple[int, bytes]]:
    reader = csv.DictReader(io.StringIO(text))
    for row in reader:
        fields: dict[str, object] = {}
        for name, cell in row.items():
            if name is None or cell is None or cell == "":
                continue
            fields[name] = int(cell) if _INTEGER.fullmatch(cell) else cell
        yield reader.line_num, orjson.dumps(fields)


def _jsonl_rows(text: str) -> Iterator[tuple[int, bytes]]:
    for number, line in enumerate(text.splitlines(), start=1):
        if line.strip():
            yield number, line.encode()


def table_records(table: TableConfig, path: Path, now_ms: int) -> list[SampleRecord]:
    """The file's rows as records of `table`'s topic, keyed by the table key; raises
    TableFileError naming the invalid rows."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise TableFileError(f"cannot read {path}: {exc}") from exc
    suffix = path.suffix.lower()
    if suffix == ".csv":
        rows = _csv_rows(text)
    elif suffix in (".jsonl", ".ndjson", ".json"):
        rows = _jsonl_rows(text)
    else:
        raise TableFileError(f"{path}: name a .csv or .jsonl file (JSON Lines: one object a line)")
    records, problems = [], []
    for line, value in rows:
        parsed = parse_table_record(None, value, now_ms, table)
        if isinstance(parsed, Malformed):
            problems.append(f"line {line}: {parsed.reason} ({parsed.detail})")
            continue
        records.append(SampleRecord(parsed.key.encode(), value))
    if problems:
        shown = "; ".join(problems[:_SHOWN])
        more = f" and {len(problems) - _SHOWN} more" if len(problems) > _SHOWN else ""
        raise TableFileError(
            f"{path}: {len(problems)} rows are not valid records of table {table.name!r} "
            f"(key field {table.key_field!r}, time field {table.time_field!r}): {shown}{more}; "
            "nothing was sent"
        )
    return records


def load_table(settings: Settings, name: str, path: Path) -> int:
    """Send the versions in `path` to table `name`'s topic; how many were sent."""
    tables = {t.name: t for t in settings.tables}
    if name not in tables:
        raise TableFileError(
            f"table {name!r} is not configured; configured tables: {sorted(tables) or 'none'}"
        )
    table = tables[name]
    records = table_records(table, path, int(time.time() * 1000))
    return produce(settings.kafka, table.topic, iter(records))
