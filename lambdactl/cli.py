"""`lambdactl`: stack, topics, db, speed, batch, serve, produce, demo."""

from __future__ import annotations

import time
from typing import Annotated

import typer
from rich.console import Console

from lambdactl import stack
from shared.config import Settings, load_settings
from shared.errors import LambdaError

app = typer.Typer(
    help="Lambda platform: speed (Faust/Redis), batch (Spark/PostgreSQL), serving.",
    no_args_is_help=True,
)
stack_app = typer.Typer(help="The local stack: Kafka-protocol broker, Redis, PostgreSQL.")
topics_app = typer.Typer(help="Source, .dlq and .late topics.")
db_app = typer.Typer(help="The PostgreSQL schema.")
batch_app = typer.Typer(help="Batch recomputes.")
app.add_typer(stack_app, name="stack")
app.add_typer(topics_app, name="topics")
app.add_typer(db_app, name="db")
app.add_typer(batch_app, name="batch")
console = Console()


def _settings() -> Settings:
    try:
        return load_settings()
    except LambdaError as exc:
        console.print(f"[red]{exc}[/red]")
        raise typer.Exit(2) from exc


@stack_app.command("up")
def stack_up() -> None:
    """Start what is not already reachable, then apply the schema and create the topics."""
    settings = _settings()
    console.print(stack.render_states(stack.stack_up(settings)))
    db_upgrade()
    topics_create()


@stack_app.command("down")
def stack_down() -> None:
    """Stop what `stack up` started (data stays)."""
    console.print(stack.render_states(stack.stack_down(_settings())))


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


@batch_app.command("run")
def batch_run(
    mode: Annotated[str, typer.Option(help="full (incremental and range: see the batch issue)")] = (
        "full"
    ),
) -> None:
    """Queue a run and execute it here, showing progress until done."""
    if mode != "full":
        console.print("[red]only --mode full is available so far[/red]")
        raise typer.Exit(2)
    from batch_layer import run_full, spark_session
    from shared.db.connect import connect
    from shared.db.runs import RunRequest, queue_run

    settings = _settings()
    with connect(settings.postgres.url, autocommit=True) as conn:
        run_id = queue_run(conn, RunRequest("full"))[0]
    started = time.monotonic()
    with console.status(f"batch run {run_id} ({mode}) running..."):
        summary = run_full(settings, spark_session(settings), run_id)
    console.print(
        f"run {run_id} succeeded in {time.monotonic() - started:.1f}s: generation "
        f"{summary.generation}, {summary.rows_in} records in, {summary.rows_out} cells out, "
        f"{summary.malformed} malformed, W = {summary.watermarks}"
    )


@app.command()
def serve(
    host: Annotated[str | None, typer.Option()] = None,
    port: Annotated[int | None, typer.Option()] = None,
) -> None:
    """Run the HTTP API (and dashboard) with uvicorn."""
    import uvicorn

    from serving_layer import create_app

    settings = _settings()
    uvicorn.run(
        create_app(settings),
        host=host or settings.serving.host,
        port=port or settings.serving.port,
        log_level="info",
    )


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
    from lambdactl.generator import GeneratorSpec, generate, produce

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
    )
    sent = produce(settings.kafka.bootstrap_servers, chosen.topic, generate(spec))
    console.print(f"sent {sent} records to {chosen.topic}")


@app.command()
def demo(
    history: Annotated[int, typer.Option(help="events of history to produce first")] = 30_000,
    rate: Annotated[int, typer.Option(help="live events per second")] = 50,
    batch_every: Annotated[float, typer.Option(help="seconds between batch runs")] = 300.0,
    duration: Annotated[float | None, typer.Option(help="stop after N seconds")] = None,
) -> None:
    """Stack up, history, a batch run, a speed worker, the API, and live events until Ctrl-C."""
    from lambdactl.demo import DemoOptions, run_demo

    stack_up()
    try:
        run_demo(_settings(), DemoOptions(history, rate, batch_every, duration), console)
    except KeyboardInterrupt:
        console.print("demo stopped; `lambdactl stack down` stops the services")


def main() -> None:
    try:
        app()
    except LambdaError as exc:
        console.print(f"[red]{exc}[/red]")
        raise SystemExit(2) from exc
