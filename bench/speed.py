"""Speed-layer benchmark: one worker's sustained events/s against the consumption ceiling,
freshness through `GET /series`, and Redis memory per cell.

    .venv/bin/python bench/speed.py [--quick] [--events N] [--partitions P]
        [--peers] [--expressions] [--lookups [--table-keys K]] [--sessions] [--workers N]
        [--profile DIR] [--skip-freshness]

Brings up the local stack (`lambdactl.stack.stack_up`), gives itself a fresh topic, a fresh
PostgreSQL database (no batch run: W is None) and a Redis database (`--redis-db`, default 13,
flushed), then:

1. produces N sample events (`lambdactl.generator`: 2% late, 2% duplicates); with `--lookups`,
   then the table `pages` (topic `pages-<tag>`, one partition, `table_records`): K keys
   (`--table-keys`, default 100,000: the generator's pages, which the events join, then filler
   pages), one version each with a `section` (and a `title` nothing reads), valid from a day
   before the events;
2. ceiling: a bare aiokafka `getmany` loop + `orjson.loads` over the same topic;
3. one worker (`python -m lambdactl speed`, a subprocess) from offset 0 until every fence reaches
   the end: sustained events/s between the first fence seen and the last one reaching the end;
4. Redis memory: `MEMORY USAGE` of every cell key over the (cell, key) states they hold, and
   of cells + de-dup ids per 1M events;
5. with `--expressions`: the worker again over the same topic from offset 0 (its own consumer
   group and Redis database, `--expr-redis-db`, default 12, flushed), with the bench's metric
   `views_by_page` given a `where` that keeps every event and two computed `fields` used as its
   key and value (`with_expressions`), then once more without them: `expr_ratio` is the
   expressions' events/s over the mean of the two plain runs (step 3's and this one), so a
   machine that gets busier or quieter meanwhile biases it less;
5b. with `--lookups`: likewise a worker whose `views_by_page` joins the table
   (`with_lookup`: `lookups: [{table: pages, on: page, as: p}]`, keyed by
   `section: COALESCE(p.section, 'none')`, its value and aggregations kept), then a plain one
   again: `lookup_ratio` is its events/s over the mean of the plain runs around it (the last
   plain run before it and this one). The worker reads the whole table before its first
   batch; its events/s starts at its first applied batch, as every run's does, so the read is
   not in it. The read is timed to the worker's `event=tables_read` log line when the log has
   it; either way, `lookup_first_batch_s` and `plain_first_batch_s` (from each worker's start
   to its first applied batch, the plain run's after it) differ by about the read's time;
5c. with `--sessions`: likewise a worker with a session metric beside the bench's metrics
   (`SESSION_METRIC`: sessions per user, gap 30m, cut at 4h, rule 13), then a plain one again:
   `session_ratio` is its events/s over the mean of the plain runs around it. No batch run
   publishes in the bench, so W stays None and the worker holds every accepted event of the
   session metric (the held events a run would let it drop from W on);
6. with `--peers`: the engines users would pick instead (`bench/peers`), one after the other
   over the same topic from its beginning, each under a fresh application id: Kafka Streams
   `at_least_once`, Kafka Streams `exactly_once_v2` and quix-streams (at-least-once);
6b. with `--workers N`: N workers in one consumer group (the partitions split between them)
   over the same topic from its beginning, in a Redis database and group of their own, timed
   as step 3 (their CPU summed): what the machine's other core gives, since one worker is one
   Python process (the GIL holds it to ~one core) where Kafka Streams with one stream thread
   keeps more cores busy (its producer, RocksDB, the JVM's collectors). The local broker
   assigns at once (`group.initial.rebalance.delay.ms` 0), so the group's rebalance as the
   later workers join falls inside the figure;
7. freshness: background load at `--rate` events/s plus one probe event every 100 ms on its own
   page; time from produce to the probe's count being visible through `GET /series`.

With `--profile DIR`, after steps 5-6 each kind of worker measured (plain, then with
expressions, with the lookup) runs once more, not measured, under py-spy from its start until
it caught up: `DIR/speed-<plain|expr|lookup>.txt`, collapsed stacks by thread, idle samples
included (so the event loop's blocking waits show).

The worker of step 3 stays up, idle, through steps 5-6 (step 7 uses it; its CPU meanwhile is
logged). Steps 5-6 run before step 7, which adds events to the topic.

Ends with one line:
`BENCH speed events_per_s=<n> ceiling_per_s=<n> ratio=<r> [kstreams_per_s=<n>
kstreams_eos_per_s=<n> quix_per_s=<n> vs_kstreams=<r> vs_kstreams_eos=<r> vs_quix=<r>]
[expr_events_per_s=<n> expr_ratio=<r>] [lookup_events_per_s=<n> lookup_ratio=<r>
lookup_first_batch_s=<s> plain_first_batch_s=<s> [lookup_table_read_s=<s>]]
[session_events_per_s=<n> session_ratio=<r>] [workers=<n> workers_per_s=<n>
workers_ratio=<r> [workers_vs_kstreams=<r>]]
freshness_p50_ms=<n> freshness_p99_ms=<n> redis_bytes_per_cell=<n> broker_cpu_s=<s>
broker_rss_mb=<n>` (on one line; the broker's figures cover the worker's run; `vs_<peer>` is
the worker's events/s over the peer's; `expr_ratio` as in step 5, the `lookup_` fields as in
step 5b).

## The peers (`--peers`), and what each does that the other does not

Each peer computes, per page, 1-minute tumbling windows on event time (`ts`) with count, sum,
min and max of `latency_ms`, in a RocksDB window store with a changelog topic, on one thread.
The worker computes more for the same events: two metrics (`views_by_page` with avg,
`distinct(user_id)` and `quantiles(latency_ms)` too, over 1m, 1h and 1d windows, and
`views_total`), so its figure is the heavier job.

The worker, and neither peer: de-duplication by event id (rule 4 of docs/semantics.md); late
events published once to the `<topic>.late` side topic (the peers only count them); HLL
(`distinct`) and KLL (`quantiles`) sketches; several windows and metrics from one read;
exactly-once effect into Redis through per-partition fences (rule 3); no repartition: each
source partition's cells are kept apart (sub-cells) and merged when read, so lateness is judged
per source partition.

Kafka Streams, and not the worker: a repartition by key (every record written to and read back
from a `-repartition` topic), a local RocksDB window store with its changelog (the state is
restored on another instance after a failure), standby replicas and elastic scaling by tasks,
and with `exactly_once_v2` Kafka transactions around consume-process-produce (commit every
100 ms). Its clock stops when the N-th record is aggregated, in the store's cache: unlike the
worker's, it does not wait for the last commit (up to 30 s later with `at_least_once`).
Records reach the aggregation in bursts (one thread feeds the repartition topic, then reads it
back), so its progress per second is uneven; only the whole run's figure is meaningful.

quix-streams, and not the worker: a repartition by key (`group_by`), a RocksDB window store
with its changelog, and exactly-once through Kafka transactions (not measured here). Its clock
also stops at the N-th record aggregated.

**Grace.** The peers get `--peer-grace-s` (default 3 h, longer than the topic's whole
event-time span), not the metric's 2 minutes, and drop nothing. Their repartition mixes the
four source partitions into one stream time per task (Kafka Streams) or per key (quix), and one
thread reads a partition in chunks of thousands of records, up to ~25 minutes of event time
ahead of the others; with a 2-minute grace they dropped 60-75% of the records as late, varying
from run to run, and so did a fraction of the work. With no drops they aggregate the late (2%)
and duplicate (2%) records the worker discards: slightly more work than the worker's. The log
shows each one's late count beside the worker's (its `.late` topic).

**Warm-up.** The worker's events/s starts at its first applied batch (up to
`speed.max_poll_records`, 20,000 records, already processed); each peer's on the BENCH line
likewise starts once that many records were aggregated or dropped (`warm_events_per_s`). That
skips their start-up as well: the first fetches of the repartition topic they just created, and
for Kafka Streams the JIT's first compilations (its first 20,000 records take several seconds).
The log shows each peer's figure from its first record too.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import statistics
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, NamedTuple

import orjson
import psycopg
import redis
import yaml
from confluent_kafka import Producer
from psycopg import sql

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench import peers
from bench.broker_usage import BrokerUsage
from bench.common import SESSION_METRIC, log
from bench.peers import PeerRun
from lambdactl.generator import PAGES, GeneratorSpec, SampleRecord, generate, produce
from shared.config import Settings
from shared.kafka import create_topics
from shared.speed_view.keys import cell_pattern, fence_key, ids_pattern
from tests.conftest import platform_config
from tests.speed.support import end_offsets

MINUTE = 60_000


def build_config(
    tag: str,
    partitions: int,
    stack: Settings,
    redis_db: int,
    speed: dict[str, Any],
    quantiles: bool = True,
    expressions: bool = False,
    lookups: bool = False,
    sessions: bool = False,
) -> dict[str, Any]:
    base, _, _ = stack.postgres.url.rpartition("/")
    rbase, _, _ = stack.redis.url.rpartition("/")
    platform = platform_config(tag, partitions, quantiles=quantiles)
    if expressions:
        platform["metrics"] = [with_expressions(m) for m in platform["metrics"]]
    if lookups:
        platform["tables"] = [
            {
                "name": "pages",
                "topic": table_topic(tag),
                "key_field": "page",
                "time_field": "valid_from",
                "partitions": 1,
            }
        ]
        platform["metrics"] = [with_lookup(m) for m in platform["metrics"]]
    if sessions:
        platform["metrics"] = [*platform["metrics"], SESSION_METRIC]
    return {
        **platform,
        "kafka": {"bootstrap_servers": stack.kafka.bootstrap_servers},
        "redis": {"url": f"{rbase}/{redis_db}"},
        "postgres": {"url": f"{base}/lp_bench_{tag}"},
        "speed": {"app_id": f"bench-{tag}", "session_timeout_s": 6.0, **speed},
    }


def with_expressions(metric: dict[str, Any]) -> dict[str, Any]:
    """`views_by_page` with a `where` and two computed fields as its key and value (rule 10 in
    docs/semantics.md); the `where` keeps every bench event, so both runs count the same."""
    if metric["name"] != "views_by_page":
        return metric
    return {
        **metric,
        "where": "latency_ms >= 0 AND page <> '/nope'",
        "fields": {
            "section": "CASE WHEN page LIKE '/page/%' THEN 'pages' ELSE page END",
            "latency_s": "latency_ms / 1000",
        },
        "key": ["section"],
        "value": "latency_s",
    }


def with_lookup(metric: dict[str, Any]) -> dict[str, Any]:
    """`views_by_page` joined with the table `pages` (rule 11 in docs/semantics.md) and keyed
    by the joined version's section, its value and aggregations kept."""
    if metric["name"] != "views_by_page":
        return metric
    return {
        **metric,
        "lookups": [{"table": "pages", "on": "page", "as": "p"}],
        "fields": {"section": "COALESCE(p.section, 'none')"},
        "key": ["section"],
    }


SECTIONS = ["news", "sport", "tech", "culture", "business", "travel", "science", "opinion"]


def table_topic(tag: str) -> str:
    """`--lookups`: the table's topic."""
    return f"pages-{tag}"


def table_records(keys: int, valid_from: int) -> Iterator[SampleRecord]:
    """`--lookups`: the table: `keys` keys, the generator's pages (the keys events join) then
    filler pages `/page/<n>` no event reads, one version each valid from `valid_from`."""
    for i in range(keys):
        page = PAGES[i] if i < len(PAGES) else f"/page/{i - len(PAGES) + 40}"
        value = {
            "page": page,
            "section": SECTIONS[i % len(SECTIONS)],
            "title": f"Page {i}",
            "valid_from": valid_from,
        }
        yield SampleRecord(page.encode(), orjson.dumps(value))


def produce_table(bootstrap: str, tag: str, keys: int, valid_from: int) -> int:
    """`--lookups`: produce the table (`table_records`)."""
    return produce(bootstrap, table_topic(tag), table_records(keys, valid_from))


def measure_ceiling(bootstrap: str, topic: str, ends: dict[int, int]) -> float:
    """Events/s of a bare aiokafka getmany loop with orjson over the whole topic."""
    from aiokafka import AIOKafkaConsumer
    from aiokafka.structs import TopicPartition as ATP

    async def run() -> float:
        consumer = AIOKafkaConsumer(
            bootstrap_servers=bootstrap,
            enable_auto_commit=False,
            max_poll_records=10_000,
            max_partition_fetch_bytes=4 * 1024 * 1024,
        )
        await consumer.start()
        try:
            tps = [ATP(topic, p) for p in ends]
            consumer.assign(tps)
            await consumer.seek_to_beginning(*tps)
            total, want = 0, sum(ends.values())
            started = time.perf_counter()
            loads = orjson.loads
            while total < want:
                batches = await consumer.getmany(timeout_ms=1000, max_records=10_000)
                for records in batches.values():
                    for record in records:
                        loads(record.value)
                    total += len(records)
            return total / (time.perf_counter() - started)
        finally:
            await consumer.stop()

    return asyncio.run(run())


def fences(client: redis.Redis, topic: str, partitions: int) -> list[int]:
    raw = [client.hget(fence_key(topic, p), "offset") for p in range(partitions)]
    return [-1 if v is None else int(v) for v in raw]


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process so far (Linux `/proc`)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class WorkerRun(NamedTuple):
    rate: float
    """Events/s from the first applied batch until every fence is at the end."""
    workers: list[subprocess.Popen[bytes]]
    """The worker processes (one consumer group), still running."""
    first_batch_s: float
    """From the worker's start to its first applied batch (seen in its fences)."""
    marker_s: float | None
    """From the worker's start to `marker` in its log (None: not seen, or none asked)."""


def measure_worker(
    env: dict[str, str],
    client: redis.Redis,
    topic: str,
    ends: dict[int, int],
    timeout_s: float,
    log_path: str = "/tmp/bench-speed-worker.log",
    marker: str | None = None,
    profile: Path | None = None,
    processes: int = 1,
) -> WorkerRun:
    """Start a worker (or `processes` of them, one consumer group: the second core's share);
    events/s from the first applied batch until every fence is at the end (so its start-up,
    and the tables it reads before its first batch, are not in it). Also logs the workers'
    CPU time per event over the same span: on a busy machine it moves much less than events/s
    does; and when its first batch was applied and, given `marker`, when the first worker
    logged it (polled every 50 ms, as the fences). `profile`: py-spy samples the first worker
    from its start until it caught up, into that file (collapsed stacks)."""
    workers: list[subprocess.Popen[bytes]] = []
    try:
        for n in range(processes):
            workers.append(
                subprocess.Popen(
                    [sys.executable, "-m", "lambdactl", "speed"],
                    env=env,
                    stdout=subprocess.DEVNULL,
                    stderr=open(log_path if n == 0 else f"{log_path}.{n}", "wb"),  # noqa: SIM115
                )
            )
        return _follow(workers, client, topic, ends, timeout_s, log_path, marker, profile)
    except BaseException:
        for worker in workers:
            stop_worker(worker)
        raise


def _follow(
    workers: list[subprocess.Popen[bytes]],
    client: redis.Redis,
    topic: str,
    ends: dict[int, int],
    timeout_s: float,
    log_path: str,
    marker: str | None,
    profile: Path | None,
) -> WorkerRun:
    """`measure_worker` once the worker is started."""
    began = time.perf_counter()
    spy = None if profile is None else start_profile(workers[0].pid, profile)

    def cpu() -> float:
        return sum(cpu_seconds(w.pid) for w in workers)

    partitions = len(ends)
    deadline = time.monotonic() + timeout_s
    first: tuple[float, int] | None = None
    first_cpu = 0.0
    marker_s: float | None = None
    logged = ""
    want = [end - 1 for end in ends.values()]
    with open(log_path, encoding="utf-8", errors="replace") as worker_log:
        while time.monotonic() < deadline:
            current = fences(client, topic, partitions)
            now = time.perf_counter()
            if marker is not None and marker_s is None:
                logged = logged[-len(marker) :] + worker_log.read()
                if marker in logged:
                    marker_s = now - began
            done = sum(f + 1 for f in current)
            if first is None and done > 0:
                first = (now, done)
                first_cpu = cpu()
            if current == want:
                assert first is not None
                rate = (done - first[1]) / max(now - first[0], 1e-6)
                used = cpu() - first_cpu
                log(
                    f"worker CPU: {used / max(done - first[1], 1) * 1e6:.1f} us/event; first "
                    f"batch applied {first[0] - began:.1f} s after the worker's start"
                )
                if spy is not None:
                    stop_profile(spy)
                return WorkerRun(rate, workers, first[0] - began, marker_s)
            if any(w.poll() is not None for w in workers):
                raise RuntimeError(f"a worker exited; see {log_path}*")
            time.sleep(0.05)
    if spy is not None:
        stop_profile(spy)
    raise RuntimeError(f"worker did not catch up in {timeout_s}s: fences {current}, want {want}")


def start_profile(pid: int, out: Path) -> subprocess.Popen[bytes]:
    """py-spy sampling process `pid` (not pausing it) into `out`, as collapsed stacks, each
    under its thread's name, idle ones included (so the event loop's waits show too)."""
    spy = Path(sys.executable).with_name("py-spy")
    command = [str(spy), "record", "--pid", str(pid), "--nonblocking", "--format", "raw"]
    return subprocess.Popen(
        [*command, "--threads", "--idle", "--rate", "250", "--output", str(out)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


def stop_profile(spy: subprocess.Popen[bytes]) -> None:
    """Stop py-spy; it writes its file on SIGINT."""
    spy.send_signal(signal.SIGINT)
    try:
        spy.wait(30)
    except subprocess.TimeoutExpired:
        spy.kill()


VARIANTS = ("plain", "expr", "lookup", "session")
"""The reruns' metrics: the bench's own, `with_expressions`, `with_lookup` (with the table),
with `SESSION_METRIC` beside them."""


def rerun_worker(
    args: argparse.Namespace,
    tag: str,
    stack: Settings,
    speed: dict[str, Any],
    ends: dict[int, int],
    variant: str,
    profile: Path | None = None,
    processes: int = 1,
) -> WorkerRun:
    """Another worker's run over the same topic from offset 0, in a Redis database
    (`--expr-redis-db`, flushed) and consumer group of its own (`processes` workers in it),
    the workers stopped after it; `variant` (`VARIANTS`): its metrics. A `lookup` worker's
    table read is timed from its start to its `event=tables_read` log line. `profile`:
    py-spy's output (see `measure_worker`)."""
    assert variant in VARIANTS, variant
    config = build_config(
        tag,
        args.partitions,
        stack,
        args.expr_redis_db,
        speed,
        quantiles=not args.no_quantiles,
        expressions=variant == "expr",
        lookups=variant == "lookup",
        sessions=variant == "session",
    )
    name = variant if profile is None else f"{variant}-profiled"
    name += "" if processes == 1 else f"-x{processes}"
    config["speed"]["app_id"] = f"bench-{tag}-{name}"
    client = redis.Redis.from_url(config["redis"]["url"])
    client.flushdb()
    config_path = Path(f"/tmp/bench-speed-{tag}-{name}.yaml")
    config_path.write_text(yaml.safe_dump(config))
    env = {k: v for k, v in os.environ.items() if not k.startswith("LAMBDA_")}
    env["LAMBDA_CONFIG"] = str(config_path)
    topic = config["sources"][0]["topic"]
    run: WorkerRun | None = None
    try:
        run = measure_worker(
            env,
            client,
            topic,
            ends,
            timeout_s=600,
            log_path=f"/tmp/bench-speed-worker-{name}.log",
            marker="event=tables_read" if variant == "lookup" else None,
            profile=profile,
            processes=processes,
        )
    finally:
        for worker in [] if run is None else run.workers:
            stop_worker(worker)
        client.flushdb()
    return run


def measure_peers(
    bootstrap: str, topic: str, events: int, grace_ms: int, warmup: int
) -> dict[str, PeerRun]:
    """Kafka Streams (at_least_once, exactly_once_v2) and quix-streams, one after the other,
    each under a fresh application id from the topic's beginning."""
    given: dict[str, Any] = {
        "bootstrap": bootstrap,
        "topic": topic,
        "events": events,
        "grace_ms": grace_ms,
        "warmup_events": warmup,
        "timeout_s": 600 + events / 2000,
    }
    runs: dict[str, Callable[[], PeerRun]] = {
        "kstreams": lambda: peers.run_kstreams(
            **given, app_id=peers.fresh_app_id("bench-ks"), guarantee="at_least_once"
        ),
        "kstreams_eos": lambda: peers.run_kstreams(
            **given, app_id=peers.fresh_app_id("bench-ks-eos"), guarantee="exactly_once_v2"
        ),
        "quix": lambda: peers.run_quix(**given, app_id=peers.fresh_app_id("bench-quix")),
    }
    figures: dict[str, PeerRun] = {}
    for name, run in runs.items():
        figures[name] = result = run()
        log(
            f"{name}: {result.warm_events_per_s:,.0f} events/s after {result.warmup_events:,} "
            f"warm-up records ({result.events_per_s:,.0f} from the first record: "
            f"{result.seconds:.1f} s); {result.cpu_us_per_event:.1f} us CPU/event; "
            f"{result.aggregated:,} aggregated, {result.late:,} late"
        )
    counts = {name: {p: int(v[0]) for p, v in run.pages.items()} for name, run in figures.items()}
    if len({orjson.dumps(c, option=orjson.OPT_SORT_KEYS) for c in counts.values()}) > 1:
        log("peers: per-page counts DIFFER between the peers (see the late counts above)")
    else:
        log(f"peers: identical per-page counts over {len(counts['kstreams'])} pages")
    return figures


def late_records(bootstrap: str, topic: str, partitions: int) -> int:
    """Records in `topic` (the source's `.late` side topic): what the worker dropped as late."""
    return sum(end_offsets(bootstrap, topic, partitions).values())


def stop_worker(worker: subprocess.Popen[bytes]) -> None:
    worker.terminate()
    try:
        worker.wait(30)
    except subprocess.TimeoutExpired:
        worker.kill()


def measure_freshness(
    settings: Settings, topic: str, rate: int, duration_s: float
) -> tuple[float, float]:
    """p50/p99 ms from produce to visible in GET /series, under `rate` events/s of load."""
    from fastapi.testclient import TestClient

    from serving_layer import create_app

    bootstrap = settings.kafka.bootstrap_servers
    stop = threading.Event()

    def load() -> None:
        producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})
        i, started = 0, time.perf_counter()
        while not stop.is_set():
            now_ms = int(time.time() * 1000)
            for _ in range(max(rate // 100, 1)):
                i += 1
                value = orjson.dumps(
                    {
                        "ts": now_ms,
                        "event_id": f"load-{i}",
                        "page": f"/page/{i % 40}",
                        "user_id": f"u{i % 5000}",
                        "latency_ms": 12.5,
                    }
                )
                producer.produce(topic, key=str(i).encode(), value=value)
            producer.poll(0)
            ahead = i / rate - (time.perf_counter() - started)
            if ahead > 0:
                time.sleep(ahead)
        producer.flush(10)

    loader = threading.Thread(target=load, daemon=True)
    loader.start()
    probe_producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 0})
    latencies: list[float] = []
    try:
        with TestClient(create_app(settings)) as api:
            deadline = time.monotonic() + duration_s
            n = 0
            while time.monotonic() < deadline:
                n += 1
                page = f"/probe/{uuid.uuid4().hex[:8]}"
                now_ms = int(time.time() * 1000)
                start_s = time.strftime("%Y-%m-%dT%H:%M:00Z", time.gmtime(now_ms / 1000 - 60))
                end_s = time.strftime("%Y-%m-%dT%H:%M:00Z", time.gmtime(now_ms / 1000 + 120))
                value = orjson.dumps(
                    {
                        "ts": now_ms,
                        "event_id": f"probe-{n}",
                        "page": page,
                        "user_id": "probe",
                        "latency_ms": 1.0,
                    }
                )
                sent = time.perf_counter()
                probe_producer.produce(topic, key=page.encode(), value=value)
                probe_producer.flush(5)
                while time.perf_counter() - sent < 10:
                    response = api.get(
                        "/v1/metrics/views_by_page/series",
                        params={"window": "1m", "start": start_s, "end": end_s, "page": page},
                    )
                    if response.status_code == 200 and response.json()["points"]:
                        latencies.append((time.perf_counter() - sent) * 1000)
                        break
                    time.sleep(0.005)
                time.sleep(0.1)
    finally:
        stop.set()
        loader.join(15)
    if not latencies:
        return float("nan"), float("nan")
    latencies.sort()
    p99 = latencies[min(len(latencies) - 1, int(len(latencies) * 0.99))]
    return statistics.median(latencies), p99


def redis_memory(client: redis.Redis, settings: Settings, events: int) -> tuple[float, float]:
    """(bytes per (cell, key) state, bytes of cells + ids per 1M events)."""
    cell_bytes = states = 0
    for metric in settings.plans.values():
        pattern = cell_pattern(metric.source.topic, metric.name, metric.version)
        for key in client.scan_iter(match=pattern, count=1000):
            cell_bytes += int(client.memory_usage(key, samples=0) or 0)
            states += int(client.hlen(key))
    topic = settings.sources[0].topic
    id_bytes = sum(
        int(client.memory_usage(k, samples=0) or 0)
        for k in client.scan_iter(match=ids_pattern(topic), count=1000)
    )
    per_cell = cell_bytes / max(states, 1)
    per_million = (cell_bytes + id_bytes) / max(events, 1) * 1_000_000
    log(
        f"redis: {states} states in {cell_bytes} bytes of cells, {id_bytes} bytes of ids "
        f"({per_cell:.0f} B/state; {per_million / 1e6:.1f} MB per 1M events)"
    )
    return per_cell, per_million


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small run (~5 minutes at most)")
    parser.add_argument("--events", type=int, default=None)
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--rate", type=int, default=10_000, help="freshness load, events/s")
    parser.add_argument("--redis-db", type=int, default=13)
    parser.add_argument("--skip-freshness", action="store_true")
    parser.add_argument(
        "--no-quantiles",
        action="store_true",
        help="the demo metrics without quantiles(latency_ms) (as measured before it existed)",
    )
    parser.add_argument(
        "--speed",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="a `speed:` setting for the worker, e.g. max_poll_records=5000 (repeatable)",
    )
    parser.add_argument(
        "--peers",
        action="store_true",
        help="also run Kafka Streams (at_least_once, exactly_once_v2) and quix-streams on the "
        "same topic (bench/peers; needs Java 17+ and Maven)",
    )
    parser.add_argument(
        "--workers",
        type=int,
        default=1,
        help="then also N workers in one consumer group over the same topic (the partitions "
        "split between them: what a second core gives)",
    )
    parser.add_argument(
        "--peer-grace-s",
        type=int,
        default=3 * 3600,
        help="the peers' grace: past the topic's event-time span, so they drop nothing "
        "(see the docstring)",
    )
    parser.add_argument(
        "--expressions",
        action="store_true",
        help="also measure the worker with a `where` and computed `fields` on its metric",
    )
    parser.add_argument(
        "--lookups",
        action="store_true",
        help="also measure the worker with its metric joined with a table (rule 11)",
    )
    parser.add_argument(
        "--table-keys", type=int, default=100_000, help="--lookups' table size (keys)"
    )
    parser.add_argument(
        "--sessions",
        action="store_true",
        help="also measure the worker with a session metric beside its metrics (rule 13)",
    )
    parser.add_argument(
        "--expr-redis-db",
        type=int,
        default=12,
        help="for the workers of --expressions and --lookups (flushed)",
    )
    parser.add_argument(
        "--profile",
        type=Path,
        default=None,
        metavar="DIR",
        help="then run each measured kind of worker once more under py-spy (not measured), "
        "writing DIR/speed-<plain|expr|lookup>.txt (collapsed stacks)",
    )
    args = parser.parse_args()
    if (args.expressions or args.lookups or args.sessions) and args.expr_redis_db == args.redis_db:
        parser.error("--expr-redis-db must differ from --redis-db")
    if args.peers:  # prepared before anything is measured; fails here if Java/Maven are missing
        started = time.perf_counter()
        try:
            peers.kstreams_jar()
            peers.quix_python()
        except peers.PeerError as exc:
            sys.exit(f"--peers: {exc}")
        log(f"peers ready in {time.perf_counter() - started:.1f}s")
    events = args.events or (300_000 if args.quick else 2_000_000)
    freshness_s = 20.0 if args.quick else 60.0

    from lambdactl.stack import stack_up
    from shared.db.migrate import upgrade

    stack = Settings()
    stack_up(stack)
    tag = uuid.uuid4().hex[:8]
    speed: dict[str, Any] = {}
    for item in args.speed:
        speed.update(yaml.safe_load(item.replace("=", ": ", 1)))
    config = build_config(
        tag, args.partitions, stack, args.redis_db, speed, quantiles=not args.no_quantiles
    )
    settings = Settings(**config)
    with psycopg.connect(stack.postgres.url, autocommit=True) as admin:
        admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(f"lp_bench_{tag}")))
    upgrade(settings.postgres.url)
    client = redis.Redis.from_url(settings.redis.url)
    client.flushdb()
    config_path = Path(f"/tmp/bench-speed-{tag}.yaml")
    config_path.write_text(yaml.safe_dump(config))
    env = {k: v for k, v in os.environ.items() if not k.startswith("LAMBDA_")}
    env["LAMBDA_CONFIG"] = str(config_path)
    create_topics(settings)
    topic = settings.sources[0].topic
    bootstrap = settings.kafka.bootstrap_servers
    worker: subprocess.Popen[bytes] | None = None
    try:
        now = int(time.time() * 1000) // MINUTE * MINUTE
        started = time.perf_counter()
        produced = produce(
            bootstrap, topic, generate(GeneratorSpec(now - 120 * MINUTE, now, events, seed=3))
        )
        log(f"produced {produced} events in {time.perf_counter() - started:.1f}s")
        if args.lookups:  # the table, before any worker starts: valid before every event
            create_topics(
                Settings(**build_config(tag, args.partitions, stack, 0, speed, lookups=True))
            )
            started = time.perf_counter()
            keys = produce_table(bootstrap, tag, args.table_keys, now - 24 * 60 * MINUTE)
            log(
                f"produced the table: {keys} keys (the generator's {len(PAGES)} pages among them) "
                f"in {time.perf_counter() - started:.1f}s"
            )
        ends = end_offsets(bootstrap, topic, args.partitions)
        ceiling = measure_ceiling(bootstrap, topic, ends)
        log(f"ceiling (aiokafka getmany + orjson): {ceiling:,.0f} events/s")
        with BrokerUsage() as broker:
            rate, (worker,), _, _ = measure_worker(env, client, topic, ends, timeout_s=600)
        log(f"broker during the worker's run: {broker.figures()}")
        log(f"worker: {rate:,.0f} events/s sustained ({rate / ceiling:.3f} of the ceiling)")
        per_cell, _ = redis_memory(client, settings, produced)
        late = late_records(bootstrap, settings.sources[0].late_topic, args.partitions)
        log(f"worker: {late:,} records late (published to the .late topic)")
        idle_cpu = cpu_seconds(worker.pid)
        extra = ""
        last_plain = rate
        if args.expressions:  # plain, with expressions, plain again: drift cancels out
            expr_rate = rerun_worker(args, tag, stack, speed, ends, "expr").rate
            again = rerun_worker(args, tag, stack, speed, ends, "plain").rate
            plain = (last_plain + again) / 2
            log(
                f"worker with where + computed fields: {expr_rate:,.0f} events/s; plain again: "
                f"{again:,.0f}; {expr_rate / plain:.3f} of the plain runs' mean"
            )
            extra += f"expr_events_per_s={expr_rate:.0f} expr_ratio={expr_rate / plain:.3f} "
            last_plain = again
        if args.lookups:  # likewise between two plain runs
            looked = rerun_worker(args, tag, stack, speed, ends, "lookup")
            after = rerun_worker(args, tag, stack, speed, ends, "plain")
            plain = (last_plain + after.rate) / 2
            read_s = looked.marker_s
            log(
                f"worker with a lookup ({args.table_keys:,}-key table): {looked.rate:,.0f} "
                f"events/s; plain again: {after.rate:,.0f}; {looked.rate / plain:.3f} of the "
                f"plain runs' mean. Its table read: "
                + ("no event=tables_read line seen" if read_s is None else f"{read_s:.1f} s")
                + f" after its start; its first batch {looked.first_batch_s:.1f} s after it "
                f"(the plain worker's: {after.first_batch_s:.1f} s)"
            )
            extra += (
                f"lookup_events_per_s={looked.rate:.0f} lookup_ratio={looked.rate / plain:.3f} "
                f"lookup_first_batch_s={looked.first_batch_s:.1f} "
                f"plain_first_batch_s={after.first_batch_s:.1f} "
            )
            if read_s is not None:
                extra += f"lookup_table_read_s={read_s:.1f} "
        if args.sessions:  # likewise between two plain runs
            sessioned = rerun_worker(args, tag, stack, speed, ends, "session").rate
            again = rerun_worker(args, tag, stack, speed, ends, "plain").rate
            plain = (last_plain + again) / 2
            log(
                f"worker with a session metric beside its metrics: {sessioned:,.0f} events/s; "
                f"plain again: {again:,.0f}; {sessioned / plain:.3f} of the plain runs' mean"
            )
            extra += f"session_events_per_s={sessioned:.0f} session_ratio={sessioned / plain:.3f} "
            last_plain = again
        if args.peers:
            figures = measure_peers(
                bootstrap,
                topic,
                sum(ends.values()),
                args.peer_grace_s * 1000,
                settings.speed.max_poll_records,
            )
            per_s = {name: run.warm_events_per_s for name, run in figures.items()}
            peer_fields = [f"{name}_per_s={v:.0f}" for name, v in per_s.items()]
            peer_fields += [f"vs_{name}={rate / v:.3f}" for name, v in per_s.items()]
            extra = " ".join(peer_fields) + " " + extra
        if args.workers > 1:  # the second core's share, after the peers: beside them in time
            scaled = rerun_worker(args, tag, stack, speed, ends, "plain", processes=args.workers)
            log(
                f"{args.workers} workers in one group: {scaled.rate:,.0f} events/s "
                f"({scaled.rate / ceiling:.3f} of the ceiling, {scaled.rate / rate:.2f}x one)"
            )
            extra += (
                f"workers={args.workers} workers_per_s={scaled.rate:.0f} "
                f"workers_ratio={scaled.rate / ceiling:.3f} "
            )
            if args.peers:
                extra += f"workers_vs_kstreams={scaled.rate / per_s['kstreams']:.3f} "
        if args.profile is not None:
            args.profile.mkdir(parents=True, exist_ok=True)
            measured = ["plain"] + ["expr"] * args.expressions + ["lookup"] * args.lookups
            measured += ["session"] * args.sessions
            for variant in measured:
                out = args.profile / f"speed-{variant}.txt"
                profiled = rerun_worker(args, tag, stack, speed, ends, variant, profile=out)
                log(f"{variant} worker under py-spy: {profiled.rate:,.0f} events/s; {out}")
        reruns = args.expressions or args.lookups or args.sessions or args.workers > 1
        if args.peers or reruns or args.profile:
            log(f"the idle worker used {cpu_seconds(worker.pid) - idle_cpu:.1f} CPU s meanwhile")
        p50 = p99 = float("nan")
        if not args.skip_freshness:
            with BrokerUsage() as fresh_broker:
                p50, p99 = measure_freshness(settings, topic, args.rate, freshness_s)
            log(f"freshness at {args.rate}/s: p50 {p50:.0f} ms, p99 {p99:.0f} ms")
            log(f"broker during the freshness phase: {fresh_broker.figures()}")
    finally:
        if worker is not None:
            stop_worker(worker)
        with psycopg.connect(stack.postgres.url, autocommit=True) as admin:
            admin.execute(
                sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(
                    sql.Identifier(f"lp_bench_{tag}")
                )
            )
    print(
        f"BENCH speed events_per_s={rate:.0f} ceiling_per_s={ceiling:.0f} "
        f"ratio={rate / ceiling:.3f} {extra}freshness_p50_ms={p50:.0f} freshness_p99_ms={p99:.0f} "
        f"redis_bytes_per_cell={per_cell:.0f} {broker.figures()}"
    )


if __name__ == "__main__":
    main()
