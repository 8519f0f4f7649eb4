"""A full run's publication (`FullGeneration`) against the real PostgreSQL: it replaces only
its own sources' ids, leaves every other source's alone, and changes nothing when the run
fails or never publishes — whichever point the id load had reached."""

from __future__ import annotations

from typing import Any

import psycopg
import pyarrow as pa
import pytest

from batch_layer.publish import FullGeneration, Publication, _holds_other_sources
from shared.db.connect import connect
from shared.db.served import read_served
from tests.conftest import Platform

PUBLICATION = Publication(
    snapshot={"t": {"0": 3}}, watermarks={}, rebuild_from={"t": {"0": 3}}, versions={}
)
BEFORE = [("a", "x", 0, 1), ("b", "y", 0, 2), ("d", "z", 1, 7)]


def _ids(conn: psycopg.Connection[Any]) -> list[tuple[str, str, int, int]]:
    return conn.execute(
        'SELECT source, event_id, partition, "offset" FROM dedup_ids ORDER BY 1, 2'
    ).fetchall()


def _seed(conn: psycopg.Connection[Any]) -> None:
    with conn.cursor().copy(
        'COPY dedup_ids (source, event_id, partition, "offset") FROM STDIN'
    ) as copy:
        for row in BEFORE:
            copy.write_row(row)
    conn.commit()


pytestmark = pytest.mark.services


@pytest.mark.parametrize(
    ("sources", "others"),
    [
        (["a", "b", "d"], False),
        (["a", "d"], True),
        (["b"], True),
        (["a", "b", "d", "e"], False),
        ([], True),
    ],
)
def test_other_sources_are_found_by_key_probes(
    platform: Platform, sources: list[str], others: bool
) -> None:
    with connect(platform.settings.postgres.url) as conn:
        _seed(conn)
        assert _holds_other_sources(conn, sources) is others


def test_a_full_generation_replaces_only_its_sources_ids(platform: Platform) -> None:
    with connect(platform.settings.postgres.url) as conn:
        _seed(conn)
        with FullGeneration(conn, ["a", "c"]) as full:
            full.add_ids([("a", "x2", 2, 5)], last=False)
            full.add_ids([("c", "w", 3, 9)], last=True)
            generation, written = full.publish([], PUBLICATION)
        assert _ids(conn) == [
            ("a", "x2", 2, 5),
            ("b", "y", 0, 2),
            ("c", "w", 3, 9),
            ("d", "z", 1, 7),
        ]
        served = read_served(conn)
        assert served is not None and served.generation == generation and written == 0


def test_a_full_generation_of_every_source_rebuilds_the_key(platform: Platform) -> None:
    with connect(platform.settings.postgres.url) as conn:
        _seed(conn)
        with FullGeneration(conn, ["a", "b", "d"]) as full:
            full.add_ids([("b", "v", 0, 1), ("a", "x", 0, 1)], last=True)
            full.publish([], PUBLICATION)
        assert _ids(conn) == [("a", "x", 0, 1), ("b", "v", 0, 1)]
        key = conn.execute(
            "SELECT pg_get_constraintdef(oid) FROM pg_constraint WHERE conname = 'dedup_ids_pkey'"
        ).fetchone()
        assert key == ("PRIMARY KEY (source, event_id)",)
        with pytest.raises(psycopg.errors.UniqueViolation):
            conn.execute("INSERT INTO dedup_ids VALUES ('a', 'x', 5, 5)")


@pytest.mark.parametrize("sources", [["a", "b", "d"], ["a"]])
def test_a_failed_or_unpublished_full_generation_changes_nothing(
    platform: Platform, sources: list[str]
) -> None:
    with connect(platform.settings.postgres.url) as conn:
        _seed(conn)
        with (
            pytest.raises(RuntimeError, match="spark failed"),
            FullGeneration(conn, sources) as full,
        ):
            full.add_ids([("a", f"n{i}", 0, i) for i in range(50_000)], last=True)
            raise RuntimeError("spark failed")
        with FullGeneration(conn, sources) as full:
            full.add_ids([("a", "n", 0, 1)], last=True)
        assert _ids(conn) == BEFORE
        assert read_served(conn) is None
        assert conn.execute(
            "SELECT count(*) FROM pg_constraint WHERE conname = 'dedup_ids_pkey'"
        ).fetchone() == (1,)


DAY = 86_400_000


def _horizon_rows(*rows: tuple[str, int, str, int, int]) -> pa.Table:
    """(source, partition, event_id, offset, time_ms) rows."""
    names = ["source", "partition", "event_id", "offset", "time_ms"]
    kinds = [pa.string(), pa.int32(), pa.string(), pa.int64(), pa.int64()]
    return pa.table(
        {
            n: pa.array([r[i] for r in rows], k)
            for i, (n, k) in enumerate(zip(names, kinds, strict=True))
        }
    )


def _horizon_state(conn: psycopg.Connection[Any]) -> tuple[list[tuple[Any, ...]], list[str]]:
    rows = conn.execute(
        'SELECT source, partition, event_id, "offset", time_ms FROM horizon_ids ORDER BY 1, 2, 3'
    ).fetchall()
    tables = conn.execute(
        "SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid "
        "WHERE i.inhparent = 'horizon_ids'::regclass ORDER BY 1"
    ).fetchall()
    return rows, [t for (t,) in tables]


def test_horizon_ids_are_replaced_per_source_and_days_past_every_horizon_dropped(
    platform: Platform,
) -> None:
    """Ids of sources with a de-dup horizon (rule 4): a failed full generation leaves them and
    their day tables as they were; a published one replaces its sources' ids and drops the
    day tables no partition reaching them needs (day 0 at last: every partition reaching it
    has passed its end by its horizon), keeping the other sources' ids."""
    with connect(platform.settings.postgres.url) as conn:
        with FullGeneration(conn, ["a", "b"]) as full:
            full.add_horizon_ids(_horizon_rows(("a", 0, "x", 1, 5), ("b", 1, "y", 2, DAY + 5)))
            full.publish([], PUBLICATION, {("a", 0): (DAY + 10, DAY), ("b", 1): (DAY + 10, DAY)})
        before = _horizon_state(conn)
        assert before == (
            [("a", 0, "x", 1, 5), ("b", 1, "y", 2, DAY + 5)],
            ["horizon_ids_d0", "horizon_ids_d1"],
        )
        with pytest.raises(RuntimeError, match="spark failed"), FullGeneration(conn, ["a"]) as full:
            full.add_horizon_ids(_horizon_rows(("a", 0, "z", 9, 3 * DAY)))
            raise RuntimeError("spark failed")
        assert _horizon_state(conn) == before
        with FullGeneration(conn, ["a"]) as full:
            full.add_horizon_ids(_horizon_rows(("a", 0, "z", 9, 2 * DAY + 5)))
            reach = {("a", 0): (2 * DAY + 10, 3_600_000), ("b", 1): (DAY + 10, 5)}
            full.publish([], PUBLICATION, reach)
        assert _horizon_state(conn) == (
            [("a", 0, "z", 9, 2 * DAY + 5), ("b", 1, "y", 2, DAY + 5)],
            ["horizon_ids_d1", "horizon_ids_d2"],
        )
