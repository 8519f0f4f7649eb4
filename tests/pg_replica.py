"""A PostgreSQL streaming replica made as an operator makes one: `pg_basebackup -R` of a
primary the tests started (`tests.e2e.support.private_services`), run in hot standby on a
free port of its own, with helpers to hold its replay back (a replica that lags) and to wait
until it has caught up."""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import psycopg

from lambdactl.stack import PG_SETTINGS, postgres_command
from tests.e2e.support import free_port


def _with_port(url: str, port: int) -> str:
    parts = urlsplit(url)
    userinfo, _, _ = parts.netloc.rpartition("@")
    netloc = f"{userinfo}@{parts.hostname}:{port}" if userinfo else f"{parts.hostname}:{port}"
    return urlunsplit(parts._replace(netloc=netloc))


def superuser_url(url: str) -> str:
    """The cluster of `url` as its superuser, `postgres` (the local clusters trust it)."""
    parts = urlsplit(url)
    return urlunsplit(parts._replace(netloc=f"postgres@{parts.hostname}:{parts.port}", path="/"))


@contextmanager
def streaming_replica(primary_url: str) -> Iterator[str]:
    """A hot standby of the cluster at `primary_url`, streaming from it; yields the URL of the
    same database on the replica. Stopped and removed afterwards."""
    primary = urlsplit(primary_url)
    port = free_port()
    # Not under pytest's tmp dir: the postgres user must reach the replica's directory.
    root = Path(tempfile.mkdtemp(prefix="lp-replica-"))
    root.chmod(0o755)
    if os.geteuid() == 0:
        owner = pwd.getpwnam("postgres")
        os.chown(root, owner.pw_uid, owner.pw_gid)
    data, log = root / "data", root / "postgres.log"
    try:
        backup = postgres_command(
            "pg_basebackup",
            *("-h", str(primary.hostname), "-p", str(primary.port), "-U", "postgres"),
            *("-D", str(data), "--write-recovery-conf", "--wal-method=stream"),
            "--checkpoint=fast",
        )
        subprocess.run(backup, check=True, timeout=120, capture_output=True)
        # The primary's settings too: a hot standby refuses to replay with fewer connections.
        options = (
            f"-p {port} -c listen_addresses=127.0.0.1 -c unix_socket_directories='' "
            f"-c hot_standby=on -c hot_standby_feedback=on {PG_SETTINGS}"
        )
        start = postgres_command(
            "pg_ctl", "-D", str(data), "-l", str(log), "-w", "-t", "60", "-o", options, "start"
        )
        started = subprocess.run(start, check=False, timeout=90, capture_output=True)
        if started.returncode != 0:
            tail = log.read_text(errors="replace")[-2000:] if log.exists() else ""
            raise RuntimeError(f"the replica did not start: {started.stderr!r}\n{tail}")
        yield _with_port(primary_url, port)
    finally:
        with contextlib.suppress(Exception):
            stop = postgres_command("pg_ctl", "-D", str(data), "-m", "immediate", "-w", "stop")
            subprocess.run(stop, check=False, timeout=60, capture_output=True)
        shutil.rmtree(root, ignore_errors=True)


def pause_replay(replica_url: str) -> None:
    """The replica keeps receiving the primary's changes but applies none: it lags."""
    with psycopg.connect(superuser_url(replica_url), autocommit=True) as conn:
        conn.execute("SELECT pg_wal_replay_pause()")


def resume_replay(replica_url: str) -> None:
    with psycopg.connect(superuser_url(replica_url), autocommit=True) as conn:
        conn.execute("SELECT pg_wal_replay_resume()")


def wait_received(
    primary_url: str, replica_url: str, *, replayed: bool, limit_s: float = 30
) -> None:
    """Until the replica has received (`replayed`: and applied) everything the primary has
    written so far."""
    with psycopg.connect(superuser_url(primary_url), autocommit=True) as conn:
        row = conn.execute("SELECT pg_current_wal_lsn()::text").fetchone()
    assert row is not None
    target = row[0]
    function = "pg_last_wal_replay_lsn" if replayed else "pg_last_wal_receive_lsn"
    deadline = time.monotonic() + limit_s
    with psycopg.connect(superuser_url(replica_url), autocommit=True) as conn:
        while True:
            done = conn.execute(f"SELECT {function}() >= %s::pg_lsn", (target,)).fetchone()
            if done is not None and done[0]:
                return
            assert time.monotonic() < deadline, f"the replica has not {function} {target}"
            time.sleep(0.1)
