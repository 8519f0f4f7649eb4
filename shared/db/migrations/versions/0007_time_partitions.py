"""Time partitions: each generation's table of the batch view is partitioned by (window_ms,
start_ms) into time ranges ("Time partitions" in docs/architecture.md), so retention drops
whole tables. The served generation is copied into a new generation of that layout, which then
becomes the served one; readers go on reading the old one meanwhile (nothing they read is
locked against them), and a run that publishes meanwhile waits for the migration and then fails
with "queue the run again". The old generation is dropped by the next full run, as any
generation past the last two. Downgrading copies the served generation back into one table.

Revision ID: 0007
Revises: 0006
"""

from typing import Any

import psycopg
from alembic import op
from psycopg import sql

from shared.db.cell_tables import (
    add_time_ranges,
    create_generation,
    generation_table,
    index_generation,
)
from shared.db.cells import CELL_COLUMNS

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    _copy_served_generation(time_partitioned=True)


def downgrade() -> None:
    _copy_served_generation(time_partitioned=False)


def _copy_served_generation(*, time_partitioned: bool) -> None:
    conn: psycopg.Connection[Any] = op.get_bind().connection.dbapi_connection  # type: ignore[assignment]
    row = conn.execute("SELECT generation FROM served_view WHERE id = 1 FOR UPDATE").fetchone()
    if row is None:
        return
    served = row[0]
    old = sql.Identifier(generation_table(served))
    generation = conn.execute("SELECT nextval('batch_generation_seq')").fetchone()[0]  # type: ignore[index]
    if time_partitioned:
        table = create_generation(conn, generation)
        starts: dict[tuple[str, int], list[int]] = {}
        for metric, window_ms, start_ms in conn.execute(
            sql.SQL("SELECT DISTINCT metric, window_ms, start_ms FROM {}").format(old)
        ):
            starts.setdefault((metric, window_ms), []).append(start_ms)
        add_time_ranges(conn, generation, starts)
    else:
        table = sql.Identifier(generation_table(generation))
        conn.execute(sql.SQL("CREATE TABLE {} (LIKE batch_cells)").format(table))
    columns = sql.SQL(", ").join(map(sql.Identifier, CELL_COLUMNS))
    conn.execute(
        sql.SQL("INSERT INTO {} (generation, {}) SELECT {}, {} FROM {}").format(
            table, columns, sql.Literal(generation), columns, old
        )
    )
    index_generation(conn, generation)
    conn.execute(
        sql.SQL("ALTER TABLE batch_cells ATTACH PARTITION {} FOR VALUES IN ({})").format(
            table, sql.Literal(generation)
        )
    )
    conn.execute("UPDATE served_view SET generation = %s WHERE id = 1", [generation])
