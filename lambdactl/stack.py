"""The local stack behind `lambdactl stack up|down|status`: Apache Kafka, Redis, PostgreSQL.

Services already answering at the configured URLs are used as they are (README,
"Local stack"); only missing ones are started, and only on this machine's loopback address. What
we start keeps its data in `<data_dir>/<service>/`, its log in `<data_dir>/logs/` and its pid
file in `<data_dir>/run/`, and runs in its own session so it outlives the command that started
it. `stack down` stops only those processes (found by their pid files) and keeps the data.

PostgreSQL refuses to run as root, so as root the cluster is initialised and run as the `postgres`
user (Debian's package creates it). That user usually cannot traverse a project under `/root` or
pytest's `/tmp/pytest-of-root/`; rather than loosening permissions on those parents, the cluster
then lives in the postgres user's home, `/var/lib/postgresql/lambda-<hash of abs data_dir>/`
(`data/` and `postgres.log`), a persistent place it owns that `pg_lsclusters` does not manage.
The path is shown in the service's detail. The server listens on TCP only (no unix socket): a
socket needs a directory the postgres user can write and a path under 107 bytes, and every
client here uses TCP anyway. Authentication is `trust` on loopback; the role and database of
the configured URL are created on first start.

Kafka is Apache Kafka itself, one KRaft node run by the JVM from jars that Maven resolves by
pinned coordinates (`lambdactl/kafka_broker.py`); Maven and Java come from Debian's packages
when missing.

Linux only: liveness is read from `/proc`, packages come from Debian's apt.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import hashlib
import ipaddress
import os
import pwd
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import warnings
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import unquote, urlsplit

import psutil
import psycopg
import redis
from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient
from psycopg import sql
from rich.table import Table

from lambdactl import kafka_broker
from shared.config import KafkaSettings, Settings
from shared.errors import ServiceUnavailableError
from shared.kafka import client_config

START_TIMEOUT_S = 60
"""How long a starting service may go without answering and without writing to its log."""
START_LIMIT_S = 900
"""How long a starting service that keeps writing to its log (a broker loading thousands of
partitions, a database recovering its WAL) may take in all."""
STOP_TIMEOUT_S = 20
MIN_JAVA = 17
MIN_POSTGRES = 15
DEBIAN_POSTGRES = Path("/usr/lib/postgresql")
PG_SETTINGS = "-c max_connections=200"
SERVICES = ("kafka", "redis", "postgres")
APT_LOCK = Path(tempfile.gettempdir()) / "lambdactl-apt.lock"
"""Held while `apt_install` runs, machine-wide."""
MARKERS = {"kafka": kafka_broker.MAIN_CLASS, "redis": "redis-server"}
"""What a managed process's command line names (a pid file may outlive its process)."""


def _pg_shared_buffers_mb() -> int:
    """A quarter of the machine's memory, between PostgreSQL's default 128 MB and 8 GB: the
    usual starting point for a dedicated server (PostgreSQL's documentation). At the default the
    served view's recent cells, which dashboards poll, were read through the kernel's page cache,
    a system call per page: a 60-cell series read over 10^8 cells touches ~300 pages."""
    quarter_mb = memory_bytes() // 4 // 2**20
    return min(max(quarter_mb, 128), 8192)


def memory_bytes() -> int:
    """The machine's memory, or the container's limit when it has a lower one (cgroup v2,
    then v1): shared buffers touched count against it."""
    total = int(psutil.virtual_memory().total)
    for limit in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
        with contextlib.suppress(OSError, ValueError):
            total = min(total, int(Path(limit).read_text().strip()))
    return total


@dataclass(frozen=True)
class ServiceState:
    name: str
    url: str
    reachable: bool
    started_by_us: bool
    detail: str


@dataclass(frozen=True)
class _Dirs:
    root: Path

    @classmethod
    def of(cls, settings: Settings) -> _Dirs:
        return cls(settings.stack.data_dir.resolve())

    @property
    def run(self) -> Path:
        return self.root / "run"

    @property
    def logs(self) -> Path:
        return self.root / "logs"

    def data(self, service: str) -> Path:
        return self.root / service

    def log(self, service: str) -> Path:
        return self.logs / f"{service}.log"

    def pid_file(self, service: str) -> Path:
        return self.run / f"{service}.pid"


@dataclass(frozen=True)
class _PgLayout:
    cluster: Path
    log: Path
    relocated: bool


def stack_up(settings: Settings, services: tuple[str, ...] = SERVICES) -> list[ServiceState]:
    """Make the services answer at the configured URLs; safe to call repeatedly."""
    java = _java_state(install=True)
    dirs = _Dirs.of(settings)
    for path in (dirs.root, dirs.run, dirs.logs):
        path.mkdir(parents=True, exist_ok=True)
    starters = {"kafka": _kafka_up, "redis": _redis_up, "postgres": _postgres_up}
    with _locked(dirs):
        return [*(starters[name](settings, dirs) for name in services), java]


def stack_down(settings: Settings, services: tuple[str, ...] = SERVICES) -> list[ServiceState]:
    """Stop what `stack_up` started (never a service it found running); the data stays."""
    dirs = _Dirs.of(settings)
    if dirs.root.is_dir():
        with _locked(dirs):
            for service in services:
                if service == "postgres":
                    _postgres_down(dirs)
                    continue
                marker = MARKERS[service]
                pid = _managed_pid(dirs, service, marker)
                if pid is not None and not _stop_group(pid, marker):
                    raise ServiceUnavailableError(
                        f"{service} (pid {pid}) survived SIGKILL; check `ps -p {pid}`"
                    )
                dirs.pid_file(service).unlink(missing_ok=True)
    return _service_states(settings)


def _postgres_down(dirs: _Dirs) -> None:
    layout = _pg_layout(dirs)
    if _postmaster_pid(layout.cluster) is not None:
        pg_ctl = _pg_bindir(layout.cluster, install=False) / "pg_ctl"
        stop = [str(pg_ctl), "-D", str(layout.cluster), "-m", "fast", "-w", "stop"]
        _run(_as_postgres(stop), "pg_ctl stop", layout.log)


def stack_status(settings: Settings) -> list[ServiceState]:
    return [*_service_states(settings), _java_state(install=False)]


def render_states(states: list[ServiceState]) -> Table:
    table = Table(title="local stack")
    for column in ("service", "url", "state", "started by us", "detail"):
        table.add_column(column)
    for state in states:
        table.add_row(
            state.name,
            _redact(state.url),
            "[green]up[/green]" if state.reachable else "[red]down[/red]",
            "yes" if state.started_by_us else "no",
            state.detail,
        )
    return table


def _service_states(settings: Settings) -> list[ServiceState]:
    dirs = _Dirs.of(settings)
    host, port = _kafka_address(settings)
    kafka_pid = _managed_pid(dirs, "kafka", MARKERS["kafka"])
    redis_pid = _managed_pid(dirs, "redis", MARKERS["redis"])
    layout = _pg_layout(dirs)
    return [
        _describe(
            "kafka",
            settings.kafka.bootstrap_servers,
            _kafka_error(settings.kafka, host, port) is None,
            kafka_pid,
            _where(dirs.data("kafka"), dirs.log("kafka")),
        ),
        _describe(
            "redis",
            settings.redis.url,
            _redis_error(settings.redis.url) is None,
            redis_pid,
            _where(dirs.data("redis"), dirs.log("redis")),
        ),
        _describe(
            "postgres",
            settings.postgres.url,
            _pg_error(settings.postgres.url) is None,
            _postmaster_pid(layout.cluster),
            _pg_where(layout),
        ),
    ]


def _describe(
    name: str, url: str, reachable: bool, pid: int | None, where: str, note: str = ""
) -> ServiceState:
    if pid is not None:
        detail = f"pid {pid}; {where}"
        if not reachable:
            detail = f"pid {pid} runs but does not answer; {where}"
    elif reachable:
        detail = "not started by lambdactl; used as it is"
    else:
        detail = f"down; `lambdactl stack up` starts it; {where}"
    return ServiceState(name, url, reachable, pid is not None, note + detail)


def _where(data: Path, log: Path) -> str:
    return f"data {data}; log {log}"


def _pg_where(layout: _PgLayout) -> str:
    moved = " (moved: the postgres user cannot reach the data dir)" if layout.relocated else ""
    return f"cluster {layout.cluster}{moved}; log {layout.log}"


# Kafka and Redis: a foreground process we spawn and track by pid file.


def kafka_runtime(settings: Settings) -> tuple[str, str]:
    """The Java executable and the Apache Kafka classpath the local broker runs with (Java
    installed and the jars resolved when missing), also for a local quorum of several nodes
    (`kafka_broker.quorum_commands`)."""
    _java_state(install=True)
    java = _java_version()
    assert java is not None, "_java_state installs Java or raises"
    return java[0], kafka_broker.classpath(_maven(), _Dirs.of(settings).run)


def _kafka_up(settings: Settings, dirs: _Dirs) -> ServiceState:
    host, port = _kafka_address(settings)

    def probe() -> str | None:
        return _kafka_error(settings.kafka, host, port)

    def command() -> list[str]:
        java, jars = kafka_runtime(settings)
        return kafka_broker.broker_command(java, jars, dirs.data("kafka"), _bind(host), port)

    return _ensure_process(
        "kafka",
        settings.kafka.bootstrap_servers,
        host,
        port,
        "LAMBDA_KAFKA__BOOTSTRAP_SERVERS",
        MARKERS["kafka"],
        dirs,
        probe,
        command,
    )


def _redis_up(settings: Settings, dirs: _Dirs) -> ServiceState:
    url = settings.redis.url
    parts = urlsplit(url)
    host, port = parts.hostname or "127.0.0.1", parts.port or 6379

    def command() -> list[str]:
        password = ["--requirepass", unquote(parts.password)] if parts.password else []
        dirs.data("redis").mkdir(parents=True, exist_ok=True)
        return [
            _redis_server(),
            "--port",
            str(port),
            "--bind",
            _bind(host),
            "--dir",
            str(dirs.data("redis")),
            "--daemonize",
            "no",
            "--save",
            "",
            "--appendonly",
            "no",
            "--pidfile",
            str(dirs.pid_file("redis")),
            *password,
        ]

    return _ensure_process(
        "redis",
        url,
        host,
        port,
        "LAMBDA_REDIS__URL",
        MARKERS["redis"],
        dirs,
        lambda: _redis_error(url),
        command,
    )


def _ensure_process(
    name: str,
    url: str,
    host: str,
    port: int,
    env_var: str,
    marker: str,
    dirs: _Dirs,
    probe: Callable[[], str | None],
    command: Callable[[], list[str]],
) -> ServiceState:
    pid = _managed_pid(dirs, name, marker)
    where = _where(dirs.data(name), dirs.log(name))
    error = probe()
    if error is not None and pid is not None:  # ours: it may still be starting
        patience = _StartPatience(dirs.log(name))
        while error is not None and not patience.exhausted():
            time.sleep(0.5)
            error = probe()
    if error is None:
        return _describe(name, url, True, pid, where, note="already running; ")
    if pid is not None:
        raise ServiceUnavailableError(
            f"{name} (pid {pid}, started by lambdactl) does not answer at {_redact(url)}: {error}. "
            f"See {dirs.log(name)}, then run `lambdactl stack down` and `lambdactl stack up`"
        )
    _refuse_start(name, url, host, port, error, env_var)
    pid = _spawn_and_wait(name, command(), dirs, marker, probe)
    return ServiceState(name, url, True, True, f"started; pid {pid}; {where}")


def _spawn_and_wait(
    name: str, cmd: list[str], dirs: _Dirs, marker: str, probe: Callable[[], str | None]
) -> int:
    """Start `cmd` detached (its own session, so it outlives us), then wait until it answers."""
    log, pid_file = dirs.log(name), dirs.pid_file(name)
    with log.open("ab") as out:
        proc = subprocess.Popen(
            cmd,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    pid = proc.pid
    pid_file.write_text(f"{pid}\n")
    patience = _StartPatience(log)
    try:
        while (error := probe()) is not None:
            if proc.poll() is not None:
                raise ServiceUnavailableError(
                    f"{name} exited with code {proc.returncode} while starting ({error}); "
                    f"last lines of {log}:\n{_tail(log)}"
                )
            if patience.exhausted():
                raise ServiceUnavailableError(
                    f"{name} did not answer ({error}) {patience.why()}; "
                    f"last lines of {log}:\n{_tail(log)}"
                )
            time.sleep(0.2)
    except BaseException:
        _stop_group(pid, marker)
        pid_file.unlink(missing_ok=True)
        raise
    finally:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ResourceWarning)  # it is meant to outlive us
            del proc
    return pid


class _StartPatience:
    """Waiting for a service to answer: `START_TIMEOUT_S` after its log last grew, and at
    most `START_LIMIT_S` in all."""

    def __init__(self, log: Path) -> None:
        self._log = log
        self._began = self._progress_at = time.monotonic()
        self._size = self._log_size()

    def _log_size(self) -> int:
        try:
            return self._log.stat().st_size
        except OSError:
            return 0

    def exhausted(self) -> bool:
        now = time.monotonic()
        size = self._log_size()
        if size != self._size:
            self._size, self._progress_at = size, now
        return now - self._progress_at > START_TIMEOUT_S or now - self._began > START_LIMIT_S

    def why(self) -> str:
        waited = time.monotonic() - self._began
        if waited > START_LIMIT_S:
            return f"within {START_LIMIT_S} s, although it kept writing its log"
        return f"and wrote nothing to its log for {START_TIMEOUT_S} s ({waited:.0f} s in all)"


def _stop_group(pid: int, marker: str) -> bool:
    """SIGTERM the process group (Kafka shuts down in a controlled way), then SIGKILL."""
    for sig, grace in ((signal.SIGTERM, STOP_TIMEOUT_S), (signal.SIGKILL, 5)):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, sig)
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline:
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, os.WNOHANG)
            if not _alive(pid, marker) and not _group_alive(pid):
                return True
            time.sleep(0.1)
    return False


def _group_alive(pgid: int) -> bool:
    """Whether a live (non-zombie) process remains in the process group (a child of a managed
    service may outlive it and still hold its port)."""
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rpartition(")")[2].split()
        except OSError:
            continue
        if len(fields) > 2 and fields[0] != "Z" and int(fields[2]) == pgid:
            return True
    return False


def _managed_pid(dirs: _Dirs, service: str, marker: str) -> int | None:
    try:
        pid = int(dirs.pid_file(service).read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None
    return pid if _alive(pid, marker) else None


def _alive(pid: int, marker: str) -> bool:
    """A live process whose command line names `marker` (zombies have none; reused pids differ)."""
    try:
        return marker.encode() in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False


def _maven() -> str:
    found = shutil.which("mvn")
    if found is None:
        apt_install(
            ["maven"],
            "Apache Maven is not installed, and the local Kafka's jars are resolved with it: "
            "install it (e.g. `apt-get install maven`) or point LAMBDA_KAFKA__BOOTSTRAP_SERVERS "
            "at a running Kafka",
        )
        found = shutil.which("mvn")
    if found is None:
        raise ServiceUnavailableError("mvn is still missing after installing maven")
    return found


def _redis_server() -> str:
    found = shutil.which("redis-server")
    if found is None:
        apt_install(
            ["redis-server"],
            "redis-server is not installed: install Redis 7 (e.g. `apt-get install "
            "redis-server`) or point LAMBDA_REDIS__URL at a running Redis",
        )
        found = shutil.which("redis-server")
    if found is None:
        raise ServiceUnavailableError("redis-server is still missing after installing it")
    return found


# PostgreSQL: a cluster of our own, run by pg_ctl, tracked by its postmaster.pid.


def _postgres_up(settings: Settings, dirs: _Dirs) -> ServiceState:
    url = settings.postgres.url
    parts = urlsplit(url)
    host, port = parts.hostname or "127.0.0.1", parts.port or 5432
    layout = _pg_layout(dirs)
    pid = _postmaster_pid(layout.cluster)
    error = _pg_error(url)
    if error is None:
        return _describe("postgres", url, True, pid, _pg_where(layout), note="already running; ")
    note = "already running"
    if pid is None:
        _refuse_start("postgres", url, host, port, error, "LAMBDA_POSTGRES__URL")
        if _is_root():
            _pg_bindir(None, install=True)  # creates the postgres user the layout depends on
            layout = _pg_layout(dirs)
        _pg_start(layout, _bind(host), port)
        pid, note = _postmaster_pid(layout.cluster), "started"
    _pg_create_role_and_database(url, _bind(host), port)
    if (error := _pg_error(url)) is not None:
        raise ServiceUnavailableError(
            f"our PostgreSQL cluster {layout.cluster} runs but refuses {_redact(url)}: {error}. "
            f"See {layout.log}; `lambdactl stack down` then `stack up` restarts it"
        )
    return ServiceState("postgres", url, True, True, f"{note}; pid {pid}; {_pg_where(layout)}")


def _pg_layout(dirs: _Dirs) -> _PgLayout:
    """Where our cluster lives: in the data dir, unless the postgres user cannot reach it."""
    local = _PgLayout(dirs.data("postgres"), dirs.log("postgres"), relocated=False)
    if not _is_root() or (local.cluster / "PG_VERSION").exists():
        return local
    try:
        home = Path(pwd.getpwnam("postgres").pw_dir)
    except KeyError:
        return local
    digest = hashlib.sha256(str(dirs.root).encode()).hexdigest()[:12]
    base = home / f"lambda-{digest}"
    moved = _PgLayout(base / "data", base / "postgres.log", relocated=True)
    if (moved.cluster / "PG_VERSION").exists():
        return moved
    reachable = subprocess.run(
        ["runuser", "-u", "postgres", "--", "test", "-x", str(dirs.root)], check=False
    )
    return local if reachable.returncode == 0 else moved


def _pg_start(layout: _PgLayout, bind: str, port: int) -> None:
    bindir = _pg_bindir(layout.cluster, install=True)
    for path in {layout.cluster.parent, layout.cluster, layout.log.parent}:
        path.mkdir(parents=True, exist_ok=True)
    layout.log.touch()
    if _is_root():
        owner = pwd.getpwnam("postgres")
        owned = [layout.cluster, layout.log]
        if layout.relocated:
            owned.append(layout.cluster.parent)
        for path in owned:
            os.chown(path, owner.pw_uid, owner.pw_gid)
    layout.cluster.chmod(0o700)
    if not (layout.cluster / "PG_VERSION").exists():
        initdb = [
            str(bindir / "initdb"),
            "-D",
            str(layout.cluster),
            "-U",
            "postgres",
            "--auth=trust",
            "--encoding=UTF8",
            "--no-locale",
        ]
        _run(_as_postgres(initdb), "initdb", layout.log)
    options = (
        f"-p {port} -c listen_addresses={bind} -c unix_socket_directories='' {PG_SETTINGS} "
        f"-c shared_buffers={_pg_shared_buffers_mb()}MB"
    )
    start = [
        str(bindir / "pg_ctl"),
        "-D",
        str(layout.cluster),
        "-l",
        str(layout.log),
        "-w",
        "-t",
        str(START_TIMEOUT_S),
        "-o",
        options,
        "start",
    ]
    _run(_as_postgres(start), "pg_ctl start", layout.log)


def postgres_command(tool: str, *args: str) -> list[str]:
    """The command line running PostgreSQL's `tool` (`pg_basebackup`, `pg_ctl`...) of the
    newest installed version, as the user our clusters run as (`postgres` when root)."""
    return _as_postgres([str(_pg_bindir(None, install=False) / tool), *args])


def _pg_bindir(cluster: Path | None, install: bool) -> Path:
    """The cluster's own major version if it exists (data files are per major), else the newest."""
    versions = _pg_versions()
    if not versions and install:
        apt_install(
            ["postgresql"],
            f"PostgreSQL {MIN_POSTGRES}+ is not installed: `apt-get install postgresql`, or point "
            "LAMBDA_POSTGRES__URL at a running PostgreSQL",
        )
        versions = _pg_versions()
    wanted = None
    if cluster is not None and (cluster / "PG_VERSION").exists():
        wanted = int((cluster / "PG_VERSION").read_text().strip())
    for version in sorted(versions, reverse=True):
        if wanted in (None, version):
            return DEBIAN_POSTGRES / str(version) / "bin"
    need = f"PostgreSQL {wanted} (the version of {cluster})" if wanted else "PostgreSQL 15+"
    raise ServiceUnavailableError(f"{need} is not installed under {DEBIAN_POSTGRES}; install it")


def _pg_versions() -> list[int]:
    found = (pg_ctl.parent.parent.name for pg_ctl in DEBIAN_POSTGRES.glob("*/bin/pg_ctl"))
    return [int(name) for name in found if name.isdigit() and int(name) >= MIN_POSTGRES]


def _pg_create_role_and_database(url: str, host: str, port: int) -> None:
    """The URL's role (CREATEDB, so tests can make a database each) and database."""
    parts = urlsplit(url)
    user = unquote(parts.username or "postgres")
    dbname = unquote(parts.path.lstrip("/")) or user
    try:
        admin = psycopg.connect(
            host=host,
            port=port,
            user="postgres",
            dbname="postgres",
            autocommit=True,
            connect_timeout=5,
        )
    except psycopg.Error as exc:
        raise ServiceUnavailableError(
            f"cannot connect as postgres to our cluster on {host}:{port} ({exc}); it may run on "
            "another port: `lambdactl stack down` then `stack up` restarts it"
        ) from exc
    with admin:
        if not admin.execute("select 1 from pg_roles where rolname = %s", (user,)).fetchone():
            password = sql.Literal(unquote(parts.password)) if parts.password else sql.NULL
            admin.execute(
                sql.SQL("create role {} login createdb password {}").format(
                    sql.Identifier(user), password
                )
            )
        if not admin.execute("select 1 from pg_database where datname = %s", (dbname,)).fetchone():
            admin.execute(
                sql.SQL("create database {} owner {}").format(
                    sql.Identifier(dbname), sql.Identifier(user)
                )
            )


def _postmaster_pid(cluster: Path) -> int | None:
    try:
        pid = int((cluster / "postmaster.pid").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None
    return pid if _alive(pid, "postgres") else None


def _as_postgres(cmd: list[str]) -> list[str]:
    return ["runuser", "-u", "postgres", "--", *cmd] if _is_root() else cmd


# Shared helpers.


def _refuse_start(name: str, url: str, host: str, port: int, error: str, env_var: str) -> None:
    """We only start services on loopback, and never over something else holding the port."""
    if not _is_loopback(host):
        raise ServiceUnavailableError(
            f"{name} at {_redact(url)} is not reachable ({error}) and is not on this machine, so "
            f"`lambdactl stack up` cannot start it: start it there, or point {env_var} at a "
            "reachable one"
        )
    if _port_open(host, port):
        raise ServiceUnavailableError(
            f"something already listens on {host}:{port} but refuses {name} at {_redact(url)} "
            f"({error}); make it accept that URL (for PostgreSQL: create the role and database), "
            f"or point {env_var} at a free port so `lambdactl stack up` can start its own"
        )


def _kafka_address(settings: Settings) -> tuple[str, int]:
    first = settings.kafka.bootstrap_servers.split(",")[0].strip().split("://")[-1]
    host, _, port = first.rpartition(":")
    return host.strip("[]") or "127.0.0.1", int(port or 9092)


def _port_open(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=1.0):
            return True
    except OSError:
        return False


def _kafka_error(kafka: KafkaSettings, host: str, port: int) -> str | None:
    """None when the broker answers a metadata request: an open port is not enough (a broker
    may accept connections before it has registered, or the port may be another program's)."""
    if not _port_open(host, port):
        return f"nothing accepts connections on {host}:{port}"
    admin = AdminClient({**client_config(kafka), "log_level": 0})
    try:
        admin.list_topics(timeout=3.0)
        return None
    except KafkaException as exc:
        return f"{host}:{port} accepts connections but answers no metadata request ({exc})"


def _redis_error(url: str) -> str | None:
    client = redis.Redis.from_url(url, socket_connect_timeout=1.0, socket_timeout=2.0)
    try:
        client.ping()
        return None
    except (redis.RedisError, OSError) as exc:
        return str(exc)
    finally:
        client.close()


def _pg_error(url: str) -> str | None:
    try:
        psycopg.connect(url, connect_timeout=2).close()
        return None
    except psycopg.Error as exc:
        return str(exc).strip()


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _bind(host: str) -> str:
    return "127.0.0.1" if host == "localhost" else host


def _is_root() -> bool:
    return os.geteuid() == 0


def _java_state(install: bool) -> ServiceState:
    """Spark needs Java 17+; `stack up` installs it when it can (root), otherwise says how."""
    found = _java_version()
    if install and (found is None or found[1] < MIN_JAVA):
        apt_install(
            ["openjdk-17-jre-headless"],
            f"Spark needs Java {MIN_JAVA}+: install OpenJDK 17 (e.g. `apt-get install "
            "openjdk-17-jre-headless`) and put it on PATH or in JAVA_HOME",
        )
        found = _java_version()
    ok = found is not None and found[1] >= MIN_JAVA
    if install and not ok:
        raise ServiceUnavailableError(
            f"Spark needs Java {MIN_JAVA}+ but `java -version` reports "
            f"{found[2] if found else 'nothing'}; set JAVA_HOME to a Java {MIN_JAVA}+ install"
        )
    path, detail = (found[0], found[2]) if found else ("-", "not installed")
    if found and not ok:
        detail = f"{detail}; Spark needs Java {MIN_JAVA}+"
    return ServiceState("java", path, ok, False, detail)


def _java_version() -> tuple[str, int, str] | None:
    java_home = os.environ.get("JAVA_HOME")
    java = str(Path(java_home) / "bin" / "java") if java_home else shutil.which("java")
    if java is None or not Path(java).exists():
        return None
    out = subprocess.run([java, "-version"], capture_output=True, text=True, check=False)
    first = (out.stderr or out.stdout).strip().splitlines()[:1]
    match = re.search(r'version "(\d+)(?:\.(\d+))?', first[0]) if first else None
    if match is None:
        return None
    major = int(match.group(1))
    if major == 1 and match.group(2):
        major = int(match.group(2))  # "1.8.0" is Java 8
    return java, major, first[0]


def apt_install(packages: Sequence[str], how_to: str) -> None:
    """`apt-get install` as root, one at a time on the machine: two `stack up`s (or test
    workers) installing at once would race for dpkg's lock and one would fail. Not root:
    `ServiceUnavailableError(how_to)`."""
    if not _is_root():
        raise ServiceUnavailableError(how_to)
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    with APT_LOCK.open("w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        _apt_update()
        command = ["apt-get", "install", "-y", *packages]
        _run(command, " ".join(command), env=env)


@functools.cache
def _apt_update() -> None:
    """Once per process: the package lists rarely change within one `stack up`."""
    _run(["apt-get", "update"], "apt-get update")


def _run(
    cmd: list[str], what: str, log: Path | None = None, env: dict[str, str] | None = None
) -> None:
    """Run a short command in its own session (pg_ctl's server must not share our session)."""
    done = subprocess.run(
        cmd, capture_output=True, text=True, env=env, start_new_session=True, check=False
    )
    if done.returncode != 0:
        output = "\n".join((done.stdout + done.stderr).strip().splitlines()[-20:])
        more = f"\nlast lines of {log}:\n{_tail(log)}" if log else ""
        raise ServiceUnavailableError(f"{what} failed (exit {done.returncode}):\n{output}{more}")


def _tail(log: Path, lines: int = 20) -> str:
    """The log's last lines."""
    try:
        text = log.read_text(errors="replace")
    except OSError:
        return "(no log)"
    return "\n".join(text.splitlines()[-lines:])


@contextlib.contextmanager
def _locked(dirs: _Dirs) -> Iterator[None]:
    """Two concurrent `stack up`s on one data dir must not both start a service."""
    dirs.run.mkdir(parents=True, exist_ok=True)
    with (dirs.run / "stack.lock").open("w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        yield


def _redact(url: str) -> str:
    parts = urlsplit(url)
    if not parts.password:
        return url
    netloc = parts.netloc.replace(f":{parts.password}@", ":***@", 1)
    return parts._replace(netloc=netloc).geturl()
