"""`lambdactl demo`: the whole platform on one machine — stack, history, a batch run, a speed
worker, the API, and live events flowing — until Ctrl-C (or `--duration`). A child that exits
(a crash, a kill) is reported with the end of its log and restarted, a bounded number of times;
then the demo stops loudly rather than go on saying the platform runs."""

from __future__ import annotations

import math
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any

import httpx
import orjson
from rich.console import Console
from rich.markup import escape

from lambdactl.generator import GeneratorSpec, SampleRecord, generate, produce, sessions_on
from serving_layer.timefmt import format_time
from shared.config import Settings
from shared.errors import LambdaError

MINUTE = 60_000
MAX_RESTARTS = 3
"""Restarts of one child before the demo gives up on it (a crash loop is not a demo)."""
TAIL_LINES = 15
TABLE_CHANGE_AFTER_S = 60.0
"""When the demo's `pages` table changes (a page moves to another section)."""


@dataclass(frozen=True)
class DemoOptions:
    history_events: int = 32_400
    """Produced first, at the live rate, ending when the demo starts: 32,400 at 3 a second
    are the last 3 hours."""
    live_rate_per_s: float = 3
    """Events a second, live and in the history alike: the charts keep one level across W
    (a history 17 times sparser than the live stream, as before #50, read as a fault)."""
    batch_every_s: float = 300.0
    duration_s: float | None = None


HISTORY_MALFORMED = 0.005
"""The history's malformed records (part of its events, so of its rate)."""


@dataclass
class Pace:
    """One stream of sample events at `rate_per_s` from `origin_ms` on, evenly spaced in
    production order (nominal times `origin + i / rate`; the generator adds disorder, late
    events and copies on top): `due` gives the ones not yet given whose nominal time is
    before `until_ms`, however unevenly it is called. The history is the pace's first
    `history_events` counted back from the demo's start; the live stream is the same pace
    from there on, its first call also covering the time the first batch run took."""

    origin_ms: int
    rate_per_s: float
    given: int = 0

    def __post_init__(self) -> None:
        if not self.rate_per_s > 0:
            raise LambdaError(f"the demo's event rate must be positive, not {self.rate_per_s}")

    def at(self, index: int) -> int:
        """Nominal time of the event `index` (negative: the history, before the origin)."""
        return self.origin_ms + round(index * 1000 / self.rate_per_s)

    def history(self, events: int, seed: int, keyed_by_user: bool) -> GeneratorSpec:
        """The `events` before the origin, at the same rate."""
        return GeneratorSpec(
            self.at(-events),
            self.origin_ms,
            events,
            malformed_fraction=HISTORY_MALFORMED,
            seed=seed,
            keyed_by_user=keyed_by_user,
        )

    def due(self, until_ms: int, seed: int, keyed_by_user: bool) -> GeneratorSpec | None:
        """The live events from the last call's up to `until_ms` (None: none is due yet)."""
        upto = max(self.given, math.ceil((until_ms - self.origin_ms) * self.rate_per_s / 1000))
        while upto > self.given and self.at(upto - 1) >= until_ms:  # rounding in `at`
            upto -= 1
        if upto == self.given:
            return None
        spec = GeneratorSpec(
            self.at(self.given),
            self.at(upto),
            upto - self.given,
            disorder_ms=5_000,
            seed=seed,
            keyed_by_user=keyed_by_user,
        )
        self.given = upto
        return spec


@dataclass
class Child:
    name: str
    command: list[str]
    log: Path
    process: subprocess.Popen[bytes]
    restarts: int = 0


@dataclass
class Children:
    """The demo's long-running children (batch runner, speed worker, API), each logging to a
    file of its own: `check` notices one that exited, says which with the end of its log, and
    restarts it up to `max_restarts` times (then raises); leaving the context stops them all.
    Inside it, SIGTERM and SIGHUP (`kill`, a closed terminal) stop the demo as Ctrl-C does:
    they raise KeyboardInterrupt, so the children are stopped, never left running."""

    console: Console
    max_restarts: int = MAX_RESTARTS
    children: list[Child] = field(default_factory=list)
    _handlers: dict[int, Any] = field(default_factory=dict)

    def __enter__(self) -> Children:
        for signum in STOP_SIGNALS:
            self._handlers[signum] = signal.signal(signum, _interrupt)
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        for signum in self._handlers:
            signal.signal(signum, signal.SIG_IGN)  # a second signal does not cut the stopping
        try:
            for child in reversed(self.children):
                _stop(child.process)
        finally:
            for signum, handler in self._handlers.items():
                signal.signal(signum, handler)

    def start(self, name: str, command: list[str], log: Path) -> Child:
        log.parent.mkdir(parents=True, exist_ok=True)
        child = Child(name, command, log, _spawn(command, log))
        self.children.append(child)
        return child

    def check(self) -> None:
        """Report and restart every child that exited since the last check."""
        for child in self.children:
            code = child.process.poll()
            if code is None:
                continue
            self.console.print(
                f"[bold red]the {child.name} exited with code {code}[/bold red]; "
                f"the end of {child.log}:\n{escape(_tail(child.log))}",
                soft_wrap=True,
            )
            if child.restarts >= self.max_restarts:
                raise LambdaError(
                    f"the {child.name} exited {child.restarts + 1} times; the demo stops. "
                    f"See {child.log}"
                )
            child.restarts += 1
            child.process = _spawn(child.command, child.log)
            self.console.print(
                f"restarted the {child.name} ({child.restarts} of {self.max_restarts} restarts)"
            )


STOP_SIGNALS = (signal.SIGTERM, signal.SIGHUP)
"""The signals that stop the demo and its children, besides SIGINT."""


def _interrupt(signum: int, _frame: object) -> None:
    raise KeyboardInterrupt(f"stopped by {signal.Signals(signum).name}")


def _spawn(command: list[str], log: Path) -> subprocess.Popen[bytes]:
    with log.open("ab") as out:  # the child has its own copy of the descriptor
        return subprocess.Popen(
            command, stdout=out, stderr=subprocess.STDOUT, env=os.environ.copy()
        )


def _lambdactl(*args: str) -> list[str]:
    return [sys.executable, "-m", "lambdactl", *args]


def _tail(log: Path, lines: int = TAIL_LINES) -> str:
    try:
        text = log.read_text(errors="replace")
    except OSError as exc:
        return f"  (the log could not be read: {exc})"
    return "\n".join(f"  {line}" for line in text.splitlines()[-lines:]) or "  (empty)"


def _wait_for_api(base: str, children: Children, log: Path) -> None:
    """Until the API answers; a child that exits meanwhile is reported and restarted (a
    server that keeps exiting, e.g. the port is taken, stops the demo)."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        children.check()
        try:
            if httpx.get(f"{base}/healthz", timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    raise LambdaError(f"the API did not answer at {base} within 60 s; see {log}")


def _stop(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(20)
        except subprocess.TimeoutExpired:
            process.kill()


def _load_tables(settings: Settings, console: Console) -> Callable[[Console], None] | None:
    """Load each configured table from `<name>.csv` beside the config, when there is one; the
    demo's `pages` table also changes once the demo runs (returned: the change to make)."""
    from lambdactl.tables import load_table

    folder = Path(os.environ.get("LAMBDA_CONFIG", "lambda.yaml")).resolve().parent
    for table in settings.tables:
        path = folder / f"{table.name}.csv"
        if path.is_file():
            sent = load_table(settings, table.name, path)
            console.print(f"loaded table {table.name}: {sent} versions from {path.name}")
    tables = {t.name: t for t in settings.tables}
    pages = tables.get("pages")
    if pages is None or pages.key_field != "page" or pages.time_field is None:
        return None

    def move_page(console: Console) -> None:
        """`/page/1` moves from news to sport from now on: views after this minute count for
        sport, earlier ones stay news (rule 11)."""
        at = int(time.time() * 1000)
        version = {"page": "/page/1", "section": "sport", pages.time_field or "": at}
        produce(
            settings.kafka,
            pages.topic,
            iter([SampleRecord(b"/page/1", orjson.dumps(version))]),
        )
        console.print(f"table change: /page/1 is in section sport from {format_time(at)} on")

    return move_page


def _minutes(ms: int) -> str:
    """`3 h`, `2 h 47 min`, `10 min`."""
    hours, minutes = divmod(round(ms / MINUTE), 60)
    parts = [f"{hours} h"] if hours else []
    if minutes or not hours:
        parts.append(f"{minutes} min")
    return " ".join(parts)


DEMO_PG_PORT = 5433
"""Where the demo's API answers SQL in the PostgreSQL wire protocol, unless `serving.pg_port`
says otherwise."""


def run_demo(settings: Settings, options: DemoOptions, console: Console) -> None:
    from lambdactl.batch_watch import watch_run
    from shared.db.connect import connect
    from shared.db.runs import RunRequest, queue_run

    source = settings.sources[0]
    by_user = sessions_on(settings, source)
    bootstrap = settings.kafka.bootstrap_servers
    now = int(time.time() * 1000)
    change = _load_tables(settings, console)
    pace = Pace(now, options.live_rate_per_s)
    history = pace.history(options.history_events, now % 1000, by_user)
    console.print(
        f"producing {options.history_events} events of history (the last "
        f"{_minutes(now - history.start_ms)}, {options.live_rate_per_s:g} a second as the "
        "live events)..."
    )
    produce(bootstrap, source.topic, generate(history))
    base = f"http://{settings.serving.host}:{settings.serving.port}"
    logs = settings.stack.data_dir / "logs"
    with Children(console) as children:
        children.start("batch runner", _lambdactl("batch", "runner"), logs / "batch-runner.log")
        if not watch_run(settings, RunRequest("full"), console, execute_here=False):
            raise LambdaError(f"the first batch run failed; see {logs / 'batch-runner.log'}")
        children.start("speed worker", _lambdactl("speed"), logs / "speed.log")
        pg_port = settings.serving.pg_port or DEMO_PG_PORT
        serve = _lambdactl("serve", "--pg-port", str(pg_port))
        children.start("API", serve, logs / "serve.log")
        _wait_for_api(base, children, logs / "serve.log")
        metric = settings.metrics[0]
        key = "".join(f"&{d}=/" for d in metric.key)
        hour_ago = int(time.time() * 1000) // MINUTE * MINUTE - 60 * MINUTE
        console.print(
            f"\n[bold green]The platform is running.[/bold green]\n"
            f"  dashboard: {base}/\n  API docs:  {base}/docs\n"
            f"  sample:    curl '{base}/v1/metrics/{metric.name}/series?window=1m"
            f"&start={format_time(hour_ago)}&end={format_time(hour_ago + 120 * MINUTE)}{key}'\n"
            f"  SQL:       psql -h {settings.serving.host} -p {pg_port} -U demo -d lambda -c "
            f"\"SELECT time_bucket('1h', ts) AS hour, COUNT(*) FROM {metric.name} WHERE "
            f"ts >= '{format_time(hour_ago - 23 * 60 * MINUTE)}' AND ts < "
            f"'{format_time(hour_ago + 120 * MINUTE)}' GROUP BY 1\"\n"
            f"  logs:      {logs}\n"
            f"Live events flow now, {options.live_rate_per_s:g} a second (as the history); an "
            f"incremental batch run is queued every {options.batch_every_s:.0f} s. Ctrl-C "
            "stops the demo (the stack keeps running).\n",
            soft_wrap=True,
        )
        started = last_batch = time.monotonic()
        sequence = 0
        while options.duration_s is None or time.monotonic() - started < options.duration_s:
            children.check()
            tick = int(time.time() * 1000)
            sequence += 1
            live = pace.due(tick, sequence * 7919 + now % 1000, by_user)
            if live is not None:
                produce(bootstrap, source.topic, generate(live))
            if change is not None and time.monotonic() - started >= TABLE_CHANGE_AFTER_S:
                change(console)
                change = None
            if time.monotonic() - last_batch >= options.batch_every_s:
                with connect(settings.postgres.url, autocommit=True) as conn:
                    run_id, _ = queue_run(conn, RunRequest("incremental"))
                console.print(f"queued incremental run {run_id}")
                last_batch = time.monotonic()
            time.sleep(max(0.0, 1.0 - (time.time() * 1000 - tick) / 1000))
