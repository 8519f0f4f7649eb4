"""`lambdactl`: stack, topics, tables, db, speed, batch, serve, produce, demo."""

from __future__ import annotations

import os
import time
from enum import StrEnum
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.markup import escape

from lambdactl import stack
from shared.config import Settings, load_settings
from shared.errors import LambdaError

app = typer.Typer(
    help="Lambda platform: speed (Faust/Redis), batch (Spark/PostgreSQL), serving.",
    no_args_is_help=True,
)
stack_app = typer.Typer(help="The local stack: Apache Kafka, Redis, PostgreSQL.")
topics_app = typer.Typer(help="Source and table topics, their .dlq and .late topics.")
tables_app = typer.Typer(help="Lookup tables: keyed, versioned, joined as of event time.")
db_app = typer.Typer(help="The PostgreSQL schema.")
batch_app = typer.Typer(help="Batch recomputes.")
app.add_typer(stack_app, name="stack")
app.add_typer(topics_app, name="topics")
app.add_typer(tables_app, name="tables")
app.add_typer(db_app, name="db")
app.add_typer(batch_app, name="batch")
console = Console()


class RunModeOption(StrEnum):
    incremental = "incremental"
    full = "full"
    range = "range"


def _print_error(exc: Exception) -> None:
    """Unwrapped, so a `<file>:<line>:` stays on one line, and never read as rich markup."""
    console.print(f"[red]{escape(str(exc))}[/red]", soft_wrap=True)


def _settings() -> Settings:
    try:
        return load_settings()
    except LambdaError as exc:
        _print_error(exc)
        raise typer.Exit(2) from exc


class ServiceName(StrEnum):
    kafka = "kafka"
    redis = "redis"
    postgres = "postgres"


ServicesArgument = Annotated[
    list[ServiceName] | None, typer.Argument(help="only these services (default: all)")
]


def _services(chosen: list[ServiceName] | None) -> tuple[str, ...]:
    return tuple(s.value for s in chosen) if chosen else stack.SERVICES


@stack_app.command("up")
def stack_up(services: ServicesArgument = None) -> None:
    """Start what is not already reachable, then apply the schema and create the topics."""
    settings = _settings()
    wanted = _services(services)
    console.print(stack.render_states(stack.stack_up(settings, wanted)))
    if "postgres" in wanted:
        db_upgrade()
    if "kafka" in wanted:
        topics_create()


@stack_app.command("down")
def stack_down(services: ServicesArgument = None) -> None:
    """Stop what `stack up` started (data stays)."""
    console.print(stack.render_states(stack.stack_down(_settings(), _services(services))))


@stack_app.command("status")
def stack_status() -> None:
    console.print(stack.render_states(stack.stack_status(_settings())))


@topics_app.command("create")
def topics_create() -> None:
    """Create missing platform topics; refuse a partition-count mismatch."""
    from shared.kafka import create_topics

    created = create_topics(_settings())
    console.print(f"topics created: {', '.join(created) or 'none (all exist)'}; all checked")


@topics_app.command("check")
def topics_check() -> None:
    from shared.kafka import check_topics

    check_topics(_settings())
    console.print("topics match the configuration")


@db_app.command("upgrade")
def db_upgrade() -> None:
    """Apply the schema migrations (Alembic)."""
    from shared.db.migrate import upgrade

    upgrade(_settings().postgres.url)
    console.print("database schema is up to date")


@app.command()
def speed() -> None:
    """Run one speed-layer worker (Faust); start N for N-way parallelism."""
    from speed_layer import run_worker

    run_worker(_settings())


@batch_app.command("runner")
def batch_runner(
    once: Annotated[bool, typer.Option(help="execute the runs due now, then exit")] = False,
    no_schedule: Annotated[bool, typer.Option(help="do not queue the scheduled runs")] = False,
) -> None:
    """Execute queued runs one at a time, and queue incremental runs on `batch.schedule`, at
    the CPU niceness `batch.nice`."""
    import logging

    from batch_layer import run_runner

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    settings = _settings()
    if os.getpriority(os.PRIO_PROCESS, 0) < settings.batch.nice:
        os.setpriority(os.PRIO_PROCESS, 0, settings.batch.nice)
    run_runner(settings, once=once, schedule=not no_schedule)


@batch_app.command("run")
def batch_run(
    mode: Annotated[
        RunModeOption, typer.Option(help="what to recompute")
    ] = RunModeOption.incremental,
    start: Annotated[str | None, typer.Option(help="range start (RFC 3339 or epoch ms)")] = None,
    end: Annotated[str | None, typer.Option(help="range end (RFC 3339 or epoch ms)")] = None,
) -> None:
    """Queue a run, then show its progress until it is done (executing it here when no
    runner is active)."""
    from lambdactl.batch_watch import watch_run
    from shared.db.runs import QueueFull, RangeRefused, RunRequest

    settings = _settings()
    try:
        request = RunRequest.operator(
            settings, mode.value, _time_option("start", start), _time_option("end", end)
        )
    except ValueError as exc:
        console.print(f"[red]{exc}[/red]")
        raise typer.Exit(2) from exc
    try:
        succeeded = watch_run(settings, request, console)
    except (RangeRefused, QueueFull) as exc:
        _print_error(exc)
        raise typer.Exit(1) from exc
    if not succeeded:
        raise typer.Exit(1)


def _time_option(name: str, text: str | None) -> int | None:
    from serving_layer.timefmt import parse_time

    if text is None:
        return None
    value = parse_time(text)
    if value is None:
        console.print(f"[red]--{name} {text!r}: send RFC 3339 with an offset or epoch ms[/red]")
        raise typer.Exit(2)
    return value


@app.command()
def serve(
    host: Annotated[str | None, typer.Option()] = None,
    port: Annotated[int | None, typer.Option()] = None,
    access_log: Annotated[bool, typer.Option(help="log every request")] = False,
    workers: Annotated[
        int | None,
        typer.Option(min=1, max=64, help="API processes on the port (default: serving.workers)"),
    ] = None,
    pg_port: Annotated[
        int | None,
        typer.Option(
            min=1, max=65535, help="also answer SQL in the PostgreSQL wire protocol on this port"
        ),
    ] = None,
) -> None:
    """Run the HTTP API (and dashboard) with uvicorn."""
    from serving_layer import run_server
    from serving_layer.auth import check_open_access

    if pg_port is not None:  # in the environment, so that every worker process reads it
        os.environ["LAMBDA_SERVING__PG_PORT"] = str(pg_port)
    settings = _settings()
    check_open_access(settings)
    run_server(settings, host, port, access_log, workers)


@app.command("produce")
def produce_events(
    events: Annotated[int, typer.Option(help="how many events")] = 10_000,
    minutes: Annotated[int, typer.Option(help="spread event times over the last N minutes")] = 60,
    late: Annotated[float, typer.Option(help="fraction of late events")] = 0.02,
    duplicates: Annotated[float, typer.Option(help="fraction of duplicated sends")] = 0.02,
    malformed: Annotated[float, typer.Option(help="fraction of malformed records")] = 0.0,
    seed: Annotated[int, typer.Option()] = 7,
    source: Annotated[str | None, typer.Option(help="source name (default: the first)")] = None,
) -> None:
    """Send sample pageview events (out of order, late, duplicated) to a source topic."""
    from lambdactl.generator import GeneratorSpec, generate, produce, sessions_on

    settings = _settings()
    chosen = settings.source(source) if source else settings.sources[0]
    now = int(time.time() * 1000)
    spec = GeneratorSpec(
        now - minutes * 60_000,
        now,
        events,
        late_fraction=late,
        duplicate_fraction=duplicates,
        malformed_fraction=malformed,
        seed=seed,
        keyed_by_user=sessions_on(settings, chosen),
    )
    sent = produce(settings.kafka, chosen.topic, generate(spec))
    console.print(f"sent {sent} records to {chosen.topic}")


@tables_app.command("load")
def load_table(
    table: Annotated[str, typer.Argument(help="the table's name in the config")],
    path: Annotated[Path, typer.Argument(help="a .csv (header row) or .jsonl file of versions")],
) -> None:
    """Send a table's versions from a file, checked first (a file with an invalid row is
    refused whole, naming its lines)."""
    from lambdactl.tables import load_table as load

    sent = load(_settings(), table, path)
    console.print(f"sent {sent} versions to table {table}")


@app.command()
def demo(
    history: Annotated[
        int, typer.Option(help="events of history to produce first, at --rate (3 h by default)")
    ] = 32_400,
    rate: Annotated[int, typer.Option(help="events per second, live and in the history")] = 3,
    batch_every: Annotated[float, typer.Option(help="seconds between batch runs")] = 300.0,
    duration: Annotated[float | None, typer.Option(help="stop after N seconds")] = None,
) -> None:
    """Stack up, history, a batch run, a speed worker, the API, and live events until Ctrl-C."""
    from lambdactl.demo import DemoOptions, run_demo

    stack_up(None)
    try:
        run_demo(_settings(), DemoOptions(history, rate, batch_every, duration), console)
    except KeyboardInterrupt:
        console.print("demo stopped; `lambdactl stack down` stops the services")


def main() -> None:
    try:
        app()
    except LambdaError as exc:
        _print_error(exc)
        raise SystemExit(2) from exc
