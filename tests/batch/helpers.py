"""Helpers for the batch layer's tests: produce sample and edge-case events, read the served
view the way a reader does (one REPEATABLE READ snapshot), compare with the oracle."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any

import orjson
import psycopg
from confluent_kafka import Producer

from lambdactl.generator import GeneratorSpec, SampleRecord, generate, produce
from shared.aggregations import DEFAULT_RENDER
from shared.config import Settings
from shared.db.cells import CELL_COLUMNS, BatchCell
from shared.db.connect import connect
from shared.db.runs import RunRecord, RunRequest, get_run, queue_run
from shared.db.served import ServedView, read_served
from shared.kafka import create_topics
from tests import oracle
from tests.conftest import Platform, reconfigured

MINUTE = 60_000
HOUR = 60 * MINUTE
DAY = 24 * HOUR


def produce_spec(settings: Settings, spec: GeneratorSpec) -> list[SampleRecord]:
    records = list(generate(spec))
    produce(settings.kafka.bootstrap_servers, settings.sources[0].topic, iter(records))
    return records


def produce_raw(settings: Settings, records: Iterable[tuple[bytes, bytes]]) -> None:
    """Records as given (key, value): edge cases the generator does not make."""
    producer = Producer({"bootstrap.servers": settings.kafka.bootstrap_servers})
    for key, value in records:
        producer.produce(settings.sources[0].topic, key=key, value=value)
    assert producer.flush(30) == 0


def edge_cases(ts: int) -> list[tuple[bytes, bytes]]:
    """Ids as int and text (one id), RFC 3339 times, skips: each with a stable key."""

    def ev(key: str, **fields: Any) -> tuple[bytes, bytes]:
        return key.encode(), orjson.dumps(fields)

    return [
        ev("7", ts=ts, event_id=7, page="/edge", user_id=7, latency_ms=1.5),
        ev("7", ts=ts + 1, event_id="7", page="/edge", user_id="7", latency_ms=99.0),
        ev("r1", ts="2026-01-01T00:00:00Z", event_id="r1", page="/edge", user_id="a", latency_ms=2),
        ev(
            "r2",
            ts="2026-01-01T01:30:00.123456+01:00",
            event_id="r2",
            page=5,
            user_id="b",
            latency_ms=3,
        ),
        ev("s1", ts=ts, event_id="s1", page="/edge", user_id="c", latency_ms=True),
        ev("s2", ts=ts, event_id="s2", user_id="d", latency_ms=4),
        ev("m1", ts=ts, event_id=1.5, page="/edge"),
        (b"m2", b'{"ts": 1e3, "event_id": "m2"}'),
    ]


def queue(settings: Settings, request: RunRequest) -> int:
    with connect(settings.postgres.url, autocommit=True) as conn:
        return queue_run(conn, request)[0]


def run_record(settings: Settings, run_id: int) -> RunRecord:
    with connect(settings.postgres.url, autocommit=True) as conn:
        record = get_run(conn, run_id)
    assert record is not None
    return record


def full_run_of(
    platform: Platform,
    spark: Any,
    metrics: list[dict[str, Any]],
    extra: Callable[[int], list[tuple[bytes, bytes]]],
    seed: int,
) -> tuple[Platform, RunRecord, int]:
    """A world of `metrics` holding the sample history (3,000 events from 3 h to 1 h ago) and
    the records `extra` gives for the current minute, fully run: (world, its run's record,
    that minute in epoch ms)."""
    from batch_layer import run_full

    world = reconfigured(platform, metrics=metrics)
    settings = world.settings
    create_topics(settings)
    now = int(time.time() * 1000) // MINUTE * MINUTE
    produce_spec(settings, GeneratorSpec(now - 3 * HOUR, now - HOUR, 3000, seed=seed))
    produce_raw(settings, extra(now))
    run_id = queue(settings, RunRequest("full"))
    run_full(settings, spark, run_id)
    record = run_record(settings, run_id)
    assert record.status == "succeeded", record
    return world, record, now


def read_view(
    conn: psycopg.Connection[Any],
) -> tuple[ServedView | None, dict[oracle.Cell, BatchCell]]:
    """The served row and its generation's cells, in one REPEATABLE READ snapshot."""
    conn.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
    try:
        served = read_served(conn)
        if served is None:
            return None, {}
        rows = conn.execute(
            f"SELECT {', '.join(CELL_COLUMNS)} FROM batch_cells WHERE generation = %s",
            [served.generation],
        ).fetchall()
    finally:
        conn.execute("COMMIT")
    cells = [BatchCell(*row) for row in rows]
    return served, {(c.metric, c.window_ms, c.start_ms, tuple(c.key)): c for c in cells}


def served_view(settings: Settings) -> tuple[ServedView | None, dict[oracle.Cell, BatchCell]]:
    with connect(settings.postgres.url, autocommit=True) as conn:
        return read_view(conn)


def as_points(settings: Settings, cells: dict[oracle.Cell, BatchCell]) -> dict[oracle.Cell, Any]:
    """Raw cells as the API's point fields (what the oracle computes)."""
    out = {}
    for name, cell in cells.items():
        metric = settings.plan(name[0])
        assert metric is not None
        out[name] = metric.aggregations.render(cell.state(), DEFAULT_RENDER)
    return out


def oracle_mismatches(settings: Settings, config: dict[str, Any]) -> list[str]:
    """The served cells against a brute force over every record of the source's topic and of
    the tables' topics up to the served snapshot, less what retention removed (rule 14)."""
    served, cells = served_view(settings)
    assert served is not None
    upto = snapshot_records(settings, served)
    expected = oracle.retained(config, oracle.compute_cells(config, upto), served.watermarks)
    return oracle.compare(expected, as_points(settings, cells))


def snapshot_records(settings: Settings, served: ServedView) -> list[oracle.Record]:
    """Every record of the source's topic and of the tables' topics up to the served
    snapshot."""
    upto = []
    for topic in [settings.sources[0].topic, *(t.topic for t in settings.tables)]:
        snapshot = {int(p): o for p, o in served.snapshot[topic].items()}
        records = oracle.read_topic(settings.kafka.bootstrap_servers, topic)
        upto += [r for r in records if r.offset < snapshot.get(r.partition, 0)]
    return upto


def same_cells(a: dict[oracle.Cell, BatchCell], b: dict[oracle.Cell, BatchCell]) -> list[str]:
    """Cell-for-cell equality: counts, min, max exact; sums to 1e-9; sketch summaries (HLL
    estimates) within 1%."""
    import math

    problems = [f"only in first: {c}" for c in sorted(a.keys() - b.keys())]
    problems += [f"only in second: {c}" for c in sorted(b.keys() - a.keys())]
    for cell in sorted(a.keys() & b.keys()):
        one, two = a[cell], b[cell]
        ok = (
            one.count == two.count
            and one.min == two.min
            and one.max == two.max
            and math.isclose(one.sum, two.sum, rel_tol=1e-9, abs_tol=1e-9)
            and all(
                x == y
                or (x is not None and y is not None and math.isclose(x, y, rel_tol=0.01, abs_tol=1))
                for x, y in zip(one.sketch_summaries, two.sketch_summaries, strict=True)
            )
        )
        if not ok:
            problems.append(f"{cell}: {a[cell]} != {b[cell]}")
    return problems


LOOKUP_METRICS: list[dict[str, Any]] = [
    {
        "name": "views_by_section",
        "source": "pageviews",
        "lookups": [{"table": "pages", "on": "page", "as": "p"}],
        "fields": {"section": "COALESCE(p.section, 'none')"},
        "key": ["section"],
        "value": "latency_ms",
        "aggregations": ["count", "sum", "max", "distinct(user_id)"],
        "windows": ["1m", "1h"],
        "grace": "2m",
    },
    {
        "name": "views_by_owner",
        "source": "pageviews",
        "lookups": [{"table": "pages", "on": "lower(CAST(page AS STRING))", "as": "pg"}],
        "where": "pg.section <> 'gone'",
        "key": ["pg.meta.owner"],
        "aggregations": ["count"],
        "windows": ["1h"],
        "grace": "2m",
    },
]


def pages_table(tag: str) -> dict[str, Any]:
    return {"name": "pages", "topic": f"pages-{tag}", "key_field": "page", "time_field": "from"}


def produce_table(
    settings: Settings, records: list[tuple[bytes | None, dict[str, Any] | bytes | None]]
) -> None:
    """Table records (key, value): a dict is sent as JSON, bytes as they are, None as a
    tombstone."""
    producer = Producer({"bootstrap.servers": settings.kafka.bootstrap_servers})
    for key, value in records:
        encoded = orjson.dumps(value) if isinstance(value, dict) else value
        producer.produce(settings.tables[0].topic, key=key, value=encoded)
    assert producer.flush(30) == 0


def table_version(page: str | int, start: int, **fields: Any) -> tuple[bytes, dict[str, Any]]:
    return str(page).encode(), {"page": page, "from": start, **fields}


def table_history(start: int, mid: int, end: int) -> list[tuple[bytes | None, Any]]:
    """The `pages` table of the lookup tests (rule 11), events spanning [start, end): a key
    changed at `mid`, one deleted there, one tombstoned after every event, two versions valid
    from the same time, one valid after every event, an integer key, three invalid records."""
    owner = {"meta": {"owner": "ops"}}
    return [
        table_version("/page/1", start - HOUR, section="news", **owner),
        table_version("/page/2", start - HOUR, section="sport", meta={"owner": 7}),
        table_version("/page/1", mid, section="world", **owner),
        table_version("/page/2", mid, deleted=True),
        table_version("/page/3", start - HOUR, section="gone"),
        table_version("/page/4", start, section="first"),
        table_version("/page/4", start, section="second"),
        table_version("/page/5", end + HOUR, section="later"),
        table_version(7, start, section="seven", **owner),
        (b"/page/6", {"from": start, "section": "no key"}),
        (b"/page/6", {"page": "/page/6", "from": "yesterday"}),
        (b"/page/6", b"not json"),
        (b"/page/3", None),
    ]


def back_dated(start: int, mid: int) -> list[tuple[bytes | None, Any]]:
    """Versions of `/page/1` replacing both of `table_history`'s (same valid-from times, later
    offsets), as a correction arriving after the events they apply to."""
    owner = {"meta": {"owner": "ops"}}
    return [
        table_version("/page/1", start - HOUR, section="renamed", **owner),
        table_version("/page/1", mid, section="renamed", **owner),
    ]


def integer_pages(ts: int) -> list[tuple[bytes, bytes]]:
    """Events whose page is the integer 7, the double 7.0, the text "7" and null."""
    base = {"user_id": "u", "latency_ms": 1.5}
    pages: list[tuple[str, Any]] = [("i7", 7), ("f7", 7.0), ("s7", "7"), ("n", None)]
    return [
        (k.encode(), orjson.dumps({**base, "ts": ts + i, "event_id": k, "page": page}))
        for i, (k, page) in enumerate(pages)
    ]


@contextmanager
def spark_conf(spark: Any, values: Mapping[str, str]) -> Iterator[None]:
    """The session's settings changed for the block (the session is shared)."""
    before = {key: spark.conf.get(key, None) for key in values}
    for key, value in values.items():
        spark.conf.set(key, value)
    try:
        yield
    finally:
        for key, old in before.items():
            if old is None:
                spark.conf.unset(key)
            else:
                spark.conf.set(key, old)
