"""`lambdactl demo`: the whole platform on one machine — stack, history, a batch run, a speed
worker, the API, and live events flowing — until Ctrl-C (or `--duration`)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path

import httpx
from rich.console import Console

from lambdactl.generator import GeneratorSpec, generate, produce
from serving_layer.timefmt import format_time
from shared.config import Settings
from shared.errors import LambdaError

MINUTE = 60_000


@dataclass(frozen=True)
class DemoOptions:
    history_events: int = 30_000
    live_rate_per_s: int = 50
    batch_every_s: float = 300.0
    duration_s: float | None = None


def _spawn(args: list[str], log_name: str, settings: Settings) -> subprocess.Popen[bytes]:
    logs = settings.stack.data_dir / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    log = open(logs / log_name, "ab")  # noqa: SIM115 - the child owns it for its lifetime
    return subprocess.Popen(
        [sys.executable, "-m", "lambdactl", *args],
        stdout=log,
        stderr=subprocess.STDOUT,
        env=os.environ.copy(),
    )


def _wait_for_api(base: str, server: subprocess.Popen[bytes], log: Path) -> None:
    """Until the API answers; a server that exits (e.g. the port is taken) stops the demo."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if server.poll() is not None:
            tail = log.read_text(errors="replace").splitlines()[-5:]
            raise LambdaError("the API server exited:\n  " + "\n  ".join(tail))
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


def run_demo(settings: Settings, options: DemoOptions, console: Console) -> None:
    from lambdactl.batch_watch import watch_run
    from shared.db.connect import connect
    from shared.db.runs import RunRequest, queue_run

    source = settings.sources[0]
    bootstrap = settings.kafka.bootstrap_servers
    now = int(time.time() * 1000)
    console.print(f"producing {options.history_events} events of history (last 3 h)...")
    produce(
        bootstrap,
        source.topic,
        generate(
            GeneratorSpec(
                now - 180 * MINUTE,
                now - 5 * MINUTE,
                options.history_events,
                malformed_fraction=0.005,
                seed=now % 1000,
            )
        ),
    )
    base = f"http://{settings.serving.host}:{settings.serving.port}"
    with ExitStack() as processes:
        processes.callback(_stop, _spawn(["batch", "runner"], "batch-runner.log", settings))
        if not watch_run(settings, RunRequest("full"), console, execute_here=False):
            raise LambdaError("the first batch run failed; see .lambda/logs/batch-runner.log")
        processes.callback(_stop, _spawn(["speed"], "speed.log", settings))
        server = _spawn(["serve"], "serve.log", settings)
        processes.callback(_stop, server)
        _wait_for_api(base, server, settings.stack.data_dir / "logs" / "serve.log")
        metric = settings.metrics[0]
        key = "".join(f"&{d}=/" for d in metric.key)
        hour_ago = int(time.time() * 1000) // MINUTE * MINUTE - 60 * MINUTE
        console.print(
            f"\n[bold green]The platform is running.[/bold green]\n"
            f"  dashboard: {base}/\n  API docs:  {base}/docs\n"
            f"  sample:    curl '{base}/v1/metrics/{metric.name}/series?window=1m"
            f"&start={format_time(hour_ago)}&end={format_time(hour_ago + 120 * MINUTE)}{key}'\n"
            f"  logs:      {settings.stack.data_dir / 'logs'}\n"
            "Live events flow now; an incremental batch run is queued every "
            f"{options.batch_every_s:.0f} s. Ctrl-C stops the demo (the stack keeps running).\n",
            soft_wrap=True,
        )
        started = last_batch = time.monotonic()
        sequence = 0
        while options.duration_s is None or time.monotonic() - started < options.duration_s:
            tick = int(time.time() * 1000)
            sequence += 1
            produce(
                bootstrap,
                source.topic,
                generate(
                    GeneratorSpec(
                        tick - 1000,
                        tick,
                        options.live_rate_per_s,
                        disorder_ms=5_000,
                        seed=sequence * 7919 + now % 1000,
                    )
                ),
            )
            if time.monotonic() - last_batch >= options.batch_every_s:
                with connect(settings.postgres.url, autocommit=True) as conn:
                    run_id, _ = queue_run(conn, RunRequest("incremental"))
                console.print(f"queued incremental run {run_id}")
                last_batch = time.monotonic()
            time.sleep(max(0.0, 1.0 - (time.time() * 1000 - tick) / 1000))
