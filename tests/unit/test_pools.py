"""The API's PostgreSQL pools while PostgreSQL is down (#14): requests get their 503 promptly
once one found no connection, the outage is logged once each way, and psycopg_pool's line per
failed attempt is dropped. A pool pointed at a port nothing listens on is a PostgreSQL that
is down."""

from __future__ import annotations

import logging
import time
from contextlib import ExitStack

import pytest
from fastapi import HTTPException

from serving_layer import pools
from shared.config import Settings
from tests.e2e.support import free_port


def test_requests_fail_fast_once_postgres_is_known_down(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(pools, "_WAIT_S", 2.0)
    settings = Settings(postgres={"url": f"postgresql://lambda:lambda@127.0.0.1:{free_port()}/x"})
    pool = pools.blocking_pool(settings, settings.postgres.url)
    db = pools.Db(pool)
    try:
        with caplog.at_level(logging.INFO):
            waits = []
            for _ in range(3):
                began = time.monotonic()
                with pytest.raises(HTTPException) as raised, db.connection():
                    pass
                waits.append(time.monotonic() - began)
                assert raised.value.status_code == 503
        assert waits[0] >= 1.9, "the first request waits for a connection as usual"
        assert max(waits[1:]) < 1.0, f"then they are answered promptly: {waits}"
        messages = [r.getMessage() for r in caplog.records]
        assert sum("event=store_down store=postgres pool=operator" in m for m in messages) == 1
        assert not [m for m in messages if m.startswith("error connecting in")], messages
    finally:
        pool.close()


def test_the_outage_ends_with_the_first_connection(caplog: pytest.LogCaptureFixture) -> None:
    waits = pools._Waits("query")
    with caplog.at_level(logging.INFO):
        assert waits.timeout() == pools._WAIT_S
        waits.failed(ConnectionError("refused"))
        waits.failed(ConnectionError("refused"))
        assert waits.timeout() == pools._WAIT_DOWN_S
        waits.succeeded()
        waits.succeeded()
        assert waits.timeout() == pools._WAIT_S
    messages = [r.getMessage() for r in caplog.records]
    assert [m.split(" error=")[0] for m in messages] == [
        "event=store_down store=postgres pool=query",
        "event=store_recovered store=postgres pool=query",
    ]


@pytest.mark.services
def test_a_busy_pool_answers_overloaded_not_down(
    stack: Settings, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Every connection held by other requests is overload: the 503 says so, and the next
    request still waits the usual time (PostgreSQL is up)."""
    monkeypatch.setattr(pools, "_WAIT_S", 0.5)
    pool = pools.blocking_pool(stack, stack.postgres.url)
    db = pools.Db(pool)
    try:
        with ExitStack() as held, caplog.at_level(logging.INFO):
            for _ in range(pools._MAX_SIZE):
                held.enter_context(db.connection())
            with pytest.raises(HTTPException) as raised, db.connection():
                pass
            assert raised.value.status_code == 503
            assert "overloaded" in str(raised.value.detail)
            assert "unreachable" not in str(raised.value.detail)
            assert not [r for r in caplog.records if "store_down" in r.getMessage()]
        with db.connection() as conn:
            assert conn.execute("SELECT 1").fetchone() == (1,)
    finally:
        pool.close()
