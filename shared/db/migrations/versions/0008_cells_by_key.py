"""Each generation's index of one key's cells in time order (`by_key_index`): a one-key
series reads a window's consecutive cells as one range of it instead of one primary-key
descent per cell ("Time partitions" in docs/architecture.md). Built on every time-partitioned
generation already there; new ones get it from `index_generation`. `CREATE INDEX` takes a
SHARE lock: readers go on reading, a run publishing meanwhile waits for it.

Revision ID: 0008
Revises: 0007
"""

from typing import Any

import psycopg
from alembic import op
from psycopg import sql

from shared.db.cell_tables import by_key_index, by_key_name

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None


def upgrade() -> None:
    conn = _connection()
    for generation in _partitioned_generations(conn):
        conn.execute(by_key_index(generation))


def downgrade() -> None:
    conn = _connection()
    for generation in _partitioned_generations(conn):
        conn.execute(sql.SQL("DROP INDEX IF EXISTS {}").format(by_key_name(generation)))


def _connection() -> psycopg.Connection[Any]:
    return op.get_bind().connection.dbapi_connection  # type: ignore[return-value]


def _partitioned_generations(conn: psycopg.Connection[Any]) -> list[int]:
    rows = conn.execute(
        "SELECT substring(c.relname FROM '^batch_cells_g([0-9]+)$')::bigint FROM pg_inherits i "
        "JOIN pg_class c ON c.oid = i.inhrelid "
        "WHERE i.inhparent = 'batch_cells'::regclass AND c.relkind = 'p' ORDER BY 1"
    ).fetchall()
    return [generation for (generation,) in rows]
