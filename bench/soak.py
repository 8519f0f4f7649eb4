"""Soak benchmark: the whole platform as an operator runs it, under steady load for a while.

It looks for what only time shows: lag that creeps up, freshness that degrades as state
accumulates, API latency that grows with the speed view, memory that leaks, runs that start
failing.

    .venv/bin/python bench/soak.py [--quick] [--minutes 30] [--rate 20000] [--qps 100]
                                   [--batch-every 5] [--workers 2] [--sample-s 10]

It brings up the local stack (`lambdactl.stack.stack_up`; services already running are reused)
and gives itself a private world: a fresh PostgreSQL database `lp_soak` (the schema by
`shared.db.migrate.upgrade`), Redis database 10 (flushed), topics and a consumer group of a new
tag (the demo's source and metrics as `lambda.yaml` declares them, with the rollup of the total
that dashboards poll), all in a YAML file in a temporary directory that every subprocess reads
through `LAMBDA_CONFIG`. Then it starts, each logging to a file in that directory:

- one speed worker (`lambdactl speed`, its Prometheus metrics on `speed.metrics_port`);
- the API (`lambdactl serve --workers N`; two by default: one process saturates a core on
  `group_by` and total queries, and a second keeps a slow request from queueing the rest);
- the batch runner (`lambdactl batch runner`) with `batch.schedule: "*/<batch-every> * * * *"`,
  so the runner's own cron schedule queues the incremental runs (its first run is the full
  one a new set of metrics queues), at the default `batch.nice` (10): its runs take the CPU
  the speed and serving layers leave;

and, for the measured `--minutes`:

- a producer in a process of its own (the GIL of this process would otherwise throttle it and
  stretch the latencies measured here; `--producer thread` to compare): the generator's events
  (`lambdactl.generator`: 2% late, 2% duplicates, 0.5% malformed) with the current time as
  event time, keyed by event id so copies share a partition, paced to `--rate` in 10-ms batches;
- freshness probes: every 500 ms one event on one of 20 probe pages, timed from produce until
  `GET /series` for that page's minute counts it (the page's count reaches the number of probes
  sent to it in that minute: records of one key keep their order), as `bench/speed.py`
  measures freshness (polls every 10 ms, or every tenth of the probe's age once that is
  longer); p99 per 30-s interval;
- queries, open loop at `--qps`: `series` of one page, the total over every page and a
  `group_by=page` over the last 15 minutes at 1m (straddling W), `top` by count over the last
  5-minute window, `keys` of the last 15 minutes; latency from each request's scheduled send
  time; any answer but 2xx (or none within 30 s) is an error;
- a sampler every `--sample-s`: events produced/s, events the worker applied/s and its lag
  (`speed_lag_records`), the lag `/v1/status` reports (Kafka's end offset - the worker's
  fence, per partition, summed), the RSS of every process (speed worker; API supervisor and
  workers; batch runner, its Spark JVM and Spark's Python workers; the Kafka broker,
  redis-server, PostgreSQL's postmaster with its auxiliary processes and this world's
  backends), the batch runs (`GET /v1/batch/runs`: a failed run is an error) and whether a
  child exited (an error; it is not restarted).

It ends with one line, `BENCH soak minutes= rate= qps= events_per_s= applied_per_s= lag_max=
freshness_p99_ms_max= api_p99_ms_max= errors= runs_ok=<succeeded>/<finished>
rss_growth_pct_max= (process=...)`, a table of each process's RSS after the warm-up and at the
end, `target met` / `MISSED` per target (0 errors; lag bounded: its maximum over the second
half of the run is at most 1.5 x the first half's after warm-up, or under 1 s of events;
freshness p99 <= 1 s in every 30-s interval; RSS growth <= 10% after warm-up for the
platform's and the stores' processes), and
a plot, `artifacts/soak-<mode>.png` (events/s, lag, freshness and API p99, RSS per process,
with the batch runs shaded), whose path is printed next to the BENCH line; the samples go to
`artifacts/soak-<mode>.json`. A benchmark reports: the exit code is 0 whatever the targets.

The warm-up is two batch periods: the full run and the first incremental run, which bring the
Spark JVM's heap, PostgreSQL's buffers, the speed view (trimmed as W advances) and the API's
caches to their working sizes. RSS growth compares the first and the last sample after it
taken outside batch runs (a sample interval after a run's end included): a run's own memory
comes and goes with it and is not growth; the peak column shows it.

`--quick`: 3 minutes, 5,000 events/s, 50 req/s, a batch run every minute. The stores are
shared with whatever else runs on the machine (other suites' Redis databases and PostgreSQL
backends of other databases are left out of the figures, but not out of the CPU)."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import json
import multiprocessing
import os
import random
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from multiprocessing.sharedctypes import Synchronized
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import urlencode, urlsplit
from urllib.request import urlopen

import orjson
import psutil
import psycopg
import redis
import uvloop
import yaml
from confluent_kafka import KafkaError, Producer
from prometheus_client.parser import text_string_to_metric_families
from psycopg import sql

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.common import RawHttp, clock, free_port, log, pct, with_db  # noqa: E402
from lambdactl.generator import PAGES, GeneratorSpec, generate  # noqa: E402
from lambdactl.stack import stack_up  # noqa: E402
from serving_layer.timefmt import format_time, parse_time  # noqa: E402
from shared.config import KafkaSettings, Settings  # noqa: E402
from shared.db.migrate import upgrade  # noqa: E402
from shared.kafka import admin_client, client_config, create_topics  # noqa: E402
from tests.conftest import drop_database  # noqa: E402

MINUTE = 60_000
PG_DB = "lp_soak"
REDIS_DB = 10
PARTITIONS = 4
METRIC = "views_by_page"
PRODUCE_STEP_S = 0.01
MALFORMED_FRACTION = 0.005
DISORDER_MS = 1_000
PROBE_EVERY_S = 0.5
PROBE_PAGES = 20
PROBE_POLL_S = 0.01
"""Between two polls of a probe, or a tenth of its age if longer: within 10% of its figure,
and a backlog of slow probes does not multiply the API's load."""
PROBE_TIMEOUT_S = 30.0
FRESHNESS_INTERVAL_S = 30.0
REQUEST_TIMEOUT_S = 30.0
QUERY_SPAN_MS = 15 * MINUTE
FRESHNESS_TARGET_MS = 1000.0
RSS_GROWTH_TARGET_PCT = 10.0
TRANSIENT = ("spark python workers", "producer (bench)")
"""Processes whose RSS is shown but is no growth figure: Spark's Python workers come and go
with the runs, and the producer belongs to the benchmark."""


@dataclass(frozen=True)
class Mode:
    name: str
    minutes: float
    rate: int
    qps: float
    batch_every: int
    warmup_s: float
    sample_s: float
    workers: int
    producer: str

    @property
    def schedule(self) -> str:
        return "* * * * *" if self.batch_every == 1 else f"*/{self.batch_every} * * * *"


# -- the world ----------------------------------------------------------------------------


@dataclass
class World:
    settings: Settings
    config_path: Path
    env: dict[str, str]
    directory: Path
    api_port: int
    metrics_port: int


def make_world(stack: Settings, directory: Path, mode: Mode) -> World:
    """`lp_soak` dropped and created with the schema, Redis database 10 flushed, the topics of
    a new tag created, the config written to `directory/lambda.yaml`."""
    drop_database(stack.postgres.url, PG_DB)
    with psycopg.connect(stack.postgres.url, autocommit=True) as admin:
        admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(PG_DB)))
    pg_url = with_db(stack.postgres.url, PG_DB)
    redis_url = with_db(stack.redis.url, str(REDIS_DB))
    upgrade(pg_url)
    redis.Redis.from_url(redis_url).flushdb()
    tag = uuid.uuid4().hex[:8]
    api_port, metrics_port = free_port(), free_port()
    demo = yaml.safe_load((ROOT / "lambda.yaml").read_text())
    config = {
        "sources": [{**demo["sources"][0], "topic": f"soak-{tag}", "partitions": PARTITIONS}],
        "metrics": demo["metrics"],
        "kafka": {"bootstrap_servers": stack.kafka.bootstrap_servers},
        "redis": {"url": redis_url},
        "postgres": {"url": pg_url},
        "speed": {"app_id": f"soak-{tag}", "metrics_port": metrics_port},
        "batch": {"schedule": mode.schedule},
        "serving": {"host": "127.0.0.1", "port": api_port},
    }
    settings = Settings(**config)
    create_topics(settings)
    config_path = directory / "lambda.yaml"
    config_path.write_text(yaml.safe_dump(config))
    env = {k: v for k, v in os.environ.items() if not k.startswith("LAMBDA_")}
    env["LAMBDA_CONFIG"] = str(config_path)
    return World(settings, config_path, env, directory, api_port, metrics_port)


def delete_topics(world: World) -> None:
    """The run's topics hold every event it produced (retention: forever): gone afterwards."""
    source = world.settings.sources[0]
    admin = admin_client(world.settings)  # held until the deletions are done
    futures = admin.delete_topics(
        [source.topic, source.dlq_topic, source.late_topic], operation_timeout=30
    )
    for topic, future in futures.items():
        try:
            future.result()
        except Exception as exc:
            log(f"topic {topic} left behind: {exc}")


@dataclass
class Child:
    name: str
    process: subprocess.Popen[bytes]
    log: Path
    exited: bool = False


class Children:
    """The platform's processes, each logging to a file of its own; leaving the context stops
    them and whatever they started (Spark's JVM and Python workers, uvicorn's workers)."""

    def __init__(self, world: World) -> None:
        self.world = world
        self.children: dict[str, Child] = {}

    def __enter__(self) -> Children:
        return self

    def __exit__(self, *_: object) -> None:
        for child in reversed(self.children.values()):
            stop_tree(child.process.pid)

    def start(self, name: str, *args: str) -> Child:
        path = self.world.directory / f"{name.replace(' ', '-')}.log"
        with path.open("ab") as out:
            process = subprocess.Popen(
                [sys.executable, "-m", "lambdactl", *args],
                stdout=out,
                stderr=subprocess.STDOUT,
                env=self.world.env,
                cwd=ROOT,
            )
        child = Child(name, process, path)
        self.children[name] = child
        return child

    def newly_exited(self) -> list[Child]:
        gone = [c for c in self.children.values() if not c.exited and c.process.poll() is not None]
        for child in gone:
            child.exited = True
        return gone


def stop_tree(pid: int, timeout_s: float = 20.0) -> None:
    """SIGTERM to `pid`, SIGKILL after `timeout_s`; then SIGKILL to any descendant left."""
    try:
        process = psutil.Process(pid)
        descendants = process.children(recursive=True)
        process.terminate()
        try:
            process.wait(timeout_s)
        except psutil.TimeoutExpired:
            process.kill()
    except psutil.NoSuchProcess:
        return
    for leftover in descendants:
        with contextlib.suppress(psutil.Error):
            leftover.kill()


def tail(path: Path, lines: int = 15) -> str:
    try:
        return "\n".join(
            "  " + line for line in path.read_text(errors="replace").splitlines()[-lines:]
        )
    except OSError as exc:
        return f"  ({exc})"


# -- the producer -------------------------------------------------------------------------


class Flag(Protocol):
    def is_set(self) -> bool: ...


def produce_paced(
    kafka: KafkaSettings,
    topic: str,
    rate: int,
    stop: Flag,
    produced: Synchronized[int],
    failed: Synchronized[int],
) -> None:
    """The generator's events at `rate` a second, in batches every 10 ms, each batch's event
    times spread over the last 10 ms (and `DISORDER_MS` of disorder), keyed by event id;
    counts records handed to the producer and records the broker refused."""
    producer = Producer(
        {
            **client_config(kafka),
            "enable.idempotence": True,
            "linger.ms": 5,
        }
    )

    def delivered(error: KafkaError | None, _message: object) -> None:
        if error is not None:
            with failed.get_lock():
                failed.value += 1

    per_batch = max(1, round(rate * PRODUCE_STEP_S))
    step_s = per_batch / rate
    batches, started = 0, time.perf_counter()
    while not stop.is_set():
        now_ms = int(time.time() * 1000)
        batches += 1
        spec = GeneratorSpec(
            now_ms - int(step_s * 1000),
            now_ms,
            per_batch,
            disorder_ms=DISORDER_MS,
            malformed_fraction=MALFORMED_FRACTION,
            seed=batches,
        )
        sent = 0
        for record in generate(spec):
            while True:
                try:
                    producer.produce(
                        topic, key=record.key, value=record.value, on_delivery=delivered
                    )
                    break
                except BufferError:
                    producer.poll(0.05)
            sent += 1
        with produced.get_lock():
            produced.value += sent
        producer.poll(0)
        ahead = batches * step_s - (time.perf_counter() - started)
        if ahead > 0:
            time.sleep(ahead)
    left = producer.flush(30)
    if left:
        with failed.get_lock():
            failed.value += left


class ProducerHandle:
    """`produce_paced` in a process of its own (or a thread, to compare), with its counters."""

    def __init__(self, world: World, mode: Mode) -> None:
        context = multiprocessing.get_context("spawn")
        self.produced: Synchronized[int] = context.Value("q", 0)
        self.failed: Synchronized[int] = context.Value("q", 0)
        source = world.settings.sources[0]
        args = (
            world.settings.kafka,
            source.topic,
            mode.rate,
        )
        self.pid: int | None = None
        self._stop: Any
        self._runner: Any
        if mode.producer == "process":
            self._stop = context.Event()
            self._runner = context.Process(
                target=produce_paced,
                args=(*args, self._stop, self.produced, self.failed),
                daemon=True,
            )
        else:
            self._stop = threading.Event()
            self._runner = threading.Thread(
                target=produce_paced,
                args=(*args, self._stop, self.produced, self.failed),
                daemon=True,
            )

    def start(self) -> None:
        self._runner.start()
        self.pid = getattr(self._runner, "pid", None)

    def stop(self) -> None:
        self._stop.set()
        self._runner.join(60)


# -- processes and their memory -----------------------------------------------------------

_BACKEND = re.compile(r"postgres: \S+ (\S+) (?:\S+\(\d+\)|\[local\])")
"""A client backend's process title: `postgres: <user> <database> <host(port)> <state>`."""


def _rss(process: psutil.Process | int) -> int:
    try:
        if isinstance(process, int):
            process = psutil.Process(process)
        return int(process.memory_info().rss)
    except psutil.Error:
        return 0


def _is_java(process: psutil.Process) -> bool:
    try:
        return process.name() == "java"
    except psutil.Error:
        return False


def _children(pid: int | None) -> list[psutil.Process]:
    if pid is None:
        return []
    try:
        return psutil.Process(pid).children(recursive=True)
    except psutil.Error:
        return []


def _cmdline(process: psutil.Process) -> str:
    try:
        return " ".join(process.cmdline())
    except psutil.Error:
        return ""


@dataclass
class Processes:
    """The processes whose RSS the soak follows: the platform's children (found again at every
    sample: Spark's Python workers and a replaced uvicorn worker come and go) and the stores."""

    children: Children
    producer: ProducerHandle
    workers: int
    broker: psutil.Process | None
    redis_server: psutil.Process | None
    postmaster: psutil.Process | None

    @classmethod
    def find(
        cls, settings: Settings, children: Children, producer: ProducerHandle, workers: int
    ) -> Processes:
        """The stores by the process listening on their configured ports (other suites may
        run brokers of their own beside the stack's)."""
        kafka_port = int(settings.kafka.bootstrap_servers.split(",")[0].rpartition(":")[2])
        listening = {
            c.laddr.port: c.pid
            for c in psutil.net_connections("tcp")
            if c.status == psutil.CONN_LISTEN and c.pid is not None
        }

        def at(port: int | None) -> psutil.Process | None:
            pid = listening.get(port or 0)
            with contextlib.suppress(psutil.Error):
                return None if pid is None else psutil.Process(pid)
            return None

        return cls(
            children,
            producer,
            workers,
            at(kafka_port),
            at(urlsplit(settings.redis.url).port or 6379),
            at(urlsplit(settings.postgres.url).port or 5432),
        )

    def rss(self) -> dict[str, int]:
        """Bytes of RSS by process (or group of processes), in the table's order."""
        found: dict[str, int] = {}
        kids = self.children.children
        speed = kids["speed worker"].process.pid
        found["speed worker"] = _rss(speed)
        api = kids["api"].process.pid
        api_total = found["api supervisor" if self.workers > 1 else "api"] = _rss(api)
        if self.workers > 1:
            workers = sorted(
                (p for p in _children(api) if "spawn_main" in _cmdline(p)), key=lambda p: p.pid
            )
            for i, worker in enumerate(workers, 1):
                found[f"api worker {i}"] = _rss(worker)
            api_total += sum(_rss(p) for p in _children(api))
            found["api (sum)"] = api_total
        runner = kids["batch runner"].process.pid
        found["batch runner"] = _rss(runner)
        spark = _children(runner)
        found["spark jvm"] = sum(_rss(p) for p in spark if _is_java(p))
        found["spark python workers"] = sum(_rss(p) for p in spark if not _is_java(p))
        if self.broker is not None:
            found["kafka broker"] = _rss(self.broker)
        if self.redis_server is not None:
            found["redis-server"] = _rss(self.redis_server)
        if self.postmaster is not None:
            found["postgres"] = _rss(self.postmaster) + sum(
                _rss(p) for p in _children(self.postmaster.pid) if self._ours(p)
            )
        if self.producer.pid is not None:
            found["producer (bench)"] = _rss(self.producer.pid)
        return found

    @staticmethod
    def _ours(process: psutil.Process) -> bool:
        """An auxiliary process, or a client backend of this world's database."""
        match = _BACKEND.match(_cmdline(process))
        return match is None or match.group(1) == PG_DB


# -- measurements -------------------------------------------------------------------------


@dataclass
class Sample:
    t: float
    """Seconds since the load started."""
    produced_per_s: float
    applied_per_s: float | None
    lag: int | None
    """Kafka's end offsets - the worker's fences, summed over partitions (`/v1/status`)."""
    worker_lag: int | None
    """The worker's own `speed_lag_records`, summed."""
    speed_status: str | None
    rss: dict[str, int]


@dataclass
class Soak:
    """Everything measured, in seconds since the load started."""

    mode: Mode
    world: World
    started: float = 0.0
    wall_started: float = 0.0
    queries: list[tuple[float, float, int, str]] = field(default_factory=list)
    """(scheduled at, latency ms, status, kind); status 0: no answer."""
    probes: list[tuple[float, float | None]] = field(default_factory=list)
    """(sent at, ms until visible; None: not within `PROBE_TIMEOUT_S`)."""
    samples: list[Sample] = field(default_factory=list)
    errors: Counter[str] = field(default_factory=Counter)
    error_details: dict[str, str] = field(default_factory=dict)
    """The first answer of each kind of error (what the API said)."""
    runs: dict[int, dict[str, Any]] = field(default_factory=dict)
    produced_total: int = 0
    applied_total: float = 0.0
    applied_until: float = 0.0
    """When the worker was last scraped (`applied_total` is as of then)."""
    duration_s: float = 0.0

    def now(self) -> float:
        return clock() - self.started

    def error(self, kind: str, answer: bytes = b"", count: int = 1) -> None:
        self.errors[kind] += count
        if answer and kind not in self.error_details:
            self.error_details[kind] = answer[:300].decode(errors="replace")


def _series_path(metric: str, start_ms: int, end_ms: int, **extra: str) -> str:
    query = {"window": "1m", "start": format_time(start_ms), "end": format_time(end_ms), **extra}
    return f"/v1/metrics/{metric}/series?" + urlencode(query)


def query_paths(rng: random.Random) -> Callable[[], tuple[str, str]]:
    """A mixed query over recent windows, drawn per request: (kind, path)."""

    def draw() -> tuple[str, str]:
        now = int(time.time() * 1000)
        start, end = (now - QUERY_SPAN_MS) // MINUTE * MINUTE, now // MINUTE * MINUTE + MINUTE
        kind = rng.choices(["series", "total", "group_by", "top", "keys"], [4, 1.5, 1.5, 1.5, 1.5])[
            0
        ]
        if kind == "series":
            return kind, _series_path(METRIC, start, end, page=rng.choice(PAGES))
        if kind == "total":
            return kind, _series_path(METRIC, start, end)
        if kind == "group_by":
            return kind, _series_path(METRIC, start, end, group_by="page")
        if kind == "top":
            at = format_time((now - 5 * MINUTE) // 1000 * 1000)
            query = {"window": "5m", "at": at, "by": "count", "n": "10"}
            return kind, f"/v1/metrics/{METRIC}/top?" + urlencode(query)
        query = {"start": format_time(start), "end": format_time(end), "limit": "100"}
        return kind, f"/v1/metrics/{METRIC}/keys?" + urlencode(query)

    return draw


async def run_queries(soak: Soak, client: RawHttp, until: float) -> None:
    """Open loop at `qps` until `until` (seconds since the start); latency from each
    request's scheduled time."""
    draw = query_paths(random.Random(11))
    rate = soak.mode.qps
    in_flight: set[asyncio.Task[None]] = set()

    async def one(scheduled: float, kind: str, path: str) -> None:
        try:
            status, body = await asyncio.wait_for(client.fetch(path), REQUEST_TIMEOUT_S)
        except (OSError, asyncio.IncompleteReadError, TimeoutError):
            status, body = 0, b""
        if not 200 <= status < 300:
            soak.error(f"query {kind} HTTP {status or 'no answer'}", body)
        soak.queries.append((scheduled, (soak.now() - scheduled) * 1000, status, kind))

    i = 0
    while True:
        scheduled = i / rate
        if scheduled >= until:
            break
        delay = scheduled - soak.now()
        if delay > 0:
            await asyncio.sleep(delay)
        kind, path = draw()
        task = asyncio.ensure_future(one(scheduled, kind, path))
        in_flight.add(task)
        task.add_done_callback(in_flight.discard)
        i += 1
    await asyncio.gather(*in_flight)


async def run_probes(soak: Soak, client: RawHttp, until: float) -> None:
    """A probe event every `PROBE_EVERY_S` on one of the probe pages; each is timed until the
    page's count for its minute reaches the probes sent to that page and minute so far."""
    producer = Producer(
        {**client_config(soak.world.settings.kafka), "enable.idempotence": True, "linger.ms": 0}
    )
    topic = soak.world.settings.sources[0].topic
    sent_to: Counter[tuple[str, int]] = Counter()
    in_flight: set[asyncio.Task[None]] = set()

    async def watch(page: str, minute: int, want: int, sent_at: float) -> None:
        path = _series_path(METRIC, minute, minute + MINUTE, page=page)
        while (left := PROBE_TIMEOUT_S - (soak.now() - sent_at)) > 0:
            try:
                status, body = await asyncio.wait_for(client.fetch(path), left)
            except (OSError, asyncio.IncompleteReadError, TimeoutError):
                status, body = 0, b""
            if status == 200:
                points = orjson.loads(body)["points"]
                if points and points[0]["count"] >= want:
                    soak.probes.append((sent_at, (soak.now() - sent_at) * 1000))
                    return
            else:
                soak.error(f"probe HTTP {status or 'no answer'}", body)
            await asyncio.sleep(max(PROBE_POLL_S, 0.1 * (soak.now() - sent_at)))
        soak.error("probe not visible within 30 s")
        soak.probes.append((sent_at, None))

    n = 0
    while n * PROBE_EVERY_S < until:
        delay = n * PROBE_EVERY_S - soak.now()
        if delay > 0:
            await asyncio.sleep(delay)
        n += 1
        now_ms = int(time.time() * 1000)
        page, minute = f"/probe/{n % PROBE_PAGES}", now_ms // MINUTE * MINUTE
        sent_to[(page, minute)] += 1
        event = {
            "ts": now_ms,
            "event_id": f"probe-{n}",
            "page": page,
            "user_id": "probe",
            "latency_ms": 1.0,
        }
        sent_at = soak.now()
        producer.produce(topic, key=page.encode(), value=orjson.dumps(event))
        producer.poll(0)
        task = asyncio.ensure_future(watch(page, minute, sent_to[(page, minute)], sent_at))
        in_flight.add(task)
        task.add_done_callback(in_flight.discard)
    await asyncio.gather(*in_flight)
    producer.flush(10)


def scrape_worker(port: int) -> tuple[float, int] | None:
    """(records the worker applied so far, its lag summed over partitions), or None."""
    try:
        with urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
            text = response.read().decode()
    except OSError:
        return None
    applied, lag = 0.0, 0
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "speed_events_total":
                applied += sample.value
            elif sample.name == "speed_lag_records":
                lag += int(sample.value)
    return applied, lag


async def run_sampler(
    soak: Soak, client: RawHttp, processes: Processes, producer: ProducerHandle, until: float
) -> None:
    """Every `sample_s`: rates, lags, RSS, runs, children that exited (see `Sample`)."""
    mode, world = soak.mode, soak.world
    last_t, last_produced, last_applied = 0.0, 0, None
    first = await asyncio.to_thread(scrape_worker, world.metrics_port)
    if first is not None:
        last_applied = first[0]
    applied_at_start = last_applied
    k = 0
    while True:
        k += 1
        wake = min(k * mode.sample_s, until)
        await asyncio.sleep(max(0.0, wake - soak.now()))
        t = soak.now()
        produced = producer.produced.value
        rss = await asyncio.to_thread(processes.rss)
        worker = await asyncio.to_thread(scrape_worker, world.metrics_port)
        applied_per_s = worker_lag = None
        if worker is None:
            soak.error("speed worker metrics unreachable")
        else:
            if last_applied is not None:
                applied_per_s = (worker[0] - last_applied) / (t - last_t)
            if applied_at_start is None:
                applied_at_start = worker[0]
            last_applied, worker_lag = worker[0], worker[1]
            soak.applied_total, soak.applied_until = worker[0] - applied_at_start, t
        lag, speed_status = await status_lag(soak, client)
        await read_runs(soak, client)
        for child in processes.children.newly_exited():
            soak.error(f"{child.name} exited")
            log(f"the {child.name} exited ({child.process.returncode}):\n{tail(child.log)}")
        sample = Sample(
            t,
            (produced - last_produced) / (t - last_t),
            applied_per_s,
            lag,
            worker_lag,
            speed_status,
            rss,
        )
        soak.samples.append(sample)
        last_t, last_produced = t, produced
        log(sample_line(soak, sample))
        if wake >= until:
            return


async def status_lag(soak: Soak, client: RawHttp) -> tuple[int | None, str | None]:
    try:
        status, body = await asyncio.wait_for(client.fetch("/v1/status"), REQUEST_TIMEOUT_S)
    except (OSError, asyncio.IncompleteReadError, TimeoutError):
        status, body = 0, b""
    if status != 200:
        soak.error(f"status HTTP {status or 'no answer'}", body)
        return None, None
    answer = orjson.loads(body)
    lags = [p["lag"] for p in answer["partitions"]]
    return (None if None in lags else sum(lags)), answer["speed_status"]


async def read_runs(soak: Soak, client: RawHttp) -> None:
    try:
        status, body = await asyncio.wait_for(
            client.fetch("/v1/batch/runs?limit=500"), REQUEST_TIMEOUT_S
        )
    except (OSError, asyncio.IncompleteReadError, TimeoutError):
        status, body = 0, b""
    if status != 200:
        soak.error(f"runs HTTP {status or 'no answer'}", body)
        return
    for run in orjson.loads(body)["runs"]:
        before = soak.runs.get(run["run_id"], {}).get("status")
        soak.runs[run["run_id"]] = run
        if run["status"] != before and run["status"] in ("succeeded", "failed", "cancelled"):
            log(
                f"run {run['run_id']} ({run.get('executed_mode') or run['mode']}) "
                f"{run['status']} in {run['duration_s'] or 0:.1f} s, {run['rows_in']} events in"
                + (f": {run['error']}" if run["error"] else "")
            )
            if run["status"] != "succeeded":
                soak.error(f"run {run['status']}", (run["error"] or "").encode())


def sample_line(soak: Soak, sample: Sample) -> str:
    """The sample, with the freshness of the probes answered in the last 30 s (and how many
    were not seen within `PROBE_TIMEOUT_S`) and the API p99 of the last interval so far."""
    t = sample.t
    probes = [ms for s, ms in soak.probes if t - s <= FRESHNESS_INTERVAL_S]
    seen = [ms for ms in probes if ms is not None]
    unseen = len(probes) - len(seen)
    recent = [ms for s, ms, _, _ in soak.queries if t - soak.mode.sample_s <= s < t]
    rss = sum(v for k, v in sample.rss.items() if k not in TRANSIENT and k != "api (sum)")
    return (
        f"t={t:4.0f}s produced {sample.produced_per_s:,.0f}/s applied "
        f"{_fmt(sample.applied_per_s, ',.0f')}/s lag {_fmt(sample.lag)} (worker "
        f"{_fmt(sample.worker_lag)}) freshness p99 {_fmt(pct(seen, 0.99) if seen else None, '.0f')}"
        f" ms{f' ({unseen} not seen)' if unseen else ''} api p99 "
        f"{_fmt(pct(recent, 0.99) if recent else None, '.0f')} ms ({len(recent)} req) "
        f"rss {rss / 2**20:,.0f} MB errors {soak.errors.total()}"
    )


def _fmt(value: float | None, spec: str = "") -> str:
    return "-" if value is None else format(value, spec)


# -- the run ------------------------------------------------------------------------------


async def wait_until_serving(world: World, children: Children) -> None:
    """The API answers and the worker serves its metrics (it is assigned its partitions
    within the warm-up)."""
    client = RawHttp("127.0.0.1", world.api_port)
    deadline = time.monotonic() + 90
    try:
        while time.monotonic() < deadline:
            for child in children.newly_exited():
                raise SystemExit(f"the {child.name} exited at start:\n{tail(child.log)}")
            try:
                ready = await client.get("/healthz") == 200
            except OSError:
                ready = False
            text = ""
            url = f"http://127.0.0.1:{world.metrics_port}/metrics"
            with contextlib.suppress(OSError), urlopen(url, timeout=2) as response:
                text = response.read().decode()
            if ready and "speed_lag_records" in text:
                return
            await asyncio.sleep(0.5)
        raise SystemExit(f"the API or the speed worker did not come up; logs in {world.directory}")
    finally:
        client.close()


async def soak_for(soak: Soak, processes: Processes, producer: ProducerHandle) -> None:
    world, until = soak.world, soak.mode.minutes * 60
    queries = RawHttp("127.0.0.1", world.api_port)
    probes = RawHttp("127.0.0.1", world.api_port)
    sampler = RawHttp("127.0.0.1", world.api_port)
    gc.collect()
    gc.freeze()  # this process's own collections would be charged to the latencies
    soak.started, soak.wall_started = clock(), time.time()
    producer.start()
    try:
        await asyncio.gather(
            run_queries(soak, queries, until),
            run_probes(soak, probes, until),
            run_sampler(soak, sampler, processes, producer, until),
        )
    finally:
        producer.stop()
        soak.duration_s = soak.now()
        soak.produced_total = producer.produced.value
        if producer.failed.value:
            soak.error("events not delivered", count=producer.failed.value)
        await read_runs(soak, sampler)
        for client in (queries, probes, sampler):
            client.close()


# -- the report ---------------------------------------------------------------------------


def by_interval(
    points: Iterator[tuple[float, float]], width: float
) -> list[tuple[float, float, int]]:
    """(interval start, p99, count) of the values per interval of `width` seconds."""
    buckets: defaultdict[int, list[float]] = defaultdict(list)
    for t, value in points:
        buckets[int(t // width)].append(value)
    return [(k * width, pct(v, 0.99), len(v)) for k, v in sorted(buckets.items())]


def freshness_series(soak: Soak) -> list[tuple[float, float, int]]:
    """p99 per 30-s interval; a probe never seen counts as `PROBE_TIMEOUT_S`."""
    points = ((s, PROBE_TIMEOUT_S * 1000 if ms is None else ms) for s, ms in soak.probes)
    return by_interval(points, FRESHNESS_INTERVAL_S)


def api_series(soak: Soak) -> list[tuple[float, float, int]]:
    return by_interval(((s, ms) for s, ms, _, _ in soak.queries), soak.mode.sample_s)


def rss_table(soak: Soak) -> tuple[list[tuple[str, int, int, int, float | None]], float, str]:
    """Per process (start after warm-up, end, peak, growth %), and the largest growth of a
    process that is not transient with its name; start and end are taken outside runs."""
    runs = [span for run in soak.runs.values() if (span := run_span(run, soak)) is not None]
    after = [
        s
        for s in soak.samples
        if s.t >= soak.mode.warmup_s
        and not any(a <= s.t <= b + soak.mode.sample_s for a, b in runs)
    ] or soak.samples[-1:]
    start, end = after[0].rss, after[-1].rss
    rows: list[tuple[str, int, int, int, float | None]] = []
    worst, worst_name = float("-inf"), "-"
    for name in end:
        a, b = start.get(name, 0), end[name]
        peak = max(s.rss.get(name, 0) for s in soak.samples)
        growth = None if a == 0 else (b - a) / a * 100
        rows.append((name, a, b, peak, growth))
        if growth is not None and name not in TRANSIENT and growth > worst:
            worst, worst_name = growth, name
    return rows, worst, worst_name


def run_span(run: dict[str, Any], soak: Soak) -> tuple[float, float] | None:
    """A run's (start, end) in seconds since the load started; still running: to the end."""
    if run["started_at"] is None:
        return None
    began = (parse_time(run["started_at"]) or 0) / 1000 - soak.wall_started
    ended_ms = parse_time(run["finished_at"]) if run["finished_at"] else None
    ended = soak.duration_s if ended_ms is None else ended_ms / 1000 - soak.wall_started
    return began, ended


def plot(soak: Soak, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    minutes = [s.t / 60 for s in soak.samples]
    fig, axes = plt.subplots(4, 1, figsize=(11, 13), sharex=True)
    ax = axes[0]
    ax.plot(minutes, [s.produced_per_s for s in soak.samples], label="produced")
    ax.plot(minutes, [s.applied_per_s or 0 for s in soak.samples], label="applied by the worker")
    ax.axhline(soak.mode.rate, color="grey", linestyle=":", label=f"--rate {soak.mode.rate}")
    ax.set_ylabel("events/s")
    ax.legend(loc="lower right")
    ax = axes[1]
    ax.plot(
        minutes,
        [s.lag if s.lag is not None else float("nan") for s in soak.samples],
        label="/v1/status (end offset - fence)",
    )
    ax.plot(
        minutes,
        [s.worker_lag if s.worker_lag is not None else float("nan") for s in soak.samples],
        label="worker's speed_lag_records",
        alpha=0.7,
    )
    ax.set_ylabel("speed lag (records)")
    ax.legend(loc="upper right")
    ax = axes[2]
    fresh, api = freshness_series(soak), api_series(soak)
    ax.hlines(
        [p for _, p, _ in fresh],
        [t / 60 for t, _, _ in fresh],
        [(t + FRESHNESS_INTERVAL_S) / 60 for t, _, _ in fresh],
        color="tab:blue",
        linewidth=2.5,
        label=f"freshness p99 ({FRESHNESS_INTERVAL_S:g} s)",
    )
    ax.plot(
        [(t + soak.mode.sample_s) / 60 for t, _, _ in api],
        [p for _, p, _ in api],
        color="tab:orange",
        label=f"API p99 ({soak.mode.sample_s:g} s)",
    )
    ax.axhline(FRESHNESS_TARGET_MS, color="red", linestyle=":", label="freshness target 1 s")
    ax.set_yscale("log")
    ax.set_ylabel("ms")
    ax.legend(loc="upper right")
    ax = axes[3]
    names = [n for n in soak.samples[-1].rss if n != "api (sum)"]
    colors = plt.get_cmap("tab20").colors  # type: ignore[attr-defined]
    for i, name in enumerate(names):
        ax.plot(
            minutes,
            [s.rss.get(name, 0) / 2**20 for s in soak.samples],
            color=colors[i % len(colors)],
            label=name,
        )
    ax.axvline(soak.mode.warmup_s / 60, color="grey", linestyle=":")
    ax.set_ylabel("RSS (MB)")
    ax.set_xlabel("minutes since the load started")
    ax.legend(loc="upper left", fontsize="small", ncol=3)
    for run in soak.runs.values():
        span = run_span(run, soak)
        if span is None:
            continue
        color = "green" if run["status"] == "succeeded" else "red"
        for ax in axes:
            ax.axvspan(span[0] / 60, span[1] / 60, color=color, alpha=0.08)
    axes[0].set_title(
        f"soak {soak.mode.name}: {soak.mode.rate} events/s, {soak.mode.qps:g} req/s, batch "
        f"'{soak.mode.schedule}' (runs shaded), {soak.mode.workers} API workers"
    )
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)


def report(soak: Soak) -> None:
    mode = soak.mode
    fresh, api = freshness_series(soak), api_series(soak)
    fresh_max = max(fresh, key=lambda r: r[1], default=(0.0, float("nan"), 0))
    api_max = max(api, key=lambda r: r[1], default=(0.0, float("nan"), 0))
    lags = [(s.t, s.lag) for s in soak.samples if s.lag is not None]
    lag_max = max((lag for _, lag in lags), default=None)
    half = soak.duration_s / 2
    first_half = [lag for t, lag in lags if mode.warmup_s <= t < half]
    second_half = [lag for t, lag in lags if t >= half]
    bound = max(1.5 * max(first_half, default=0), mode.rate)
    lag_bounded = bool(second_half) and max(second_half) <= bound
    finished = [
        r for r in soak.runs.values() if r["status"] in ("succeeded", "failed", "cancelled")
    ]
    ok = sum(r["status"] == "succeeded" for r in finished)
    open_runs = len(soak.runs) - len(finished)
    rows, growth, grown = rss_table(soak)
    events_per_s = soak.produced_total / soak.duration_s
    applied_per_s = soak.applied_total / max(soak.applied_until, 1e-9)
    errors = soak.errors.total()
    png = ROOT / "artifacts" / f"soak-{mode.name}.png"
    plot(soak, png)
    samples = png.with_suffix(".json")
    samples.write_text(
        json.dumps(
            {
                "mode": asdict(mode),
                "started_at": soak.wall_started,
                "duration_s": soak.duration_s,
                "samples": [asdict(s) for s in soak.samples],
                "freshness_p99_ms": fresh,
                "api_p99_ms": api,
                "errors": dict(soak.errors),
                "runs": list(soak.runs.values()),
            },
            indent=1,
        )
    )
    kinds: defaultdict[str, list[float]] = defaultdict(list)
    for _, ms, _, kind in soak.queries:
        kinds[kind].append(ms)
    log(
        "queries: "
        + ", ".join(
            f"{k} {len(v)} p50 {pct(v, 0.5):.0f} p99 {pct(v, 0.99):.0f} ms"
            for k, v in sorted(kinds.items())
        )
    )
    log(
        f"probes: {len(soak.probes)}; freshness p99 max {fresh_max[1]:.0f} ms in the interval "
        f"from t={fresh_max[0]:.0f}s; API p99 max {api_max[1]:.0f} ms from t={api_max[0]:.0f}s; "
        f"lag max {lag_max} (first half after warm-up {max(first_half, default=0)}, second "
        f"half {max(second_half, default=0)})"
    )
    for kind, n in soak.errors.most_common():
        detail = soak.error_details.get(kind)
        log(f"error: {kind} x{n}" + (f"; first answer: {detail}" if detail else ""))
    print(
        f"\nRSS (MB): start and end = the first and the last sample after the "
        f"{mode.warmup_s:g}-s warm-up taken outside runs",
        flush=True,
    )
    print(f"{'process':<22} {'start':>8} {'end':>8} {'peak':>8} {'growth':>8}")
    for name, a, b, peak, pct_growth in rows:
        note = " (transient)" if name in TRANSIENT else ""
        growth_text = "-" if pct_growth is None else f"{pct_growth:+.1f}%"
        print(
            f"{name:<22} {a / 2**20:8.0f} {b / 2**20:8.0f} {peak / 2**20:8.0f} "
            f"{growth_text:>8}{note}"
        )
    print(
        f"\nBENCH soak minutes={soak.duration_s / 60:.1f} rate={mode.rate} qps={mode.qps:g} "
        f"events_per_s={events_per_s:.0f} applied_per_s={applied_per_s:.0f} lag_max={lag_max} "
        f"freshness_p99_ms_max={fresh_max[1]:.0f} api_p99_ms_max={api_max[1]:.0f} "
        f"errors={errors} runs_ok={ok}/{len(finished)} rss_growth_pct_max={growth:.1f} "
        f"(process={grown})",
        flush=True,
    )
    print(f"plot: {png} (samples: {samples})")
    if open_runs:
        print(f"({open_runs} run(s) still queued or running at the end)")
    targets = [
        ("0 errors", errors == 0),
        (f"lag bounded (second half max <= {bound:.0f})", lag_bounded),
        ("freshness p99 <= 1 s in every 30-s interval", fresh_max[1] <= FRESHNESS_TARGET_MS),
        (
            f"RSS growth <= {RSS_GROWTH_TARGET_PCT:g}% after warm-up",
            growth <= RSS_GROWTH_TARGET_PCT,
        ),
    ]
    for name, met in targets:
        print(f"  {name}: {'target met' if met else 'MISSED'}")


def parse_mode() -> Mode:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--quick", action="store_true", help="3 min, 5k events/s, 50 req/s, runs every minute"
    )
    parser.add_argument("--minutes", type=float)
    parser.add_argument("--rate", type=int, help="events/s produced (20000; --quick 5000)")
    parser.add_argument("--qps", type=float, help="queries/s, open loop (100; --quick 50)")
    parser.add_argument(
        "--batch-every", type=int, help="minutes between scheduled runs (5; --quick 1)"
    )
    parser.add_argument("--sample-s", type=float, default=10.0)
    parser.add_argument("--workers", type=int, default=2, help="API processes")
    parser.add_argument("--producer", choices=["process", "thread"], default="process")
    args = parser.parse_args()
    quick = args.quick
    name, minutes = ("quick", 3.0) if quick else ("full", 30.0)
    if args.minutes not in (None, minutes):
        name, minutes = f"{name}-{args.minutes:g}m", args.minutes
    batch_every = args.batch_every or (1 if quick else 5)
    return Mode(
        name=name,
        minutes=minutes,
        rate=args.rate or (5_000 if quick else 20_000),
        qps=args.qps or (50.0 if quick else 100.0),
        batch_every=batch_every,
        warmup_s=2 * 60.0 * batch_every,
        sample_s=args.sample_s,
        workers=args.workers,
        producer=args.producer,
    )


def main() -> None:
    # Ctrl-C and SIGTERM end the load and then report; also when started in the background,
    # where the shell leaves SIGINT ignored
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, lambda *_: os.kill(os.getpid(), signal.SIGINT))
    mode = parse_mode()
    stack = Settings()
    down = [s.name for s in stack_up(stack) if not s.reachable]
    if down:
        raise SystemExit(f"services unreachable: {down}")
    directory = Path(tempfile.mkdtemp(prefix="soak-"))
    world = make_world(stack, directory, mode)
    log(
        f"soak {mode.name}: {mode.minutes:g} min, {mode.rate} events/s, {mode.qps:g} req/s, "
        f"batch '{mode.schedule}', {mode.workers} API workers, producer in a {mode.producer}; "
        f"config and logs in {directory}"
    )
    soak = Soak(mode, world)
    try:
        with Children(world) as children:
            children.start("batch runner", "batch", "runner")
            children.start("speed worker", "speed")
            children.start(
                "api", "serve", "--port", str(world.api_port), "--workers", str(mode.workers)
            )
            uvloop.run(wait_until_serving(world, children))
            producer = ProducerHandle(world, mode)
            processes = Processes.find(world.settings, children, producer, mode.workers)
            try:
                uvloop.run(soak_for(soak, processes, producer))
            except KeyboardInterrupt:
                log("interrupted: what was measured so far follows")
    finally:
        delete_topics(world)
    if soak.samples:
        report(soak)


if __name__ == "__main__":
    main()
