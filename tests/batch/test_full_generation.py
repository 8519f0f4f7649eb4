"""A full run's publication (`FullGeneration`) against the real PostgreSQL: it replaces only
its own sources' ids, leaves every other source's alone, and changes nothing when the run
fails or never publishes — whichever point the id load had reached."""

from __future__ import annotations

from typing import Any

import psycopg
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
