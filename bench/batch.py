"""Batch layer benchmark: full recompute throughput Kafka → Spark → PostgreSQL, and the cost of
an incremental run for one new hour on top of 1x and 10x history (rule 7: cost follows new
data, not history); optionally beside plain Spark jobs over the same data (`--peers`), with
the metrics' inputs defined by expressions (`--expressions`) and with a metric joined with a
lookup table (`--lookups`) or with a session metric beside them (`--sessions`).

    .venv/bin/python bench/batch.py --quick     # 1x = 100k, 10x = 1M events (~6 min)
    .venv/bin/python bench/batch.py             # 1x = 1M, 10x = 10M events
    .venv/bin/python bench/batch.py --events 10000000   # the same, by the full run's size
    .venv/bin/python bench/batch.py --malformed 0.005   # one record in 200 malformed (the soak's)
    .venv/bin/python bench/batch.py --quick --peers --expressions   # ~15 min
    .venv/bin/python bench/batch.py --quick --lookups --expressions   # ~10 min
    .venv/bin/python bench/batch.py --events 10000000 --sessions   # ~20 min

History is spread over 24 h of event time; the new hour holds 1/24 of the 1x history. Each run
executes in one Spark session started up front, so session start-up is not in any figure.
Every measured run starts as a scheduled run does: with Spark's Python workers ended (Spark
ends them 60-70 s idle; the bench waits 75 s after the last Spark work; starting them again
costs a run several seconds) and with no autovacuum worker busy in its database after the
previous run's bulk load. Nothing is cached between runs: a run persists its decoded records
and unpersists them before it returns.

Ends with one line:
`BENCH batch events=<n> malformed=<fraction> events_per_s=<n> wall_s=<s> peak_rss_mb=<n>
incr_1x_s=<s> incr_10x_s=<s> incr_ratio=<r>` where events/wall/throughput are the full run
over the 10x history and peak RSS covers this process and its children (Spark's JVM, Python
workers); `broker_cpu_s` and `broker_rss_mb` are the local Kafka broker's CPU seconds and peak
RSS during that run, `cpu_s` the CPU seconds this process and its descendants (Spark's JVM,
its Python workers; not PostgreSQL, not the broker) used in it: less sensitive than wall time
to other work on the machine. Then `stage_<name>_s=<s>` break that run's wall time down
(`bench.spark_jobs.run_stages`: snapshot, plan, read_decode, rebuild_index, dedup, cells,
publish, other; they add up to `wall_s`), measured from outside the run: its Spark jobs in
Spark's status store and its own phase timings.

`--peers`: right after the 10x full run, the same session runs two plain Spark jobs of
`bench.plain_spark` over the same topic up to the full run's snapshot, one after the other,
each under the same conditions as that run (a warm JVM from the 1x runs, the topic just
written, Python workers ended, no autovacuum busy) and sharing no cache with it or each other
(nothing is persisted; the full run unpersists its records). The same Spark data source
(`lambda_kafka`) reads and decodes the records; every metric's cells of every window are
grouped by metric, window and key with the same count/sum/min/max and the same HLL and KLL
sketches, and written to Parquet in a temporary directory. Neither de-duplicates (every copy
counts), keeps an id table, finds W or a rebuild index, collects the cells to the driver or
publishes anything (no PostgreSQL, no atomic generation, no run log). They cover the bench's
metrics (two, several windows each; no rollups, no `where`). `plain_spark` is the peer: each
window's cells straight from the events, as a user writes it, planned by Spark (partial
aggregation, then a merge); `batch_plan` is the batch layer's own cells plan (base cells
shuffled by start with no partial aggregation, rolled up into every window) with nothing
around it. They run after the full run so that it is measured exactly as without `--peers`.
Adds, per job `<p>` (`plain_spark`, `batch_plan`): `<p>_per_s=<n>` (the full run's records
over the job's wall time), `<p>_wall_s`, `<p>_cells`, `vs_<p>=<r>` (the full run's events/s
over the job's: below 1, the full run is slower), `<p>_cpu_s` and `vs_<p>_cpu` (the job's CPU
seconds over the full run's: below 1, the full run uses more CPU), and the job's stages
`<p>_read_s` (its first Spark job: the Kafka read, the decode and all before the first
shuffle), `<p>_shuffled_s` (its other jobs: all after the first shuffle, the Parquet write
included) and `<p>_driver_s` (planning the read and the query, committing the output).

`--expressions`: then a second full run over the same topic (a database of its own, so the
10x world's incremental run still follows its own full run) with the metrics extended by
rule 10's definitions: every metric gets `where: "latency_ms >= 0 AND page <> '/nope'"`
(keeps every event), and the per-page metric computed fields `section` (the pages `/page/<n>`
as one section `pages`) and `latency_s` used as its key and value. Adds `expr_events_per_s=<n>`
and `expr_ratio=<r>` (its events/s over the full run's), `expr_cpu_s` and `expr_cpu_ratio`
(the full run's CPU seconds over its own), and its stages on a line of their own. Should that
run fail, the bench prints the traceback, reports `failed` for those fields and goes on.

`--lookups`: likewise a full run over the same topic in a database of its own, after the
expressions' run if any, with the table `pages` (topic `pages-<tag>x10l`, one partition) and the
per-page metric joined with it (`with_lookups`: `lookups: [{table: pages, on: page, as: p}]`,
keyed by `section: COALESCE(p.section, 'none')`, its value and aggregations kept; rule 11). The
table is produced before any measured run (`table_records`): K keys (`--table-keys`, default
100,000 whatever `--quick`: the generator's pages, which the events join, then filler pages) x V
versions (`--table-versions`, default 3), each version of a key with another `section`; a key's
first version valid from a day before the history, the others spread over the history's 24 h
(version `v` at a point of its own in the `v`-th of V-1 equal spans), so the events of a page
join different versions. Adds `lookup_events_per_s=<n>`, `lookup_ratio=<r>` (over the full
run's events/s), `lookup_cpu_s` and `lookup_cpu_ratio` (the full run's CPU seconds over its
own), and its stages (the join is planned into the first action: its time is in
`read_decode`, with the table's read), Spark actions and Spark jobs on lines of their own;
`failed` as above. Like the expressions' run, its metric has fewer keys (sections, not
pages), so fewer cells than the full run's: its `cells` and `publish` stages are shorter.

`--sessions`: likewise a full run over the same topic in a database of its own, with the
bench's metrics and a session metric beside them (`SESSION_METRIC`: sessions per user, gap
30m, cut at 4h, rule 13): every event is read for it too, sessionized per user and stored as
its cells, its parts' cells and one cell per session. Adds `sessions_events_per_s=<n>`,
`sessions_ratio=<r>` (over the full run's events/s; #29 asks at least 0.6), `sessions_cpu_s`,
`sessions_cpu_ratio` and its stages, as above.

`--horizon`: likewise a full run over the same topic in a database of its own, with the
source's `dedup_horizon: 7d` (rule 4: ids per partition, judged against each partition's
stream time, remembered in day tables; the history's 24 h all lie within it, so every id is
remembered), and after the 10x world's incremental run, that world's incremental run over the
same new hour. Adds `horizon_events_per_s=<n>`, `horizon_ratio=<r>` (over the full run's
events/s), `horizon_cpu_s`, `horizon_cpu_ratio`, `horizon_incr_s` and `horizon_incr_ratio`
(its incremental run's wall time over the 10x world's: above 1, slower).
"""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import shutil
import sys
import tempfile
import threading
import time
import traceback
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
import psutil
import psycopg
from confluent_kafka import KafkaError, KafkaException
from psycopg import sql

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from batch_layer import RunSummary, execute_run, spark_session
from bench.broker_usage import BrokerUsage
from bench.common import SESSION_METRIC
from bench.plain_spark import PlainRun, cells_written, run_plain
from bench.spark_jobs import Job, describe, fields, jobs_of_group, run_stages
from lambdactl.generator import PAGES, GeneratorSpec, SampleRecord, generate, produce
from lambdactl.stack import stack_up
from shared.config import Settings
from shared.db.connect import connect
from shared.db.migrate import upgrade
from shared.db.runs import RunRequest, queue_run
from shared.kafka import admin_client, create_topics
from shared.windows import window_start
from tests.conftest import drop_database, platform_config

HOUR = 3_600_000
PYTHON_WORKER_IDLE_S = 75.0
"""Longer than Spark keeps an idle Python worker: `PythonWorkerFactory` ends them once a minute
has passed since the last one was released, checked every 10 s (so 60-70 s after it: a wait of
65 s may find them still running)."""

EXPR_WHERE = "latency_ms >= 0 AND page <> '/nope'"
"""`--expressions`: every metric's filter (every generated event passes it)."""
EXPR_FIELDS = {
    "section": "CASE WHEN page LIKE '/page/%' THEN 'pages' ELSE page END",
    "latency_s": "latency_ms / 1000",
}
"""`--expressions`: the per-page metric's computed fields, its key and its value."""


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


class TreeCpu:
    """`with TreeCpu() as cpu: ...` then `cpu.seconds`: the CPU seconds this process and its
    descendants (Spark's JVM, its Python workers) used in the block, the reaped children's
    included. Less sensitive than wall time to other work on the machine; PostgreSQL's and the
    broker's CPU are not in it."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self._start: dict[tuple[int, float], float] = {}

    def __enter__(self) -> TreeCpu:
        self._start = _tree_cpu()
        return self

    def __exit__(self, *exc: object) -> None:
        end = _tree_cpu()
        self.seconds = sum(cpu - self._start.get(key, 0.0) for key, cpu in end.items())


def _tree_cpu() -> dict[tuple[int, float], float]:
    """(pid, creation time) -> CPU seconds, its reaped children's included, of this process and
    each descendant."""
    me = psutil.Process()
    seconds = {}
    for proc in [me, *me.children(recursive=True)]:
        with contextlib.suppress(psutil.Error):
            t = proc.cpu_times()
            key = (proc.pid, proc.create_time())
            seconds[key] = t.user + t.system + t.children_user + t.children_system
    return seconds


@dataclass
class World:
    settings: Settings
    dbname: str
    owns_topics: bool = True
    """Whether dropping the world deletes its source's topics (a world reading another's does
    not; its tables' topics are its own either way)."""


def with_expressions(config: dict[str, Any]) -> dict[str, Any]:
    """The platform config with its metrics' inputs defined by expressions (rule 10): every
    metric filtered by `EXPR_WHERE`; a keyed metric with a value keyed by `section` and valued
    by `latency_s` (`EXPR_FIELDS`)."""
    metrics = []
    for metric in config["metrics"]:
        metric = {**metric, "where": EXPR_WHERE}
        if metric.get("key") and metric.get("value"):
            metric.update(fields=dict(EXPR_FIELDS), key=["section"], value="latency_s")
        metrics.append(metric)
    return {**config, "metrics": metrics}


LOOKUP = {
    "lookups": [{"table": "pages", "on": "page", "as": "p"}],
    "fields": {"section": "COALESCE(p.section, 'none')"},
    "key": ["section"],
}
"""`--lookups`: the per-page metric's join with the table and the key it reads from it."""
SECTIONS = ["news", "sport", "tech", "culture", "business", "travel", "science", "opinion"]


def with_lookups(config: dict[str, Any], table_topic: str) -> dict[str, Any]:
    """The platform config with the table `pages` (topic `table_topic`) and the per-page
    metric joined with it (rule 11), keyed by the joined version's section (`LOOKUP`), its
    value and aggregations kept."""
    table = {
        "name": "pages",
        "topic": table_topic,
        "key_field": "page",
        "time_field": "valid_from",
        "partitions": 1,
    }
    metrics = [
        {**metric, **LOOKUP} if metric["name"] == "views_by_page" else metric
        for metric in config["metrics"]
    ]
    return {**config, "tables": [table], "metrics": metrics}


def table_records(
    keys: int, versions: int, valid_from: Callable[[int, int], int]
) -> Iterator[SampleRecord]:
    """`--lookups`: the table: `keys` keys, the generator's pages (the keys events join) then
    filler pages `/page/<n>` no event reads; every key's first version, then every key's
    second, and so on, version `v` of key `i` valid from `valid_from(i, v)`, each version of a
    key with another section."""
    for version in range(versions):
        for i in range(keys):
            page = table_page(i)
            value = {
                "page": page,
                "section": SECTIONS[(i + version) % len(SECTIONS)],
                "title": f"Page {i}, revision {version}",
                "valid_from": valid_from(i, version),
            }
            yield SampleRecord(page.encode(), orjson.dumps(value))


def table_page(i: int) -> str:
    """`--lookups`: key `i` of the table: the generator's pages, then filler pages."""
    return PAGES[i] if i < len(PAGES) else f"/page/{i - len(PAGES) + 40}"


def table_valid_from(start_ms: int, end_ms: int, versions: int) -> Callable[[int, int], int]:
    """`--lookups`: when version `v` of key `i` is valid from: the first a day before
    `start_ms` (so every event joins a version), the others spread over [start, end) in as
    many equal spans, each key's at a point of its own in its span (a multiplicative hash)."""
    span = (end_ms - start_ms) // max(versions - 1, 1)

    def valid_from(i: int, v: int) -> int:
        if v == 0:
            return start_ms - 24 * HOUR
        spot = (i * 2_654_435_761 + v * 40_503) % 2**32
        return start_ms + (v - 1) * span + spot * span // 2**32

    return valid_from


def make_world(
    base: Settings,
    tag: str,
    quantiles: bool,
    *,
    topic_of: str | None = None,
    expressions: bool = False,
    lookups: bool = False,
    sessions: bool = False,
    horizon: str | None = None,
) -> World:
    """A database of its own and the topics of `tag`, or those of the world `topic_of` (tag);
    `lookups`: and the table topic `pages-<tag>` (`with_lookups`); `sessions`: with
    `SESSION_METRIC` too; `horizon`: the source's `dedup_horizon`."""
    dbname = f"lp_bench_{tag}"
    with psycopg.connect(base.postgres.url, autocommit=True) as admin:
        admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(dbname)))
    url = base.postgres.url.rpartition("/")[0] + f"/{dbname}"
    upgrade(url)
    platform = platform_config(topic_of or tag, quantiles=quantiles)
    if expressions:
        platform = with_expressions(platform)
    if lookups:
        platform = with_lookups(platform, f"pages-{tag}")
    if sessions:
        platform = {**platform, "metrics": [*platform["metrics"], SESSION_METRIC]}
    if horizon is not None:
        platform = {
            **platform,
            "sources": [{**source, "dedup_horizon": horizon} for source in platform["sources"]],
        }
    config: dict[str, Any] = {
        **platform,
        "kafka": {"bootstrap_servers": base.kafka.bootstrap_servers},
        "postgres": {"url": url},
        "spark": base.spark.model_dump(),
    }
    settings = Settings(**config)
    create_topics(settings)
    return World(settings, dbname, owns_topics=topic_of is None)


def drop_world(base: Settings, world: World) -> None:
    try:
        drop_database(base.postgres.url, world.dbname)
    except psycopg.Error as exc:
        print(f"database {world.dbname} left behind ({exc}): drop it by hand", flush=True)
    topics = [t for table in world.settings.tables for t in (table.topic, table.dlq_topic)]
    if world.owns_topics:
        source = world.settings.sources[0]
        topics += [source.topic, source.dlq_topic, source.late_topic]
    if not topics:
        return
    admin = admin_client(base)  # held until the deletions are done: its end cancels them
    for topic, future in admin.delete_topics(topics, operation_timeout=30).items():
        try:
            future.result()
        except KafkaException as exc:  # the other worlds are dropped all the same
            error = exc.args[0] if exc.args else None
            if isinstance(error, KafkaError) and error.code() == KafkaError.UNKNOWN_TOPIC_OR_PART:
                continue  # gone already
            print(f"topic {topic} left behind ({exc}): delete it by hand", flush=True)


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


def python_workers_ended(spark_done: float | None) -> float:
    """Sleep until Spark has ended its Python workers, idle since `spark_done` (monotonic; None:
    none ever started); returns the sleep. Spark ends a worker idle for a minute: an hourly
    run always starts them, and so does each measured run (else a run that followed another
    closely would save the start-up that the others pay)."""
    if spark_done is None:
        return 0.0
    pause = max(0.0, PYTHON_WORKER_IDLE_S - (time.monotonic() - spark_done))
    time.sleep(pause)
    return pause


@dataclass
class Timed:
    wall_s: float
    summary: RunSummary
    broker: BrokerUsage
    started: float
    """When `execute_run` was called (epoch seconds)."""
    stages: dict[str, float]
    jobs: str
    """The run's Spark actions, for the log."""
    spans: str
    """The run's Spark jobs one by one, for the log (`job_spans`)."""
    cpu_s: float
    """CPU seconds of this process and its descendants during the run (`TreeCpu`)."""


def timed_run(world: World, spark: Any, mode: str) -> Timed:
    with connect(world.settings.postgres.url, autocommit=True) as conn:
        run_id, _ = queue_run(conn, RunRequest(mode))  # type: ignore[arg-type]
    with BrokerUsage() as broker, TreeCpu() as cpu:
        started, began = time.time(), time.monotonic()
        summary = execute_run(world.settings, spark, run_id)
        wall = time.monotonic() - began
    jobs = jobs_of_group(spark, f"lambda-batch-run-{run_id}", started)
    return Timed(
        wall,
        summary,
        broker,
        started,
        run_stages(jobs, started, wall, summary.timings),
        describe(jobs, started),
        job_spans(jobs, started),
        cpu.seconds,
    )


def incremental_run(world: World, spark: Any, label: str, what: str) -> Timed:
    """An incremental run of `world` for the new hour, printed under `label` (`what`: what
    the run is with)."""
    run = timed_run(world, spark, "incremental")
    assert run.summary.mode == "incremental"
    print(
        f"{label}: incremental run{what} for one new hour ({run.summary.rows_in} events) "
        f"{run.wall_s:.1f} s, phases {run.summary.timings}",
        flush=True,
    )
    return run


def job_spans(jobs: list[Job], since: float) -> str:
    """Each Spark job's span (seconds after `since`) and summed task time, for the log."""
    return ", ".join(
        f"job {j.job_id} {j.submitted - since:.1f}-{j.completed - since:.1f} s "
        f"(tasks {j.task_s:.1f} s)"
        for j in jobs
    )


def plain_stages(spark: Any, run: PlainRun) -> tuple[dict[str, float], str]:
    """A plain job's wall time by stage and its jobs, for the log: `read` (its first job: the
    Kafka read, the decode and everything before the first shuffle), `shuffled` (its other
    jobs: everything after the first shuffle, the Parquet write included) and `driver` (the
    rest: planning the read and the query, committing the output)."""
    jobs = jobs_of_group(spark, run.group, run.started)
    if not jobs:
        return {"driver": run.wall_s}, ""
    first, last = jobs[0], max(jobs, key=lambda j: j.completed)
    stages = {
        "read": first.completed - first.submitted,
        "shuffled": last.completed - first.completed,
        "driver": run.wall_s - (last.completed - first.submitted),
    }
    return stages, job_spans(jobs, run.started)


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
    parser.add_argument(
        "--peers",
        action="store_true",
        help="also run a plain Spark job over the 10x history (bench/plain_spark.py)",
    )
    parser.add_argument(
        "--expressions",
        action="store_true",
        help="also a full run over the 10x history with `where` and computed fields (rule 10)",
    )
    parser.add_argument(
        "--lookups",
        action="store_true",
        help="also a full run over the 10x history with a metric joined with a table (rule 11)",
    )
    parser.add_argument(
        "--sessions",
        action="store_true",
        help="also a full run over the 10x history with a session metric beside (rule 13)",
    )
    parser.add_argument(
        "--horizon",
        action="store_true",
        help="also full and incremental runs over the 10x history with a 7d dedup_horizon",
    )
    parser.add_argument(
        "--table-keys", type=int, default=100_000, help="--lookups' table size (keys)"
    )
    parser.add_argument("--table-versions", type=int, default=3, help="--lookups' versions per key")
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
    expr_world = lookup_world = session_world = horizon_world = None
    if args.expressions:
        expr_world = make_world(
            base, f"{tag}x10e", not args.no_quantiles, topic_of=f"{tag}x10", expressions=True
        )
        worlds.append(expr_world)
    if args.lookups:
        lookup_world = make_world(
            base, f"{tag}x10l", not args.no_quantiles, topic_of=f"{tag}x10", lookups=True
        )
        worlds.append(lookup_world)
    if args.sessions:
        session_world = make_world(
            base, f"{tag}x10s", not args.no_quantiles, topic_of=f"{tag}x10", sessions=True
        )
        worlds.append(session_world)
    if args.horizon:
        horizon_world = make_world(
            base, f"{tag}x10h", not args.no_quantiles, topic_of=f"{tag}x10", horizon="7d"
        )
        worlds.append(horizon_world)
    parquet = tempfile.mkdtemp(prefix="lambda-bench-plain-")
    rss = PeakRss()
    rss.start()
    spark_done: float | None = None
    try:
        if lookup_world is not None:
            took, records = fill_table(
                lookup_world, now - 25 * HOUR, now - HOUR, args.table_keys, args.table_versions
            )
            print(
                f"table: produced {records} records ({args.table_keys} keys x "
                f"{args.table_versions} versions) in {took:.1f} s",
                flush=True,
            )
        results: dict[str, float] = {}
        extra: list[str] = []
        full: Timed | None = None
        for world, factor in zip(worlds, (1, 10), strict=False):
            events = one_x * factor
            took = fill(world, now - 25 * HOUR, now - HOUR, events, factor, args.malformed)
            print(f"{factor}x: produced {events} events in {took:.1f} s", flush=True)
            python_workers_ended(spark_done)
            run = timed_run(world, spark, "full")
            spark_done = time.monotonic()
            summary, wall = run.summary, run.wall_s
            print(
                f"{factor}x: full run {wall:.1f} s, {summary.rows_in / wall:,.0f} events/s, "
                f"{summary.rows_out} cells, {run.broker.figures()}, CPU {run.cpu_s:.1f} s, "
                f"phases {summary.timings}",
                flush=True,
            )
            print(f"{factor}x: full run stages {fields(run.stages)}", flush=True)
            print(f"{factor}x: full run Spark actions: {run.jobs}", flush=True)
            results[f"full_{factor}x_s"] = wall
            results[f"full_{factor}x_events"] = summary.rows_in
            settle = [world.dbname]  # the databases the incremental run waits autovacuum out in
            if factor == 10:
                full = run
                if args.peers:
                    for plan, prefix in (("plain", "plain_spark"), ("batch_plan", "batch_plan")):
                        extra.append(
                            peer(spark, base, world, full, parquet, spark_done, plan, prefix)
                        )
                        spark_done = time.monotonic()
                if expr_world is not None:
                    wait_for_autovacuum(base, world.dbname)
                    python_workers_ended(spark_done)
                    extra.append(
                        variant_run(spark, expr_world, full, "expr", "with expressions")[0]
                    )
                    spark_done = time.monotonic()
                    settle.append(expr_world.dbname)
                if lookup_world is not None:
                    for dbname in settle:
                        wait_for_autovacuum(base, dbname)
                    python_workers_ended(spark_done)
                    figures, lookup = variant_run(
                        spark, lookup_world, full, "lookup", "with a lookup"
                    )
                    extra.append(figures)
                    spark_done = time.monotonic()
                    if lookup is not None:
                        wait_for_autovacuum(base, lookup_world.dbname)
                        python_workers_ended(spark_done)
                        extra.append(
                            correction_run(
                                spark,
                                lookup_world,
                                lookup,
                                now - 25 * HOUR,
                                now - HOUR,
                                args.table_keys,
                            )
                        )
                        spark_done = time.monotonic()
                    settle.append(lookup_world.dbname)
                simple = (
                    (session_world, "sessions", "with a session metric"),
                    (horizon_world, "horizon", "with a de-dup horizon"),
                )
                for variant, prefix, what in simple:
                    if variant is None:
                        continue
                    for dbname in settle:
                        wait_for_autovacuum(base, dbname)
                    python_workers_ended(spark_done)
                    extra.append(variant_run(spark, variant, full, prefix, what)[0])
                    spark_done = time.monotonic()
                    settle.append(variant.dbname)
            fill(world, now - HOUR, now, one_x // 24, 100 + factor, args.malformed)
            waited = sum(wait_for_autovacuum(base, db) for db in settle)
            python_workers_ended(spark_done)
            print(
                f"{factor}x: autovacuum idle after {waited:.0f} s; incremental run "
                f"{time.monotonic() - spark_done:.0f} s after the last Spark work",
                flush=True,
            )
            incr = incremental_run(world, spark, f"{factor}x", "")
            spark_done = time.monotonic()
            results[f"incr_{factor}x_s"] = incr.wall_s
            if factor == 10 and horizon_world is not None:
                wait_for_autovacuum(base, horizon_world.dbname)
                python_workers_ended(spark_done)
                horizon_incr = incremental_run(
                    horizon_world, spark, "10x", " with a de-dup horizon"
                )
                spark_done = time.monotonic()
                extra.append(
                    f"horizon_incr_s={horizon_incr.wall_s:.2f} "
                    f"horizon_incr_ratio={horizon_incr.wall_s / incr.wall_s:.2f}"
                )
        assert full is not None
        events = int(results["full_10x_events"])
        wall = results["full_10x_s"]
        print(
            f"BENCH batch events={events} malformed={args.malformed:g} "
            f"events_per_s={events / wall:.0f} wall_s={wall:.1f} "
            f"peak_rss_mb={rss.peak / 2**20:.0f} incr_1x_s={results['incr_1x_s']:.2f} "
            f"incr_10x_s={results['incr_10x_s']:.2f} "
            f"incr_ratio={results['incr_10x_s'] / results['incr_1x_s']:.2f} "
            f"{full.broker.figures()} cpu_s={full.cpu_s:.1f} {fields(full.stages)} "
            f"{' '.join(extra)}".rstrip(),
            flush=True,
        )
    finally:
        rss.stop.set()
        rss.join()
        spark.stop()
        shutil.rmtree(parquet, ignore_errors=True)
        for world in reversed(worlds):
            drop_world(base, world)


def peer(
    spark: Any,
    base: Settings,
    world: World,
    full: Timed,
    parquet: str,
    spark_done: float,
    plan: str,
    prefix: str,
) -> str:
    """Run the plain Spark job of `plan` (`bench.plain_spark.PLANS`) over what the full run
    `full` read; its BENCH fields, named by `prefix`."""
    wait_for_autovacuum(base, world.dbname)
    python_workers_ended(spark_done)
    source = world.settings.sources[0]
    ends = {int(p): o for p, o in full.summary.snapshot[source.topic].items()}
    group = f"bench-{prefix}-{uuid.uuid4()}"
    with TreeCpu() as cpu:
        run = run_plain(spark, world.settings, source, ends, parquet, group, plan)
    events = full.summary.rows_in
    stages, jobs = plain_stages(spark, run)
    cells = cells_written(spark, parquet)
    print(
        f"10x: {prefix} ({plan} plan) {run.wall_s:.1f} s, {events / run.wall_s:,.0f} events/s, "
        f"{cells} cells (no de-dup), CPU {cpu.seconds:.1f} s, stages {fields(stages, prefix)}; "
        f"{jobs}",
        flush=True,
    )
    full_rate, rate = events / full.wall_s, events / run.wall_s
    return (
        f"{prefix}_per_s={rate:.0f} {prefix}_wall_s={run.wall_s:.1f} {prefix}_cells={cells} "
        f"vs_{prefix}={full_rate / rate:.2f} {prefix}_cpu_s={cpu.seconds:.1f} "
        f"vs_{prefix}_cpu={cpu.seconds / full.cpu_s:.2f} {fields(stages, prefix)}"
    )


def fill_table(
    world: World, start_ms: int, end_ms: int, keys: int, versions: int
) -> tuple[float, int]:
    """Produce `world`'s table (`table_records`, valid from `table_valid_from`): (seconds,
    records)."""
    began = time.monotonic()
    records = table_records(keys, versions, table_valid_from(start_ms, end_ms, versions))
    sent = produce(world.settings.kafka.bootstrap_servers, world.settings.tables[0].topic, records)
    return time.monotonic() - began, sent


CORRECTED_SHARE = 0.01
"""`--lookups`: the share of the table's keys a back-dated correction gives a new version."""
CORRECTED_SPAN = 6 * HOUR
"""`--lookups`: how far before the history's end the correction is valid from."""


def correction_run(
    spark: Any, world: World, full: Timed, start_ms: int, end_ms: int, keys: int
) -> str:
    """`--lookups`: after the lookup world's full run, a correction back-dated into the
    history (a new version of `CORRECTED_SHARE` of the keys, the events' pages first, valid
    from `CORRECTED_SPAN` before the end), then an incremental run, which recomputes the
    joined metric's cells from there on (rule 11), floored to a boundary of its windows (a
    UTC day); its BENCH fields: `lookup_incr_s`, `lookup_incr_share` (the share of the
    history's events from that boundary on, which the run recomputes) and `lookup_incr_ratio`
    (its wall time over the lookup world's full run `full`)."""
    corrected = max(1, int(keys * CORRECTED_SHARE))
    since = end_ms - CORRECTED_SPAN
    records = [
        SampleRecord(
            page.encode(), orjson.dumps({"page": page, "section": "x", "valid_from": since})
        )
        for page in map(table_page, range(corrected))
    ]
    produce(world.settings.kafka.bootstrap_servers, world.settings.tables[0].topic, iter(records))
    try:
        run = timed_run(world, spark, "incremental")
        assert run.summary.mode == "incremental", run.summary.mode
    except Exception as exc:
        traceback.print_exc()
        print(f"10x: incremental run after a correction failed: {exc!r}", flush=True)
        return "lookup_incr_s=failed"
    metric = world.settings.plan("views_by_page")
    assert metric is not None
    recomputed_from = window_start(since, math.lcm(*metric.windows_ms))  # rule 11
    share = min(1.0, (end_ms - max(start_ms, recomputed_from)) / (end_ms - start_ms))
    print(
        f"10x: correction of {corrected} keys valid from {CORRECTED_SPAN // HOUR} h before the "
        f"end, recomputed from {recomputed_from} ({share:.0%} of the history); incremental "
        f"run {run.wall_s:.1f} s (the full run {full.wall_s:.1f} s), "
        f"{run.summary.rows_out} cells, phases {run.summary.timings}",
        flush=True,
    )
    print(f"10x: correction stages {fields(run.stages)}", flush=True)
    return (
        f"lookup_incr_s={run.wall_s:.1f} lookup_incr_share={share:.2f} "
        f"lookup_incr_ratio={run.wall_s / full.wall_s:.2f}"
    )


VARIANTS = {
    "expr": "expressions",
    "lookup": "lookup",
    "sessions": "sessions",
    "horizon": "horizon",
}
"""A variant run's BENCH prefix -> its name in the log."""


def variant_run(
    spark: Any, world: World, full: Timed, prefix: str, what: str
) -> tuple[str, Timed | None]:
    """A full run of `world` (the 10x topic, the metrics of a variant: `with_expressions`,
    `with_lookups`): its BENCH fields, named by `prefix` (`VARIANTS`), `what` saying what the
    run is with in the log, and the run (None: it failed). A failure is reported (the
    traceback, `failed` on the BENCH line), not raised."""
    name = VARIANTS[prefix]
    try:
        run = timed_run(world, spark, "full")
    except Exception as exc:
        traceback.print_exc()
        print(f"10x: full run {what} failed: {exc!r}", flush=True)
        fails = ("events_per_s", "ratio", "cpu_s", "cpu_ratio")
        return " ".join(f"{prefix}_{field}=failed" for field in fails), None
    rate = run.summary.rows_in / run.wall_s
    print(
        f"10x: full run {what} {run.wall_s:.1f} s, {rate:,.0f} events/s, "
        f"{run.summary.rows_out} cells, skipped {run.summary.skipped}, CPU {run.cpu_s:.1f} s, "
        f"phases {run.summary.timings}",
        flush=True,
    )
    print(f"10x: {name} stages {fields(run.stages)}", flush=True)
    print(f"10x: {name} Spark actions: {run.jobs}", flush=True)
    print(f"10x: {name} Spark jobs: {run.spans}", flush=True)
    full_rate = full.summary.rows_in / full.wall_s
    return (
        f"{prefix}_events_per_s={rate:.0f} {prefix}_ratio={rate / full_rate:.2f} "
        f"{prefix}_cpu_s={run.cpu_s:.1f} {prefix}_cpu_ratio={full.cpu_s / run.cpu_s:.2f}"
    ), run


if __name__ == "__main__":
    main()
