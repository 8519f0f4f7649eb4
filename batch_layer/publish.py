"""Atomic publication (rule 6) of a full run: a new generation is loaded into its own table,
indexed and attached as a partition of `batch_cells`, the id table is replaced and the served
row flipped, all in one transaction. A failed run rolls back and changes nothing served."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg import sql

from shared.db.served import read_served
from shared.faults import fault_point

_CELL_COLUMNS = (
    "generation, metric, version, window_ms, start_ms, key, count, sum, min, max, sketches, "
    "distinct_estimates"
)
GENERATIONS_KEPT = 2


@dataclass(frozen=True)
class Publication:
    snapshot: Mapping[str, Mapping[str, int]]
    watermarks: Mapping[str, int | None]
    rebuild_from: Mapping[str, Mapping[str, int]]
    versions: Mapping[str, str]


def publish_full_generation(
    conn: psycopg.Connection[Any],
    cells: Iterable[tuple[Any, ...]],
    ids: Iterable[tuple[str, str, int, int]],
    sources: Iterable[str],
    publication: Publication,
) -> tuple[int, int]:
    """Load, index, attach and flip in one transaction; returns (generation, cells written).

    `cells` are rows of (metric, version, window_ms, start_ms, key, count, sum, min, max,
    sketches, distinct_estimates); `ids` rows of (source, event_id, partition, offset)."""
    with conn.transaction():
        generation = conn.execute("SELECT nextval('batch_generation_seq')").fetchone()[0]  # type: ignore[index]
        table = sql.Identifier(f"batch_cells_g{generation}")
        conn.execute(sql.SQL("CREATE TABLE {} (LIKE batch_cells)").format(table))
        written = 0
        with conn.cursor().copy(
            sql.SQL("COPY {} ({}) FROM STDIN").format(table, sql.SQL(_CELL_COLUMNS))
        ) as copy:
            for row in cells:
                copy.write_row((generation, *row))
                written += 1
        fault_point("mid_load")
        conn.execute(
            sql.SQL(
                "ALTER TABLE {} ADD PRIMARY KEY (generation, metric, version, window_ms, "
                "start_ms, key)"
            ).format(table)
        )
        conn.execute(
            sql.SQL("ALTER TABLE batch_cells ATTACH PARTITION {} FOR VALUES IN ({})").format(
                table, sql.Literal(generation)
            )
        )
        conn.execute("DELETE FROM dedup_ids WHERE source = ANY(%s)", [list(sources)])
        with conn.cursor().copy(
            'COPY dedup_ids (source, event_id, partition, "offset") FROM STDIN'
        ) as copy:
            for id_row in ids:
                copy.write_row(id_row)
        fault_point("before_generation_flip")
        _flip(conn, generation, publication)
    drop_old_generations(conn)
    return generation, written


def _flip(conn: psycopg.Connection[Any], generation: int, publication: Publication) -> None:
    from psycopg.types.json import Jsonb

    conn.execute(
        """
        INSERT INTO served_view (id, generation, snapshot, watermarks, rebuild_from, versions,
                                 published_at)
        VALUES (1, %s, %s, %s, %s, %s, now())
        ON CONFLICT (id) DO UPDATE SET generation = excluded.generation,
            snapshot = excluded.snapshot, watermarks = excluded.watermarks,
            rebuild_from = excluded.rebuild_from, versions = excluded.versions,
            published_at = excluded.published_at
        """,
        [
            generation,
            Jsonb(publication.snapshot),
            Jsonb({m: w for m, w in publication.watermarks.items() if w is not None}),
            Jsonb(publication.rebuild_from),
            Jsonb(publication.versions),
        ],
    )


def drop_old_generations(conn: psycopg.Connection[Any]) -> None:
    """Keep the served generation and the one before it; readers of older ones are done."""
    served = read_served(conn)
    if served is None:
        return
    rows = conn.execute(
        """
        SELECT c.relname, substring(c.relname from 'batch_cells_g([0-9]+)')::bigint
        FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
        WHERE i.inhparent = 'batch_cells'::regclass
        """
    ).fetchall()
    keep = sorted((g for _, g in rows if g <= served.generation), reverse=True)[:GENERATIONS_KEPT]
    for name, generation in rows:
        if generation not in keep:
            with conn.transaction():
                conn.execute(sql.SQL("DROP TABLE {}").format(sql.Identifier(name)))
