"""Batch layer benchmark: full recompute throughput Kafka → Spark → PostgreSQL, and the cost of
an incremental run for one new hour on top of 1x and 10x history (rule 7: cost follows new
data, not history).

    .venv/bin/python bench/batch.py --quick     # 1x = 100k, 10x = 1M events (~5 min)
    .venv/bin/python bench/batch.py             # 1x = 1M, 10x = 10M events
    .venv/bin/python bench/batch.py --events 10000000   # the same, by the full run's size
    .venv/bin/python bench/batch.py --malformed 0.005   # one record in 200 malformed (the soak's)

History is spread over 24 h of event time; the new hour holds 1/24 of the 1x history. Each run
executes in one Spark session started up front, so session start-up is not in any figure.
Ends with one line:
`BENCH batch events=<n> malformed=<fraction> events_per_s=<n> wall_s=<s> peak_rss_mb=<n>
incr_1x_s=<s> incr_10x_s=<s> incr_ratio=<r>` where events/wall/throughput are the full run
over the 10x history and peak RSS covers this process and its children (Spark's JVM, Python
workers); `broker_cpu_s` and `broker_rss_mb` are the local Kafka broker's CPU seconds and
peak RSS during that run.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import threading
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil
import psycopg
from psycopg import sql

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from batch_layer import execute_run, spark_session
from bench.broker_usage import BrokerUsage
from lambdactl.generator import GeneratorSpec, generate, produce
from lambdactl.stack import stack_up
from shared.config import Settings
from shared.db.connect import connect
from shared.db.migrate import upgrade
from shared.db.runs import RunRequest, queue_run
from shared.kafka import admin_client, create_topics
from tests.conftest import drop_database, platform_config

HOUR = 3_600_000
PYTHON_WORKER_IDLE_S = 65.0
"""Longer than Spark keeps an idle Python worker (one minute, `PythonWorkerFactory`)."""


class PeakRss(threading.Thread):
    """Samples the RSS of this process and all its descendants."""

    def __init__(self) -> None:
        super().__init__(daemon=True)
        self.peak = 0
        self.stop = threading.Event()

    def run(self) -> None:
        me = psutil.Process()
        while not self.stop.wait(0.25):
            total = 0
            for proc in [me, *me.children(recursive=True)]:
                with contextlib.suppress(psutil.Error):
                    total += proc.memory_info().rss
            self.peak = max(self.peak, total)


@dataclass
class World:
    settings: Settings
    dbname: str


def make_world(base: Settings, tag: str, quantiles: bool) -> World:
    dbname = f"lp_bench_{tag}"
    with psycopg.connect(base.postgres.url, autocommit=True) as admin:
        admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(dbname)))
    url = base.postgres.url.rpartition("/")[0] + f"/{dbname}"
    upgrade(url)
    config: dict[str, Any] = {
        **platform_config(tag, quantiles=quantiles),
        "kafka": {"bootstrap_servers": base.kafka.bootstrap_servers},
        "postgres": {"url": url},
        "spark": base.spark.model_dump(),
    }
    settings = Settings(**config)
    create_topics(settings)
    return World(settings, dbname)


def drop_world(base: Settings, world: World) -> None:
    try:
        drop_database(base.postgres.url, world.dbname)
    except psycopg.Error as exc:
        print(f"database {world.dbname} left behind ({exc}): drop it by hand", flush=True)
    source = world.settings.sources[0]
    topics = [source.topic, source.dlq_topic, source.late_topic]
    admin = admin_client(base)  # held until the deletions are done: its end cancels them
    for future in admin.delete_topics(topics, operation_timeout=30).values():
        future.result()


def fill(
    world: World, start_ms: int, end_ms: int, events: int, seed: int, malformed: float
) -> float:
    began = time.monotonic()
    spec = GeneratorSpec(
        start_ms, end_ms, events, duplicate_fraction=0.01, malformed_fraction=malformed, seed=seed
    )
    produce(world.settings.kafka.bootstrap_servers, world.settings.sources[0].topic, generate(spec))
    return time.monotonic() - began


def wait_for_autovacuum(base: Settings, dbname: str, limit_s: float = 600.0) -> float:
    """Wait until no autovacuum worker works in `dbname`; returns the wait. A full run's bulk
    load (10M ids) sets autovacuum going for tens of seconds: measured right after it, an
    incremental run would share the 2 cores with that one-off maintenance."""
    began, quiet = time.monotonic(), 0
    with psycopg.connect(base.postgres.url, autocommit=True) as admin:
        while quiet < 2 and time.monotonic() - began < limit_s:
            busy = admin.execute(
                "SELECT count(*) FROM pg_stat_activity "
                "WHERE backend_type = 'autovacuum worker' AND datname = %s",
                [dbname],
            ).fetchone()
            quiet = quiet + 1 if busy is not None and busy[0] == 0 else 0
            time.sleep(1.0)
    return time.monotonic() - began


def timed_run(world: World, spark: Any, mode: str) -> tuple[float, Any, BrokerUsage]:
    with connect(world.settings.postgres.url, autocommit=True) as conn:
        run_id, _ = queue_run(conn, RunRequest(mode))  # type: ignore[arg-type]
    with BrokerUsage() as broker:
        began = time.monotonic()
        summary = execute_run(world.settings, spark, run_id)
        wall = time.monotonic() - began
    return wall, summary, broker


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="1x = 100k, 10x = 1M events")
    sizes = parser.add_mutually_exclusive_group()
    sizes.add_argument("--history", type=int, help="events of the 1x history (default 1M)")
    sizes.add_argument(
        "--events",
        type=int,
        help="events of the measured full run (the 10x history), e.g. 10000000; 1x = a tenth",
    )
    parser.add_argument(
        "--no-quantiles",
        action="store_true",
        help="the demo metrics without quantiles(latency_ms) (as measured before it existed)",
    )
    parser.add_argument(
        "--malformed",
        type=float,
        default=0.0,
        help="fraction of malformed records (0; the soak and the demo produce 0.005)",
    )
    args = parser.parse_args()
    one_x = args.history or (args.events // 10 if args.events else 0)
    one_x = one_x or (100_000 if args.quick else 1_000_000)
    base = Settings()
    stack_up(base)
    tag = uuid.uuid4().hex[:8]
    print(f"load average {os.getloadavg()}, cpus {os.cpu_count()}", flush=True)
    started = time.monotonic()
    spark = spark_session(base)
    print(f"spark session start-up {time.monotonic() - started:.1f} s (not counted)", flush=True)
    now = int(time.time() * 1000) // HOUR * HOUR
    worlds = [make_world(base, f"{tag}x{n}", not args.no_quantiles) for n in (1, 10)]
    rss = PeakRss()
    rss.start()
    try:
        results: dict[str, float] = {}
        for world, factor in zip(worlds, (1, 10), strict=True):
            events = one_x * factor
            took = fill(world, now - 25 * HOUR, now - HOUR, events, factor, args.malformed)
            print(f"{factor}x: produced {events} events in {took:.1f} s", flush=True)
            wall, summary, broker = timed_run(world, spark, "full")
            print(
                f"{factor}x: full run {wall:.1f} s, {summary.rows_in / wall:,.0f} events/s, "
                f"{summary.rows_out} cells, {broker.figures()}, phases {summary.timings}",
                flush=True,
            )
            full_broker = broker
            results[f"full_{factor}x_s"] = wall
            results[f"full_{factor}x_events"] = summary.rows_in
            full_ended = time.monotonic()
            fill(world, now - HOUR, now, one_x // 24, 100 + factor, args.malformed)
            waited = wait_for_autovacuum(base, world.dbname)
            # Spark ends Python workers idle for a minute: an hourly run always starts them,
            # and so does each measured incremental run (else only the one that waited
            # longer for autovacuum would pay ~1.5 s for it).
            time.sleep(max(0.0, PYTHON_WORKER_IDLE_S - (time.monotonic() - full_ended)))
            print(
                f"{factor}x: autovacuum idle after {waited:.0f} s; incremental run "
                f"{time.monotonic() - full_ended:.0f} s after the full run",
                flush=True,
            )
            wall, summary, _ = timed_run(world, spark, "incremental")
            assert summary.mode == "incremental"
            print(
                f"{factor}x: incremental run for one new hour ({summary.rows_in} events) "
                f"{wall:.1f} s, phases {summary.timings}",
                flush=True,
            )
            results[f"incr_{factor}x_s"] = wall
        events = int(results["full_10x_events"])
        wall = results["full_10x_s"]
        print(
            f"BENCH batch events={events} malformed={args.malformed:g} "
            f"events_per_s={events / wall:.0f} wall_s={wall:.1f} "
            f"peak_rss_mb={rss.peak / 2**20:.0f} incr_1x_s={results['incr_1x_s']:.2f} "
            f"incr_10x_s={results['incr_10x_s']:.2f} "
            f"incr_ratio={results['incr_10x_s'] / results['incr_1x_s']:.2f} "
            f"{full_broker.figures()}",
            flush=True,
        )
    finally:
        rss.stop.set()
        rss.join()
        spark.stop()
        for world in worlds:
            drop_world(base, world)


if __name__ == "__main__":
    main()
