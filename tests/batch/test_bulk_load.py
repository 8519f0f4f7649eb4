"""The bulk paths of a full run load exactly what the row-by-row paths load: cells written as
Arrow CSV with PostgreSQL array literals (text with quotes, backslashes, braces and line
breaks; empty arrays; binary sketches; nulls; extreme doubles), and equal slices."""

from __future__ import annotations

import pyarrow as pa
import pytest
from psycopg import sql

from batch_layer.kafka_source import plan_slices
from batch_layer.publish import _load_cells
from batch_layer.run_plan import CELL_SCHEMA
from shared.db.cells import BatchCell
from shared.db.connect import connect
from tests.conftest import Platform

ROWS: list[BatchCell] = [
    BatchCell(
        "m1",
        "v1",
        60_000,
        120_000,
        ["a", 'q"uo\\te', "{x,y}", "", "NULL", "é ü", "new\nline", "tab\tcomma,"],
        5,
        1.2345678901234567e300,
        -0.0,
        None,
        [b"\x00\x01\xff", b"", b"\\x41"],
        [1.5, 12.000000000000002],
    ),
    BatchCell("m2", "v2", 3_600_000, -3_600_000, [], 0, 0.0, None, 3.0, [], []),
    BatchCell("m,3", 'v"', 1, 2, ["7"], 9, 5e-324, 2.5, 7.0, [b"abc", b"kll"], [3.0, None]),
]


@pytest.mark.services
def test_arrow_cells_load_like_rows(platform: Platform) -> None:
    table = pa.Table.from_pylist(
        [dict(zip(CELL_SCHEMA.names, row.columns(), strict=True)) for row in ROWS], CELL_SCHEMA
    )
    with connect(platform.settings.postgres.url) as conn:
        loaded = {}
        for label, cells in (("rows", ROWS), ("arrow", table)):
            name = sql.Identifier(f"load_{label}")
            conn.execute(sql.SQL("CREATE TEMP TABLE {} (LIKE batch_cells)").format(name))
            assert _load_cells(conn, name, 7, cells) == len(ROWS)
            loaded[label] = conn.execute(
                sql.SQL("SELECT * FROM {} ORDER BY metric").format(name)
            ).fetchall()
        conn.rollback()
    assert loaded["arrow"] == loaded["rows"]
    assert [(*row[1:10], [bytes(b) for b in row[10]], row[11]) for row in loaded["rows"]] == sorted(
        cell.columns() for cell in ROWS
    )
    (kll,) = [row for row in loaded["arrow"] if row[1] == "m,3"]
    assert kll[-1] == [3.0, None], "a KLL slot's missing summary loads as NULL"


def test_slices_are_equal_parts_of_each_partition() -> None:
    assert plan_slices({}, {0: 252_533, 1: 10, 2: 0}, 250_000) == [
        [0, 0, 126_266],
        [0, 126_266, 252_533],
        [1, 0, 10],
    ]
    assert plan_slices({0: 5}, {0: 12}, 3) == [[0, 5, 7], [0, 7, 9], [0, 9, 12]]
    assert plan_slices({0: 12}, {0: 12}, 3) == []
