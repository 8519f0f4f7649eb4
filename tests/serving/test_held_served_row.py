"""The served row held by each API process (issue #50) against the real PostgreSQL and Redis:
requests plan against it without reading it; a publication reaches a running process through
`LISTEN lp_served` without any request; a LISTEN connection killed from another connection
(`pg_terminate_backend`) is made again and the row re-read, so answers follow a publication
committed while no one listened; and a publication landing in the middle of a request — its
cell read held behind the publishing transaction's lock, or the publisher killed by a fault
point (`LAMBDA_FAULT=before_generation_flip`) with the request waiting — never gives an
answer mixing two generations."""

from __future__ import annotations

import random
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from functools import partial
from pathlib import Path
from typing import Any

import psycopg
import pytest
from fastapi.testclient import TestClient

from batch_layer.publish import Publication, publish_full_generation
from serving_layer import create_app
from serving_layer.served_row import LISTEN_APPLICATION, HeldServedRow
from serving_layer.timefmt import format_time, parse_time
from shared.config import Settings
from shared.db.connect import connect
from shared.metric_plan import versions_of
from tests.conftest import Platform, reconfigured
from tests.serving.views import Event, batch_rows, load_views, random_events

pytestmark = [pytest.mark.services, pytest.mark.timeout(300)]

MINUTE, HOUR = 60_000, 3_600_000
T0 = 1_767_225_600_000  # 2026-01-01T00:00:00Z
W1, W2, W3 = T0 - 10 * MINUTE, T0 + 10 * MINUTE, T0 + 20 * MINUTE
PAGES = ["/", "/a", "/b"]
EVENTS = random_events(random.Random(21), T0 - HOUR, T0 + HOUR, 1500, PAGES)
LATE = random_events(random.Random(22), T0 - HOUR, W1 - 5 * MINUTE, 300, ["/b", "/a"])
"""Events the later generations hold before W1 and the first one does not (a run read them
late): a plan of W1 with their cells, or the reverse, shows in the counts."""
HEARD_WITHIN_S = 1.0
"""The bound within which a running process holds a committed publication, unasked."""


def _world(platform: Platform, **serving: Any) -> Settings:
    """The platform with a refresh period long enough that only an announcement (or a
    reconnection) explains a row re-read within a test."""
    return reconfigured(platform, serving={"served_refresh_s": 60.0, **serving}).settings


def _held(client: TestClient) -> HeldServedRow:
    held = client.app.state.async_db.served  # type: ignore[attr-defined]
    assert isinstance(held, HeldServedRow)
    return held


def _until(what: str, check: Callable[[], Any], limit_s: float) -> float:
    """Seconds until `check()` is true (polled every millisecond); fails after `limit_s`."""
    started = time.monotonic()
    while not check():
        assert time.monotonic() - started < limit_s, f"{what}: not within {limit_s} s"
        time.sleep(0.001)
    return time.monotonic() - started


def _holds(held: HeldServedRow, stamp: str | None) -> bool:
    return held.stamp == stamp


def _stamp(settings: Settings) -> str | None:
    with connect(settings.postgres.url, autocommit=True) as conn:
        row = conn.execute("SELECT xmin::text FROM served_view WHERE id = 1").fetchone()
    return None if row is None else str(row[0])


def _holding(client: TestClient, settings: Settings) -> str:
    """Waits until the process holds the committed row; its stamp."""
    stamp = _stamp(settings)
    assert stamp is not None
    _until("the process holds the served row", lambda: _held(client).stamp == stamp, 10)
    return stamp


def _rows_and_ws(
    settings: Settings, events: list[Event], w: int
) -> tuple[list[Any], dict[str, int]]:
    rows = [r for m in settings.plans.values() for r in batch_rows(settings, m, events, w)]
    return rows, dict.fromkeys(settings.plans, w)


def _publish_on(
    conn: psycopg.Connection[Any], settings: Settings, events: list[Event], w: int
) -> None:
    """A full generation of `events` with W = `w` flipped in `conn`'s open transaction (not
    committed)."""
    rows, ws = _rows_and_ws(settings, events, w)
    versions = versions_of(settings.plans.values())
    publication = Publication(
        snapshot={s.topic: {} for s in settings.sources},
        watermarks=ws,
        rebuild_from={s.topic: {} for s in settings.sources},
        versions={m: versions[m] for m in ws},
    )
    publish_full_generation(conn, rows, [], [], publication)


def _series(client: TestClient, page: str) -> dict[str, Any]:
    response = client.get(
        "/v1/metrics/views_by_page/series",
        params={
            "window": "1m",
            "page": page,
            "start": format_time(T0 - HOUR),
            "end": format_time(T0 + HOUR),
        },
    )
    assert response.status_code == 200, response.text
    body: dict[str, Any] = response.json()
    return body


def _wrong_points(body: dict[str, Any], page: str) -> list[str]:
    """The points whose count differs from the events of the generation the answer's W names
    (W1: the first; W2, W3: the later ones, with `LATE`) before W and of the speed view after
    it, or whose `source` does not follow from that W."""
    w = parse_time(body["batch_watermark"])
    assert w in (W1, W2, W3), body["batch_watermark"]
    batch = EVENTS if w == W1 else EVENTS + LATE

    def minutes(events: list[Event]) -> Counter[int]:
        return Counter(e.time_ms - e.time_ms % MINUTE for e in events if e.key == (page,))

    before, after = minutes(batch), minutes(EVENTS)
    wrong = []
    for point in body["points"]:
        start = parse_time(point["start"])
        in_batch = start + MINUTE <= w
        want = (before if in_batch else after).get(start, 0)
        if point["count"] != want or point["source"] != ("batch" if in_batch else "speed"):
            wrong.append(f"{point['start']}: {point['count']} {point['source']}, want {want}")
    return wrong


def _statements_since(settings: Settings, since: Any) -> list[str]:
    """The statements other sessions of the database started after `since` (the server's
    clock), the LISTEN connection's aside."""
    with connect(settings.postgres.url, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT query FROM pg_stat_activity WHERE datname = current_database() "
            "AND pid <> pg_backend_pid() AND application_name <> %s AND query_start > %s",
            [LISTEN_APPLICATION, since],
        ).fetchall()
    return [query for (query,) in rows]


def _now(settings: Settings) -> Any:
    with connect(settings.postgres.url, autocommit=True) as conn:
        return conn.execute("SELECT clock_timestamp()").fetchone()[0]  # type: ignore[index]


@pytest.mark.parametrize("confirm", [True, False], ids=["confirmed", "unconfirmed"])
def test_requests_plan_against_the_held_row_without_reading_it(
    platform: Platform, confirm: bool
) -> None:
    settings = _world(platform, served_row_confirm=confirm)
    load_views(settings, EVENTS, W1, seed=1)
    with TestClient(create_app(settings)) as client:
        stamp = _holding(client, settings)
        first = _series(client, "/a")  # reads and caches the batch-only points
        assert not _wrong_points(first, "/a") and first["batch_watermark"] == format_time(W1)
        held = _held(client)
        syncs, since = held.syncs, _now(settings)
        answers = [_series(client, "/a") for _ in range(20)]
        assert all(answer == first for answer in answers)
        assert _statements_since(settings, since) == [], "a cached answer read no statement"
        assert held.stamp == stamp
        if confirm:  # one SELECT 1 on the LISTEN connection per request asked one at a time
            assert held.syncs - syncs >= 20
        else:
            assert held.syncs == syncs


def test_repeated_keys_read_nothing_and_a_publication_is_read_anew(platform: Platform) -> None:
    """`keys` reads its batch part with the served row in one statement; kept for that row's
    stamp, the same question asked again reads nothing of PostgreSQL (only Redis), and after a
    publication holding a key more, the new generation's keys are answered."""
    settings = _world(platform)
    load_views(settings, EVENTS, W1, seed=4)
    params = {"start": format_time(T0 - HOUR), "end": format_time(T0 + HOUR)}
    path = "/v1/metrics/views_by_page/keys"

    def pages() -> list[str]:
        response = client.get(path, params=params)
        assert response.status_code == 200, response.text
        return [key["page"] for key in response.json()["keys"]]

    with TestClient(create_app(settings)) as client:
        _holding(client, settings)
        first = pages()
        assert first == PAGES
        since = _now(settings)
        assert all(pages() == first for _ in range(10))
        assert _statements_since(settings, since) == [], "a kept batch part read no statement"
        extra = random_events(random.Random(23), T0 - HOUR, W2 - 5 * MINUTE, 20, ["/new"])
        with connect(settings.postgres.url) as conn:
            _publish_on(conn, settings, EVENTS + extra, W2)
            conn.commit()
        _holding(client, settings)
        assert pages() == [*PAGES, "/new"]


@pytest.mark.parametrize("confirm", [True, False], ids=["confirmed", "unconfirmed"])
def test_a_publication_reaches_a_running_process_without_any_request(
    platform: Platform, confirm: bool
) -> None:
    settings = _world(platform, served_row_confirm=confirm)
    load_views(settings, EVENTS, W1, seed=2)
    with TestClient(create_app(settings)) as client:
        old = _holding(client, settings)
        held = _held(client)
        assert _series(client, "/a")["batch_watermark"] == format_time(W1)
        reads = held.reads
        took = []
        for events, w in ((EVENTS + LATE, W2), (EVENTS + LATE, W3)):
            with connect(settings.postgres.url) as conn:
                _publish_on(conn, settings, events, w)
                (new,) = conn.execute("SELECT xmin::text FROM served_view").fetchone() or (None,)
                conn.commit()
                committed = time.monotonic()
            assert new != old
            _until("the publication held", partial(_holds, held, new), HEARD_WITHIN_S)
            took.append(time.monotonic() - committed)
            old = new
        print(f"\na publication held {[round(t * 1000, 1) for t in took]} ms after its commit")
        assert 2 <= held.reads - reads <= 4, "one read per announcement (a retry at most)"
        answer = _series(client, "/a")
        assert answer["batch_watermark"] == format_time(W3)
        assert not _wrong_points(answer, "/a")


def test_confirmed_answers_follow_every_publication_committed_before_them(
    platform: Platform,
) -> None:
    """Read after commit, as when every request read the row: an in-place publication
    committed, then at once the cached query asked again, 30 times over."""
    settings = _world(platform)
    load_views(settings, EVENTS, W1, seed=3)
    start = format_time(T0 - HOUR)
    params = {"window": "1m", "start": start, "end": format_time(W1)}
    with TestClient(create_app(settings)) as client:
        _holding(client, settings)
        before = client.get("/v1/metrics/views_total/series", params=params).json()["points"]
        for i in range(1, 31):
            with connect(settings.postgres.url) as conn:
                conn.execute(
                    "UPDATE batch_cells SET count = count + 1 WHERE metric = 'views_total' "
                    "AND window_ms = %s AND start_ms = %s",
                    [MINUTE, T0 - HOUR],
                )
                conn.execute("UPDATE served_view SET published_at = now()")
                conn.commit()
            after = client.get("/v1/metrics/views_total/series", params=params).json()["points"]
            assert after[0]["count"] == before[0]["count"] + i, f"publication {i} not followed"
            assert after[1:] == before[1:]


def _listener_pids(conn: psycopg.Connection[Any]) -> list[int]:
    rows = conn.execute(
        "SELECT pid FROM pg_stat_activity WHERE datname = current_database() "
        "AND application_name = %s",
        [LISTEN_APPLICATION],
    ).fetchall()
    return [pid for (pid,) in rows]


@pytest.mark.parametrize("confirm", [True, False], ids=["confirmed", "unconfirmed"])
def test_a_killed_listen_connection_is_made_again_and_the_row_read_again(
    platform: Platform, confirm: bool
) -> None:
    """The LISTEN connection terminated from another connection just before a publication
    commits: its announcement reaches no one, and the row re-read once LISTEN is in place
    again holds it (the refresh period, 60 s, explains nothing)."""
    settings = _world(platform, served_row_confirm=confirm)
    load_views(settings, EVENTS, W1, seed=4)
    with (
        TestClient(create_app(settings)) as client,
        connect(settings.postgres.url, autocommit=True) as admin,
    ):
        old = _holding(client, settings)
        held = _held(client)
        assert _series(client, "/a")["batch_watermark"] == format_time(W1)
        (listener,) = _listener_pids(admin)
        reads = held.reads
        with connect(settings.postgres.url) as conn:
            _publish_on(conn, settings, EVENTS + LATE, W2)
            assert admin.execute("SELECT pg_terminate_backend(%s, 5000)", [listener]).fetchone()
            assert _listener_pids(admin) == [], "no one listens when the publication commits"
            assert held.stamp is None, "a lost LISTEN connection is not trusted"
            conn.commit()
        new = _stamp(settings)
        assert new != old
        took = _until("the row read again after LISTEN", lambda: held.stamp == new, 10)
        print(f"\nthe row held again {took * 1000:.0f} ms after the publication")
        assert held.listening and held.reads > reads
        (again,) = _listener_pids(admin)
        assert again != listener
        answer = _series(client, "/a")
        assert answer["batch_watermark"] == format_time(W2) and not _wrong_points(answer, "/a")

        with connect(settings.postgres.url) as conn:  # and the new LISTEN hears the next one
            _publish_on(conn, settings, EVENTS + LATE, W3)
            conn.commit()
        newest = _stamp(settings)
        _until("the next publication held", lambda: held.stamp == newest, HEARD_WITHIN_S)
        assert _series(client, "/a")["batch_watermark"] == format_time(W3)


def _waiting_on_a_lock(admin: psycopg.Connection[Any]) -> bool:
    (count,) = admin.execute(
        "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
        "AND wait_event_type = 'Lock' AND query LIKE '%batch_cells%'"
    ).fetchone() or (0,)
    return bool(count)


@contextmanager
def _asking(client: TestClient, page: str) -> Iterator[Future[dict[str, Any]]]:
    with ThreadPoolExecutor(1) as pool:
        yield pool.submit(_series, client, page)


LOCKED = "LOCK TABLE served_view, batch_cells IN ACCESS EXCLUSIVE MODE"
"""What a publisher holds here from its first statement: a request's cell read waits for it
(and the lock order keeps the drop of old generations from a deadlock)."""


@pytest.mark.parametrize("confirm", [True, False], ids=["confirmed", "unconfirmed"])
def test_a_publication_landing_mid_request_gives_one_generation(
    platform: Platform, confirm: bool
) -> None:
    """The request plans against the held row (W1) and sends its cell read, which waits
    behind the publishing transaction's lock; the transaction flips twice (W2, then W3),
    dropping the generation the request planned with, and commits. The read then finds
    another row, joins no cell and the request is planned again: its answer is W3's whole,
    never W1's plan with later cells."""
    settings = _world(platform, served_row_confirm=confirm)
    load_views(settings, EVENTS, W1, seed=5)
    with (
        TestClient(create_app(settings)) as client,
        connect(settings.postgres.url, autocommit=True) as admin,
    ):
        stamp = _holding(client, settings)
        assert _series(client, "/a")["batch_watermark"] == format_time(W1)  # "/b" not cached
        with connect(settings.postgres.url) as publisher:
            publisher.execute(LOCKED)
            with _asking(client, "/b") as asked:
                _until(
                    "the cell read waits for the publisher", lambda: _waiting_on_a_lock(admin), 10
                )
                assert _held(client).stamp == stamp, "planned against the held row"
                _publish_on(publisher, settings, EVENTS + LATE, W2)
                _publish_on(publisher, settings, EVENTS + LATE, W3)
                generations = publisher.execute(
                    "SELECT count(*) FROM pg_inherits WHERE inhparent = 'batch_cells'::regclass"
                ).fetchone()
                assert generations == (2,), "the generation planned with is dropped"
                publisher.commit()
                answer = asked.result(60)
        assert answer["batch_watermark"] == format_time(W3), answer["batch_watermark"]
        assert not _wrong_points(answer, "/b")
        cached = _series(client, "/a")  # batch points cached under W1's stamp: not reused
        if confirm:
            assert cached["batch_watermark"] == format_time(W3)
        assert not _wrong_points(cached, "/a")


_DYING_PUBLISHER = """
import random, sys
from shared.config import load_settings
from shared.db.connect import connect
from tests.serving.test_held_served_row import EVENTS, LATE, LOCKED, W3, _publish_on
settings = load_settings()
with connect(settings.postgres.url) as conn:
    conn.execute(LOCKED)
    print("locked", flush=True)
    sys.stdin.readline()
    _publish_on(conn, settings, EVENTS + LATE, W3)  # LAMBDA_FAULT kills it before the flip
print("published", flush=True)
"""


def test_a_publisher_killed_mid_request_leaves_the_held_row_and_its_answer_whole(
    platform: Platform,
) -> None:
    """The same wait, but the publisher dies at `before_generation_flip`: its transaction
    rolls back, nothing is announced, the request reads its cells under the held row and
    answers W1's generation, and the process still holds that row."""
    world = reconfigured(platform, serving={"served_refresh_s": 60.0})
    settings = world.settings
    load_views(settings, EVENTS, W1, seed=6)
    env = {**world.env, "LAMBDA_FAULT": "before_generation_flip"}
    with (
        TestClient(create_app(settings)) as client,
        connect(settings.postgres.url, autocommit=True) as admin,
    ):
        stamp = _holding(client, settings)
        held = _held(client)
        assert _series(client, "/a")["batch_watermark"] == format_time(W1)
        publisher = subprocess.Popen(
            [sys.executable, "-c", _DYING_PUBLISHER],
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            cwd=Path(__file__).resolve().parents[2],
        )
        try:
            assert publisher.stdout is not None and publisher.stdin is not None
            assert publisher.stdout.readline().strip() == "locked"
            reads = held.reads
            with _asking(client, "/b") as asked:
                _until(
                    "the cell read waits for the publisher", lambda: _waiting_on_a_lock(admin), 10
                )
                publisher.stdin.write("go\n")
                publisher.stdin.flush()
                assert publisher.wait(60) == -9, "killed by the fault point"
                answer = asked.result(60)
        finally:
            if publisher.poll() is None:
                publisher.kill()
                publisher.wait()
        assert answer["batch_watermark"] == format_time(W1)
        assert not _wrong_points(answer, "/b")
        assert _stamp(settings) == stamp
        time.sleep(0.2)  # an announcement, had there been one, would have been read by now
        assert held.stamp == stamp and held.reads == reads, "nothing was announced"
        since = _now(settings)
        assert _series(client, "/a") == _series(client, "/a")
        assert _statements_since(settings, since) == []


def test_unconfirmed_answers_planned_against_a_replaced_row_are_whole(
    platform: Platform,
) -> None:
    """Without confirmation a cached query may still be answered from the row a publication
    has just replaced, until its announcement arrives: each answer, asked in a loop around
    the commit, is whole for the W it reports (the speed cells after W1 are still there)."""
    settings = _world(platform, served_row_confirm=False)
    load_views(settings, EVENTS, W1, seed=7)
    with TestClient(create_app(settings)) as client:
        _holding(client, settings)
        assert _series(client, "/a")["batch_watermark"] == format_time(W1)
        answers: list[dict[str, Any]] = []
        stop = threading.Event()

        def ask() -> None:
            while not stop.is_set():
                answers.append(_series(client, "/a"))

        asker = threading.Thread(target=ask)
        asker.start()
        try:
            time.sleep(0.1)
            with connect(settings.postgres.url) as conn:
                _publish_on(conn, settings, EVENTS + LATE, W3)
                conn.commit()
            new = _stamp(settings)
            _until("the publication held", lambda: _held(client).stamp == new, HEARD_WITHIN_S)
            time.sleep(0.1)
        finally:
            stop.set()
            asker.join(30)
        seen = Counter(answer["batch_watermark"] for answer in answers)
        assert set(seen) == {format_time(W1), format_time(W3)}, seen
        for answer in answers:
            assert not _wrong_points(answer, "/a"), answer["batch_watermark"]


def test_windows_straddling_w_read_their_batch_cells_once_per_publication(
    platform: Platform,
) -> None:
    """The batch part of a window reaching past W (an hour straddling W1, as a one-key series,
    per group, and for `top`) is read once per served stamp: repeated requests send no
    statement and answer the same; after a publication they read the new generation's."""
    settings = _world(platform)
    load_views(settings, EVENTS, W1, seed=3)
    span = {"start": format_time(T0 - HOUR), "end": format_time(T0 + HOUR)}
    queries: list[tuple[str, dict[str, str]]] = [
        ("series", {"window": "1h", "page": "/a", **span}),
        ("series", {"window": "1h", "group_by": "page", **span}),
        ("top", {"window": "1h", "at": format_time(T0 - 30 * MINUTE)}),
    ]

    def ask(client: TestClient) -> list[dict[str, Any]]:
        bodies = []
        for path, params in queries:
            response = client.get(f"/v1/metrics/views_by_page/{path}", params=params)
            assert response.status_code == 200, response.text
            bodies.append(response.json())
        return bodies

    def straddling_count(body: dict[str, Any]) -> int:
        point = next(p for p in body["points"] if p["start"] == format_time(T0 - HOUR))
        count: int = point["count"]
        return count

    in_hour = [e for e in EVENTS if T0 - HOUR <= e.time_ms < T0]
    with TestClient(create_app(settings)) as client:
        _holding(client, settings)
        first = ask(client)
        one_key, grouped, top = first
        assert straddling_count(one_key) == sum(e.key == ("/a",) for e in in_hour)
        assert {p["source"] for p in one_key["points"]} == {"mixed", "speed"}
        by_page = {g["key"]["page"]: straddling_count(g) for g in grouped["groups"]}
        assert by_page == {p: sum(e.key == (p,) for e in in_hour) for p in PAGES}
        assert sorted(i["value"] for i in top["items"]) == sorted(by_page.values())
        since = _now(settings)
        assert [ask(client) for _ in range(5)] == [first] * 5
        assert _statements_since(settings, since) == [], "the straddling hour read no cell again"
        with connect(settings.postgres.url) as conn:  # W stays W1; LATE joins its batch part
            _publish_on(conn, settings, EVENTS + LATE, W1)
        stamp = _holding(client, settings)
        one_key, grouped, _ = ask(client)
        late = [e for e in LATE if T0 - HOUR <= e.time_ms < T0]
        assert straddling_count(one_key) == sum(e.key == ("/a",) for e in in_hour + late)
        assert _held(client).stamp == stamp
