"""Serving-layer benchmark: the API (one uvicorn worker, or `--workers N` processes) over real
Redis + PostgreSQL holding a realistic view, driven open loop (latency counted from each
request's scheduled send time).

    .venv/bin/python bench/serve.py [--quick] [--workers N] [--profile DIR]

It brings up the local stack (`lambdactl.stack.stack_up`), loads a fresh PostgreSQL database
`lp_bench` and Redis database 11 directly in the stores' formats (4 source partitions,
count/sum/min/max/avg/distinct, W = newest event - 1 h - grace) with two datasets:

- `views`: key [page], 10k keys (50 hot ones with events every minute of the last 26 h);
- `grid` and `grid_plain`: key [country, page], 100 x 100 = 10k keys, a few hundred thousand
  events spread evenly over the last 26 h; `grid` has `rollups: [[], [country]]`, `grid_plain`
  is the same metric without rollups. Every plan is loaded as the batch and speed layers store
  it: the rollups' cells (`grid[]`, `grid[country]`) are built from the same events with the key
  projected, under their own names and versions, and the served row carries every plan's W and
  version (`settings.plans`);

starts the server as a subprocess, then measures:

- `s1440`: the last day at 1m (1,440 cells straddling W) at a constant rate (target p99 <= 100 ms);
- `s60`: the last hour at 1m (60 speed cells) at a constant rate (target p99 <= 50 ms);
- `max_rps`: closed loop, concurrency 16, on the s60 query;
- `vs_bare`: the server CPU an s60 request costs beside what FastAPI alone costs. The body of
  one s60 answer is captured, and a bare FastAPI endpoint started in a process of its own
  (`bare_endpoint`: uvicorn as `run_server` runs the real app, one worker, uvloop + httptools,
  start-up objects frozen; one GET route at the series path answering those bytes as they are,
  with no store read, no merge, no serialization: routing + HTTP). Each is sent the same
  closed loop (16 concurrent, 3,000 s60 requests; `--quick` 1,500), the real server first,
  and each server's CPU seconds (user + system of its process and worker processes) are read
  before and after: `s60_cpu_ms` and `bare_cpu_ms` per request, `vs_bare_cpu` their ratio
  (target <= 2), `s60_closed_rps` and `bare_rps` the rates of those loops (answers other
  than 200, which cost less, are counted on the printed line). Two rungs between them, each
  the real app in a process of its own answering the same bytes canned (`canned_app`), say
  where the difference lies: `app_cpu_ms`, with its middlewares, error handlers, reader auth
  and routers; `params_cpu_ms`, the route under the series route's own signature (its query
  parameters and dependencies solved by FastAPI, then unused). What s60 costs past
  `params_cpu_ms` is the route's own work: both stores read, the merge and the answer;
- `top_p99_ms`: `top` over a batch hour and over a speed minute, closed loop;
- `raw_ms`: the underlying PostgreSQL statement + Redis call of one s1440 request, and the
  ratio of an unloaded request's median latency to it;
- `broker_cpu_s`, `broker_rss_mb`: the local Kafka broker's CPU seconds and peak RSS meanwhile
  (queries never read Kafka: this is what an idle broker costs beside the server);

then, on the grid dataset (issue #13), each a 1-hour series over the last day (24 points, the
window straddling W and the ones after it merged from both stores):

- a check: `grid`'s total (answered by the `grid[]` rollup) equals `grid_plain`'s total
  (merged over every key at query time), counts exactly; the run stops if not;
- `total_merged_first_ms`: that first `grid_plain` total (nothing of it cached yet);
- `total_rollup`: `grid`'s total at a constant rate (target p99 <= 20 ms at 200 req/s);
- `total_merged_warm_p99_ms`: `grid_plain`'s total at a constant rate, once warm (target
  p99 <= 100 ms; 5 req/s by default, half a core at the target's cost: at a rate past what
  one worker serves, the p99 measures the backlog, not a request);
- `total_merged_burst8_max_ms`: after a publication (the served row rewritten: every cached
  batch point stale), 8 identical `grid_plain` totals sent at once, as dashboards polling
  one query send them; the slowest one's latency;
- `group_by`: `grid` with `group_by=page` (100 groups; no rollup keeps `page`, so every full
  key is read), its first request and then a constant rate (target p99 <= 250 ms; 2 req/s
  by default, for the same reason);
- `s60_1000`: the s60 query at 1,000 req/s (target p99 <= 20 ms, >= 98% achieved);
- `sql` (between `vs_bare` and `top`): the s60 question as SQL (`measure_sql`): over HTTP,
  `sql_cpu_ms` beside `sql_http_cpu_ms` (the HTTP API's, the same closed loop back to back),
  `sql_vs_http_cpu` their ratio (target <= 1.3); in the wire protocol, a psycopg prepared
  statement on 8 connections at 200 req/s, `wire_p99_ms` beside `wire_http_p99_ms` (the HTTP
  API's s60 at the same rate), `wire_vs_http_p99` (target <= 1.5).

The newest event is placed so that W falls `W_MINUTE` minutes into an hour whatever the time of
the run (the cost of a merged series of hours depends on it). `serving.max_cells` is raised to
`GRID_MAX_CELLS`: merging every key's hourly cells over a day reads ~2 x 10^5 cells, past the
default limit of 50,000 (a 400). `--profile DIR` records the server with
py-spy (`DIR/<scenario>.txt`, folded stacks) during each grid scenario and s60_1000, and
during `vs_bare`'s loops (`s60_cpu`; `bare_cpu`, `app_cpu`, `params_cpu`: the rungs'
servers; their CPU is measured while sampled).

The load generator runs on the same machine as the server (here: 2 cores, shared)."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import inspect
import itertools
import math
import os
import random
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Awaitable, Callable, Iterator, Sequence
from datetime import UTC, datetime
from functools import partial
from pathlib import Path
from typing import Any
from urllib.parse import urlencode
from urllib.request import urlopen

import orjson
import psutil
import psycopg
import pyarrow as pa
import redis
import redis.asyncio as aioredis
import uvicorn
import uvloop
import yaml
from fastapi import APIRouter, FastAPI
from fastapi.responses import Response
from prometheus_client.parser import text_string_to_metric_families
from psycopg import sql

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from batch_layer.publish import Publication, publish_full_generation  # noqa: E402
from batch_layer.run_plan import CELL_SCHEMA  # noqa: E402
from bench.broker_usage import BrokerUsage  # noqa: E402
from bench.common import Errors, RawHttp, clock, free_port, pct, with_db  # noqa: E402
from lambdactl.stack import stack_up  # noqa: E402
from serving_layer import run_server  # noqa: E402
from serving_layer.auth import ReaderDep  # noqa: E402
from serving_layer.batch_view import SERIES_SQL, CellQuery  # noqa: E402
from serving_layer.merged_view import MergedView  # noqa: E402
from serving_layer.read_plan import split_starts  # noqa: E402
from serving_layer.routes import metrics  # noqa: E402
from serving_layer.served_row import ServedRow  # noqa: E402
from serving_layer.timefmt import format_time  # noqa: E402
from shared.aggregations import CellState, encode_state, fold_inputs  # noqa: E402
from shared.config import Settings, load_settings  # noqa: E402
from shared.db.cells import CELL_COLUMNS, BatchCell  # noqa: E402
from shared.db.migrate import upgrade  # noqa: E402
from shared.gc_tuning import freeze_startup_objects  # noqa: E402
from shared.metric_plan import MetricPlan, versions_of  # noqa: E402
from shared.speed_view import EPOCH_KEY, cell_key, encode_key, fence_key  # noqa: E402
from shared.windows import CellRef  # noqa: E402

MINUTE, HOUR, DAY = 60_000, 3_600_000, 86_400_000
GRACE = 2 * MINUTE
PARTITIONS = 4
KEYS = 10_000
HOT_KEYS = 50
REDIS_DB = 11
PG_DB = "lp_bench"
COUNTRIES = PAGES = 100
W_MINUTE = 30
"""The newest event is the last minute before now that puts W this many minutes into an hour,
so every run merges as much at query time: a series of hours recomputes the hour straddling W
and the hours after it on every request (from 62 to 121 minutes of cells, by W's minute)."""
Target = str | tuple[str, bytes]
"""A request of the load generator: a GET path, or a POST path and its JSON body."""
WIRE_RATE = 200
"""Requests per second of `sql`'s open loops: the wire protocol's prepared statement and
the HTTP API's s60, each alone."""
WIRE_CONNECTIONS = 8
GRID_MAX_CELLS = 1_000_000
"""`serving.max_cells` for the bench: a day of `grid_plain`'s total reads ~2 x 10^5 cells."""


def bench_config(
    pg_url: str, redis_url: str, quantiles: bool = False, pg_port: int | None = None
) -> dict[str, Any]:
    """The benchmark's metrics: `views` (`quantiles` adds `quantiles(latency_ms)` to it) and
    the grid pair, `grid` with rollups and `grid_plain` without, otherwise identical."""
    aggregations = ["count", "sum", "min", "max", "avg", "distinct(user_id)"]
    grid = {
        "source": "grid",
        "key": ["country", "page"],
        "value": "latency_ms",
        "aggregations": list(aggregations),
        "windows": ["1m", "1h", "1d"],
        "grace": "2m",
    }
    if quantiles:
        aggregations.append("quantiles(latency_ms)")
    return {
        "sources": [
            {"name": "bench", "topic": "bench-views", "time_field": "ts", "partitions": PARTITIONS},
            {"name": "grid", "topic": "bench-grid", "time_field": "ts", "partitions": PARTITIONS},
        ],
        "metrics": [
            {
                "name": "views",
                "source": "bench",
                "key": ["page"],
                "value": "latency_ms",
                "aggregations": aggregations,
                "windows": ["1m", "1h", "1d"],
                "grace": "2m",
            },
            {"name": "grid", **grid, "rollups": [[], ["country"]]},
            {"name": "grid_plain", **grid},
        ],
        "redis": {"url": redis_url},
        "postgres": {"url": pg_url},
        "serving": {"max_cells": GRID_MAX_CELLS, "pg_port": pg_port},
    }


class CellBuilder:
    """A metric's cells and its rollups' built from the same events, as the layers store them:
    batch cells of every window for the base cells ending at or before W, speed sub-cells
    per (base cell, source partition) after W. `plans` are the metric's plan and its rollups'
    (each under its own name and version, the key projected); `copies` are metrics defined
    like the first plan under another name, stored with the same states."""

    def __init__(
        self,
        plans: Sequence[MetricPlan],
        watermark: int,
        rng: random.Random,
        copies: Sequence[MetricPlan] = (),
    ) -> None:
        self.plans = plans
        self.watermark = watermark
        self.rng = rng
        self.copies = copies
        self.base = plans[0].base_window_ms
        self.batch: list[defaultdict[tuple[int, int, tuple[str, ...]], Inputs]] = [
            defaultdict(_inputs) for _ in plans
        ]
        self.speed: list[defaultdict[tuple[int, int, tuple[str, ...]], Inputs]] = [
            defaultdict(_inputs) for _ in plans
        ]
        self.events = 0

    def add(self, t: int, key: tuple[str, ...], value: float, user: str) -> None:
        self.events += 1
        base_start = t - t % self.base
        if base_start + self.base <= self.watermark:
            for plan, cells in zip(self.plans, self.batch, strict=True):
                projected = key if plan.rollup is None else plan.rollup.project(key)
                for size in plan.windows_ms:
                    values, users = cells[(size, t - t % size, projected)]
                    values.append(value)
                    users.append(user)
        else:  # one partition per event: a rollup regroups what its parent accepted there
            partition = self.rng.randrange(PARTITIONS)
            for plan, cells in zip(self.plans, self.speed, strict=True):
                projected = key if plan.rollup is None else plan.rollup.project(key)
                values, users = cells[(base_start, partition, projected)]
                values.append(value)
                users.append(user)

    @staticmethod
    def state_of(plan: MetricPlan, inputs: Inputs) -> CellState:
        values, users = inputs
        items = [values if i.number else users for i in plan.sketch_inputs]
        return fold_inputs(plan.kinds, None, values, items, len(values))

    def copies_of(self, plan: MetricPlan) -> tuple[MetricPlan, ...]:
        return (plan, *self.copies) if plan is self.plans[0] else (plan,)

    def batch_table(self) -> pa.Table:
        """Every batch cell, as a table of the `BatchCell` columns (what a batch run hands to
        `publish_full_generation`: COPY'd as Arrow-written CSV, ~3x faster than row by row)."""
        columns: list[list[Any]] = [[] for _ in CELL_COLUMNS]
        for plan, cells in zip(self.plans, self.batch, strict=True):
            targets = self.copies_of(plan)
            for (size, start, key), inputs in cells.items():
                cell = BatchCell(
                    plan.name, plan.version, size, start, list(key), 0, 0.0, None, None, [], []
                ).with_state(self.state_of(plan, inputs), plan.kinds)
                values = cell.columns()
                for target in targets:
                    columns[0].append(target.name)
                    columns[1].append(target.version)
                    for column, value in zip(columns[2:], values[2:], strict=True):
                        column.append(value)
        return pa.table(dict(zip(CELL_COLUMNS, columns, strict=True)), schema=CELL_SCHEMA)

    def speed_fields(self) -> Iterator[tuple[str, bytes, bytes]]:
        """(cell hash, field, state) of every speed sub-cell."""
        for plan, cells in zip(self.plans, self.speed, strict=True):
            topic = plan.source.topic
            for (start, partition, key), inputs in cells.items():
                field, state = encode_key(key), encode_state(self.state_of(plan, inputs))
                for target in self.copies_of(plan):
                    name = target.name
                    yield cell_key(topic, partition, name, target.version, start), field, state


Inputs = tuple[list[float], list[str]]
"""A cell's events: their values and their distinct field's values."""


def _inputs() -> Inputs:
    return [], []


def views_events(builder: CellBuilder, newest: int, sparse_events: int, rng: random.Random) -> None:
    """Events for 10k keys (50 hot keys with events every minute of the last 26 h, the rest
    sparse)."""
    first = newest - 26 * HOUR
    for h in range(HOT_KEYS):
        page = (f"/hot/{h}",)
        for minute in range(first, newest, MINUTE):
            for _ in range(3):
                builder.add(
                    minute + rng.randrange(MINUTE),
                    page,
                    rng.lognormvariate(4, 0.6),
                    f"u{rng.randrange(2000)}",
                )
    for _ in range(sparse_events):
        page = (f"/page/{rng.randrange(KEYS - HOT_KEYS)}",)
        builder.add(
            rng.randrange(first, newest),
            page,
            rng.lognormvariate(4, 0.6),
            f"u{rng.randrange(20000)}",
        )


def grid_events(builder: CellBuilder, newest: int, events: int, rng: random.Random) -> None:
    """`events` events over the last 26 h, each of a key of the 100 x 100 grid drawn evenly."""
    first = newest - 26 * HOUR
    countries = [f"c{c:02d}" for c in range(COUNTRIES)]
    pages = [f"/p/{p:02d}" for p in range(PAGES)]
    for _ in range(events):
        builder.add(
            rng.randrange(first, newest),
            (rng.choice(countries), rng.choice(pages)),
            rng.lognormvariate(4, 0.6),
            f"u{rng.randrange(20000)}",
        )


def load_view(settings: Settings, newest: int, sparse_events: int, grid_event_count: int) -> int:
    """Both datasets aggregated into batch cells up to W (every window) and speed sub-cells
    after W, for every plan (rollups included), published as one generation whose served row
    names every plan's W and version, as a full batch run publishes them."""
    plans = settings.plans
    watermark = (newest - HOUR - GRACE) // MINUTE * MINUTE
    began = time.monotonic()
    views = CellBuilder([plans["views"]], watermark, random.Random(1))
    views_events(views, newest, sparse_events, views.rng)
    grid_plans = [
        plans["grid"],
        *(p for p in plans.values() if p.rollup and p.rollup.parent == "grid"),
    ]
    grid = CellBuilder(grid_plans, watermark, random.Random(2), copies=[plans["grid_plain"]])
    grid_events(grid, newest, grid_event_count, grid.rng)
    built = time.monotonic()

    topics = {s.topic: {str(p): 0 for p in range(s.partitions)} for s in settings.sources}
    publication = Publication(
        snapshot=topics,
        watermarks={name: watermark for name in plans},
        rebuild_from=topics,
        versions=versions_of(plans.values()),
    )
    rows = pa.concat_tables([views.batch_table(), grid.batch_table()])
    folded = time.monotonic()
    with psycopg.connect(settings.postgres.url) as conn:
        _, written = publish_full_generation(
            conn, rows, [], [s.name for s in settings.sources], publication
        )
        conn.commit()
    published = time.monotonic()
    with psycopg.connect(settings.postgres.url, autocommit=True) as conn:
        # now (~1 s) rather than by autovacuum a minute or two later, during the measurements
        conn.execute("VACUUM (ANALYZE) batch_cells")
    vacuumed = time.monotonic()
    client = redis.Redis.from_url(settings.redis.url)
    client.flushdb()
    client.set(EPOCH_KEY, "bench")
    pipe = client.pipeline(transaction=False)
    sub_cells = 0
    for name, field, state in itertools.chain(views.speed_fields(), grid.speed_fields()):
        pipe.hset(name, field, state)
        sub_cells += 1
        if sub_cells % 5000 == 0:
            pipe.execute()
    for source in settings.sources:
        for p in range(source.partitions):
            pipe.hset(fence_key(source.topic, p), mapping={"offset": 1000, "stream_time": newest})
    pipe.execute()
    print(
        f"loaded {written} batch cells, {sub_cells} speed sub-cells of {len(plans)} plans "
        f"({', '.join(plans)}) from {views.events} + {grid.events} events; W = "
        f"{format_time(watermark)}, newest event {format_time(newest)} (the hour straddling W "
        f"holds {(watermark % HOUR) // MINUTE} min of batch cells); events grouped in "
        f"{built - began:.0f} s, batch states folded in {folded - built:.0f} s, PostgreSQL "
        f"{published - folded:.0f} s + VACUUM {vacuumed - published:.0f} s, speed states folded "
        f"and written to Redis {time.monotonic() - vacuumed:.0f} s",
        flush=True,
    )
    return watermark


async def open_loop(
    client: RawHttp, paths: Callable[[], Target], rate: float, seconds: float
) -> tuple[float, float, Errors]:
    """Send at a constant rate; latency from each request's scheduled time, so a generator or
    a server that falls behind is charged for it. One scheduler fires each request at its
    time (creating every request's task up front took longer than the first sends' slots,
    which charged the generator's own start-up to the first ~100 requests). Returns
    (p99 ms, achieved req/s, errors)."""
    latencies: list[float] = []
    errors = Errors()

    async def one(scheduled: float) -> None:
        try:
            status = await client.send(paths())
        except (OSError, asyncio.IncompleteReadError):
            status = 0
        if status != 200:
            errors[status] += 1
        latencies.append((clock() - scheduled) * 1000)

    elapsed = await paced(one, rate, seconds)
    return pct(latencies, 0.99), len(latencies) / elapsed, errors


async def paced(one: Callable[[float], Awaitable[None]], rate: float, seconds: float) -> float:
    """`one(scheduled)` started at each of `rate * seconds` times spaced evenly, by one
    scheduler; returns the seconds until the last one ended."""
    in_flight = []
    t0 = clock()
    for i in range(int(rate * seconds)):
        scheduled = t0 + i / rate
        delay = scheduled - clock()
        if delay > 0:
            await asyncio.sleep(delay)
        in_flight.append(asyncio.ensure_future(one(scheduled)))
    await asyncio.gather(*in_flight)
    return clock() - t0


async def closed_loop(
    client_factory: Callable[[], RawHttp],
    paths: Callable[[], Target],
    concurrency: int,
    seconds: float | None = None,
    requests: int | None = None,
    errors: Errors | None = None,
) -> tuple[float, float, float]:
    """Each worker sends its next request when the previous answered. Returns
    (req/s, p50 ms, p99 ms); answers other than 200 are counted in `errors`, if given."""
    latencies: list[float] = []
    t0 = clock()
    deadline = None if seconds is None else t0 + seconds
    remaining = [requests if requests is not None else 10**12]

    async def worker() -> None:
        client = client_factory()
        try:
            while remaining[0] > 0 and (deadline is None or clock() < deadline):
                remaining[0] -= 1
                started = clock()
                status = await client.send(paths())
                latencies.append((clock() - started) * 1000)
                if errors is not None and status != 200:
                    errors[status] += 1
        finally:
            client.close()

    await asyncio.gather(*(worker() for _ in range(concurrency)))
    elapsed = clock() - t0
    return len(latencies) / elapsed, pct(latencies, 0.5), pct(latencies, 0.99)


SERIES_ROUTE = "/v1/metrics/{metric_name}/series"
BURST = 8
"""Identical cold requests sent at once after a publication (`total_merged_burst`)."""


def series_histogram(port: int) -> dict[float, float]:
    """The server's own latency histogram of series requests: cumulative count per bound."""
    with urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        text = response.read().decode()
    return {
        float(sample.labels["le"]): sample.value
        for family in text_string_to_metric_families(text)
        if family.name == "lambda_serving_request_seconds"
        for sample in family.samples
        if sample.name.endswith("_bucket") and sample.labels.get("route") == SERIES_ROUTE
    }


def server_p99_bound_ms(before: dict[float, float], after: dict[float, float]) -> float:
    """The histogram bound under which 99% of the requests between two scrapes finished
    inside the server (from routing to the response's last byte; queueing not included)."""
    total = after[float("inf")] - before.get(float("inf"), 0)
    for bound in sorted(after):
        if after[bound] - before.get(bound, 0) >= 0.99 * total:
            return bound * 1000
    return float("inf")


async def raw_reads_ms(settings: Settings, newest: int, page: str, repeats: int = 30) -> float:
    """The PostgreSQL statement and the Redis call of one s1440 request without the point
    cache (all 1,380-odd batch cells read), timed alone."""
    metric = settings.plans[settings.metrics[0].name]
    client = aioredis.Redis.from_url(settings.redis.url)
    view = MergedView(settings, client)
    version = metric.version
    async with await psycopg.AsyncConnection.connect(
        settings.postgres.url, autocommit=True
    ) as conn:
        cursor = await conn.execute(
            "SELECT generation, (watermarks->>%s)::bigint, xmin::text FROM served_view",
            [metric.name],
        )
        served = await cursor.fetchone()
        assert served is not None
        generation, watermark, stamp = served
        batch, _, speed = split_starts(range(newest - DAY, newest, MINUTE), MINUTE, watermark)
        need = metric.aggregations.needs_sketches(1)
        query = CellQuery.one_key([page], {CellRef(MINUTE, start): need for start in batch})
        params = query.bound(metric.name, version, ServedRow(stamp, generation, watermark))
        timings = []
        for _ in range(repeats):
            started = time.perf_counter()
            rows = await (await conn.execute(SERIES_SQL, params)).fetchall()
            await view.speed.read_key(metric, speed, encode_key([page]))
            timings.append((time.perf_counter() - started) * 1000)
        assert len(rows) == len(batch)
    await client.aclose()
    return statistics.median(timings)


def start_server(config_path: Path, port: int, workers: int) -> subprocess.Popen[bytes]:
    return start_python(
        "from serving_layer import run_server\n"
        "from shared.config import load_settings\n"
        f"run_server(load_settings(), '127.0.0.1', {port}, workers={workers})\n",
        port,
        config_path,
    )


def start_python(code: str, port: int, config_path: Path | None) -> subprocess.Popen[bytes]:
    """A Python process running `code` from the repository (with the bench's config, if
    given, and no `LAMBDA_*` of this environment), once it listens on `port`."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("LAMBDA_")}
    if config_path is not None:
        env["LAMBDA_CONFIG"] = str(config_path)
    env["PYTHONPATH"] = str(ROOT)
    return listening(subprocess.Popen([sys.executable, "-c", code], env=env, cwd=ROOT), port)


def listening(server: subprocess.Popen[bytes], port: int) -> subprocess.Popen[bytes]:
    """`server` once it accepts connections on `port` (killed if not within 30 s)."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return server
        except OSError:
            time.sleep(0.1)
    server.kill()
    raise SystemExit("the server did not start")


CPU_CONCURRENCY = 16
CPU_REQUESTS = 3000
"""The closed loops of `vs_bare` (`--quick`: half the requests)."""


def bare_endpoint(port: int, body_file: str) -> None:
    """The bare endpoint of `vs_bare` (run in its own process): FastAPI under uvicorn as
    `run_server` runs the real app (one worker, uvloop + httptools, no access log, start-up
    objects frozen), one GET route at the series path answering the bytes in `body_file` as
    they are: routing and HTTP, no store read, no merge, no serialization."""
    body = Path(body_file).read_bytes()
    app = FastAPI()

    @app.get(SERIES_ROUTE)
    async def series(metric_name: str) -> Response:
        return Response(body, media_type="application/json")

    freeze_startup_objects(10_000)
    uvicorn.run(app, host="127.0.0.1", port=port, log_level="info", access_log=False)


def start_bare(body_file: Path, port: int) -> subprocess.Popen[bytes]:
    code = f"from bench.serve import bare_endpoint\nbare_endpoint({port}, {str(body_file)!r})\n"
    return start_python(code, port, None)


def canned_app(port: int, body_file: str, params: bool) -> None:
    """A rung of `vs_bare`'s ladder (run in its own process): the real app as `run_server`
    runs it (its middlewares, error handlers and reader auth; the settings of
    `LAMBDA_CONFIG`), with the series route answering the bytes in `body_file` as they are:
    with `params`, under the real route's signature (its query parameters and dependencies
    solved and validated by FastAPI, then unused), else with the path parameter alone."""
    body = Path(body_file).read_bytes()

    async def canned(**_: Any) -> Response:
        return Response(body, media_type="application/json")

    router = APIRouter(prefix=metrics.router.prefix, dependencies=[ReaderDep] if params else [])
    signature = inspect.signature(metrics.series, eval_str=True)
    if not params:
        signature = signature.replace(parameters=[signature.parameters["metric_name"]])
    canned.__signature__ = signature  # type: ignore[attr-defined]
    router.add_api_route(SERIES_ROUTE.removeprefix(metrics.router.prefix), canned)
    metrics.router = router  # what `create_app` includes
    settings = load_settings()  # the real server holds the wire protocol's port
    serving = settings.serving.model_copy(update={"pg_port": None})
    run_server(settings.model_copy(update={"serving": serving}), "127.0.0.1", port, workers=1)


def start_canned(
    config_path: Path, body_file: Path, port: int, params: bool
) -> subprocess.Popen[bytes]:
    code = f"from bench.serve import canned_app\ncanned_app({port}, {str(body_file)!r}, {params})\n"
    return start_python(code, port, config_path)


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of a process and of its live descendants (the worker
    processes, with `--workers`)."""
    root = psutil.Process(pid)
    total = 0.0
    for process in [root, *root.children(recursive=True)]:
        with contextlib.suppress(psutil.NoSuchProcess):
            times = process.cpu_times()
            total += times.user + times.system
    return total


async def server_cpu(
    port: int, pid: int, paths: Callable[[], Target], requests: int
) -> tuple[float, float, Errors]:
    """(server CPU ms per request, req/s, errors) of `requests` sent in a closed loop, 16
    concurrent."""
    errors = Errors()
    before = cpu_seconds(pid)
    rps, _, _ = await closed_loop(
        lambda: RawHttp("127.0.0.1", port), paths, CPU_CONCURRENCY, requests=requests, errors=errors
    )
    return (cpu_seconds(pid) - before) * 1000 / requests, rps, errors


async def measure_vs_bare(
    args: argparse.Namespace,
    port: int,
    server_pid: int,
    s60: Callable[[], str],
    config_path: Path,
) -> str:
    """`vs_bare` (see the module's doc): the s60 query's server CPU per request against a
    bare FastAPI endpoint answering the same body, and the ladder between them; returns its
    BENCH fields."""
    requests = int(CPU_REQUESTS * (0.5 if args.quick else 1.0))
    profile = None if args.profile is None else Path(args.profile)
    if profile is not None:
        profile.mkdir(parents=True, exist_ok=True)
    client = RawHttp("127.0.0.1", port)
    status, body = await client.fetch(s60())
    client.close()
    if status != 200:
        raise SystemExit(f"s60: HTTP {status}: {body[:300]!r}")
    with profiled(profile, server_pid, args.workers, "s60_cpu"):
        real_ms, real_rps, real_errors = await server_cpu(port, server_pid, s60, requests)
    with tempfile.TemporaryDirectory() as tmp:
        body_file = Path(tmp) / "s60.json"
        body_file.write_bytes(body)
        rungs = {
            "bare": partial(start_bare, body_file),
            "app": partial(start_canned, config_path, body_file, params=False),
            "params": partial(start_canned, config_path, body_file, params=True),
        }
        ladder = {
            rung: await canned_cpu(profile, rung, start, body, s60, requests)
            for rung, start in rungs.items()
        }
    (bare_ms, bare_rps, bare_errors), (app_ms, _, _), (params_ms, _, _) = ladder.values()
    ratio = real_ms / bare_ms
    print(
        f"vs_bare (closed loop, {CPU_CONCURRENCY} concurrent, {requests} s60 requests each; "
        f"bare: a FastAPI route answering the same {len(body)} B body): server CPU per request "
        f"{real_ms:.3f} ms vs {bare_ms:.3f} ms bare, {ratio:.2f}x (target <= 2x); "
        f"{real_rps:.0f} vs {bare_rps:.0f} req/s; errors {real_errors} vs {bare_errors}; "
        f"the ladder: the app's middlewares and auth +{app_ms - bare_ms:.3f} ms, the route's "
        f"parameters and dependencies +{params_ms - app_ms:.3f} ms, the route's reads, merge "
        f"and answer +{real_ms - params_ms:.3f} ms",
        flush=True,
    )
    return (
        f"s60_cpu_ms={real_ms:.3f} bare_cpu_ms={bare_ms:.3f} vs_bare_cpu={ratio:.2f} "
        f"app_cpu_ms={app_ms:.3f} params_cpu_ms={params_ms:.3f} "
        f"s60_closed_rps={real_rps:.0f} bare_rps={bare_rps:.0f}"
    )


async def canned_cpu(
    profile: Path | None,
    rung: str,
    start: Callable[[int], subprocess.Popen[bytes]],
    body: bytes,
    s60: Callable[[], str],
    requests: int,
) -> tuple[float, float, Errors]:
    """`server_cpu` of a server answering `body` canned (`start(port)`), checked, warmed up
    first as the real server is by then."""
    port = free_port()
    server = start(port)
    try:
        client = RawHttp("127.0.0.1", port)
        answer = await client.fetch(s60())
        client.close()
        if answer != (200, body):
            raise SystemExit(f"{rung} endpoint: HTTP {answer[0]}: {answer[1][:300]!r}")
        await closed_loop(lambda: RawHttp("127.0.0.1", port), s60, CPU_CONCURRENCY, requests=300)
        with profiled(profile, server.pid, 1, f"{rung}_cpu"):
            return await server_cpu(port, server.pid, s60, requests)
    finally:
        server.terminate()
        server.wait(10)


async def measure(
    args: argparse.Namespace,
    port: int,
    newest: int,
    watermark: int,
    settings: Settings,
    server_pid: int,
    config_path: Path,
) -> tuple[str, str]:
    """Every scenario; returns the BENCH line's head (the views scenarios) and tail (grid and
    s60_1000), which go either side of the broker's figures."""
    rng = random.Random(7)
    scale = 0.5 if args.quick else 1.0

    def series(span: int) -> Callable[[], str]:
        def path() -> str:
            query = {
                "window": "1m",
                "start": format_time(newest - span),
                "end": format_time(newest),
                "page": f"/hot/{rng.randrange(HOT_KEYS)}",
            }
            return "/v1/metrics/views/series?" + urlencode(query)

        return path

    client = RawHttp("127.0.0.1", port)
    for _ in range(3 * HOT_KEYS):  # warm up: connections, plans, hints, the batch cell cache
        await client.get(series(DAY)())
        await client.get(series(HOUR)())
    unloaded = []
    for _ in range(30):
        started = time.perf_counter()
        await client.get(series(DAY)())
        unloaded.append((time.perf_counter() - started) * 1000)
    request_ms = statistics.median(unloaded)

    s1440_p99, s1440_rps, e1 = await open_loop(client, series(DAY), args.s1440_rate, 20 * scale)
    print(
        f"s1440: {args.s1440_rate} req/s offered, {s1440_rps:.1f} achieved, "
        f"p99 {s1440_p99:.1f} ms, errors {e1}",
        flush=True,
    )
    before = series_histogram(port)
    s60_p99, s60_rps, e2 = await open_loop(client, series(HOUR), args.s60_rate, 20 * scale)
    inside = server_p99_bound_ms(before, series_histogram(port))
    print(
        f"s60: {args.s60_rate} req/s offered, {s60_rps:.1f} achieved, p99 {s60_p99:.1f} ms, "
        f"errors {e2}; inside the server p99 <= {inside:g} ms",
        flush=True,
    )
    max_rps, max_p50, max_p99 = await closed_loop(
        lambda: RawHttp("127.0.0.1", port), series(HOUR), 16, seconds=10 * scale
    )
    print(
        f"max (closed loop, 16 concurrent, s60 query): {max_rps:.0f} req/s, "
        f"p50 {max_p50:.1f} ms, p99 {max_p99:.1f} ms",
        flush=True,
    )
    vs_bare = await measure_vs_bare(args, port, server_pid, series(HOUR), config_path)
    sql_fields = await measure_sql(args, port, server_pid, newest, settings, series(HOUR))
    batch_hour = (watermark - 3 * HOUR) // HOUR * HOUR
    tops = [
        {"window": "1h", "at": format_time(batch_hour), "by": "count", "n": 10},
        {"window": "1h", "at": format_time(batch_hour), "by": "distinct_user_id", "n": 10},
        {"window": "1m", "at": format_time(newest - 10 * MINUTE), "by": "sum", "n": 10},
    ]
    top_rps, top_p50, top_p99 = await closed_loop(
        lambda: RawHttp("127.0.0.1", port),
        lambda: "/v1/metrics/views/top?" + urlencode(rng.choice(tops)),
        4,
        requests=int(150 * scale),
    )
    print(
        f"top (1h batch by count/distinct, 1m speed by sum; 4 concurrent): "
        f"{top_rps:.0f} req/s, p50 {top_p50:.1f} ms, p99 {top_p99:.1f} ms",
        flush=True,
    )
    client.close()
    raw = await raw_reads_ms(settings, newest, "/hot/1")
    print(
        f"one s1440 request: raw PostgreSQL + Redis reads {raw:.2f} ms; unloaded request "
        f"median {request_ms:.2f} ms",
        flush=True,
    )
    head = (
        f"BENCH serve workers={args.workers} s1440_rate={args.s1440_rate} "
        f"s1440_achieved_rps={s1440_rps:.1f} s1440_p99_ms={s1440_p99:.1f} s60_rate={args.s60_rate} "
        f"s60_achieved_rps={s60_rps:.1f} s60_p99_ms={s60_p99:.1f} max_rps={max_rps:.0f} "
        f"top_p99_ms={top_p99:.1f} raw_ms={raw:.2f} ratio={request_ms / raw:.2f} {vs_bare} "
        f"{sql_fields}"
    )
    return head, await measure_grid(
        args, port, newest, server_pid, series(HOUR), settings.postgres.url
    )


async def measure_sql(
    args: argparse.Namespace,
    port: int,
    server_pid: int,
    newest: int,
    settings: Settings,
    s60: Callable[[], str],
) -> str:
    """`sql`: the s60 question (one hot page's last hour at 1m) as SQL. Over HTTP
    (`POST /v1/sql`): its server CPU per request beside the HTTP API's for the same answer,
    in the same closed loop back to back (target <= 1.3x). In the wire protocol (a psycopg
    prepared statement, `WIRE_CONNECTIONS` connections): its p99 at `WIRE_RATE` req/s beside
    the HTTP API's s60 at the same rate (target <= 1.5x). Returns its BENCH fields."""
    rng = random.Random(11)
    start, end = newest - HOUR, newest
    columns = (
        "time_bucket('1m', ts) AS start, COUNT(*) AS count, SUM(latency_ms) AS sum, "
        "MIN(latency_ms) AS min, MAX(latency_ms) AS max, AVG(latency_ms) AS avg, "
        "APPROX_COUNT_DISTINCT(user_id) AS distinct_user_id"
    )
    where = f"ts >= '{format_time(start)}' AND ts < '{format_time(end)}'"

    def statement(page: str) -> str:
        return f"SELECT {columns} FROM views WHERE {where} AND page = '{page}' GROUP BY 1"

    def sql_request() -> Target:
        query = statement(f"/hot/{rng.randrange(HOT_KEYS)}")
        return "/v1/sql", orjson.dumps({"query": query, "format": "objects"})

    client = RawHttp("127.0.0.1", port)
    status, body = await client.fetch("/v1/sql", orjson.dumps({"query": statement("/hot/3")}))
    series_path = "/v1/metrics/views/series?" + urlencode(
        {"window": "1m", "start": format_time(start), "end": format_time(end), "page": "/hot/3"}
    )
    _, api = await client.fetch(series_path)
    client.close()
    rows, points = orjson.loads(body)["rows"], orjson.loads(api)["points"]
    if status != 200 or [r["count"] for r in rows] != [p["count"] for p in points]:
        raise SystemExit(f"sql: the answer differs from the HTTP API's: {body[:300]!r}")
    requests = int(CPU_REQUESTS * (0.5 if args.quick else 1.0))
    await closed_loop(
        lambda: RawHttp("127.0.0.1", port), sql_request, CPU_CONCURRENCY, requests=300
    )
    sql_ms, sql_rps, sql_errors = await server_cpu(port, server_pid, sql_request, requests)
    http_ms, http_rps, _ = await server_cpu(port, server_pid, s60, requests)
    seconds = 20 * (0.5 if args.quick else 1.0)
    http_p99, http_achieved, http_errors = await open_loop(
        RawHttp("127.0.0.1", port), s60, WIRE_RATE, seconds
    )
    wire_p99, wire_achieved, wire_errors = await wire_open_loop(
        settings.serving.pg_port, start, end, WIRE_RATE, seconds
    )
    print(
        f"sql (the s60 question): POST /v1/sql {sql_ms:.3f} ms of server CPU per request vs "
        f"{http_ms:.3f} ms for the HTTP API, {sql_ms / http_ms:.2f}x (target <= 1.3x; "
        f"{sql_rps:.0f} vs {http_rps:.0f} req/s closed loop, errors {sql_errors}); wire "
        f"protocol (psycopg prepared, {WIRE_CONNECTIONS} connections) at {WIRE_RATE} req/s: "
        f"p99 {wire_p99:.1f} ms ({wire_achieved:.1f} achieved, errors {wire_errors}) vs the "
        f"HTTP API's {http_p99:.1f} ms ({http_achieved:.1f}, errors {http_errors}), "
        f"{wire_p99 / http_p99:.2f}x (target <= 1.5x)",
        flush=True,
    )
    return (
        f"sql_cpu_ms={sql_ms:.3f} sql_http_cpu_ms={http_ms:.3f} "
        f"sql_vs_http_cpu={sql_ms / http_ms:.2f} wire_p99_ms={wire_p99:.1f} "
        f"wire_http_p99_ms={http_p99:.1f} wire_vs_http_p99={wire_p99 / http_p99:.2f}"
    )


async def wire_open_loop(
    pg_port: int | None, start: int, end: int, rate: float, seconds: float
) -> tuple[float, float, Errors]:
    """The s60 question as a psycopg prepared statement (a random hot page each time) at a
    constant rate over `WIRE_CONNECTIONS` connections, latency from each request's scheduled
    time. Returns (p99 ms, achieved req/s, errors: 0 for each failed statement)."""
    query = (
        "SELECT time_bucket('1m', ts) AS start, COUNT(*), SUM(latency_ms), MIN(latency_ms), "
        "MAX(latency_ms), AVG(latency_ms), APPROX_COUNT_DISTINCT(user_id) FROM views "
        "WHERE ts >= %s AND ts < %s AND page = %s GROUP BY 1"
    )
    bounds = (
        datetime.fromtimestamp(start / 1000, UTC),
        datetime.fromtimestamp(end / 1000, UTC),
    )
    dsn = f"host=127.0.0.1 port={pg_port} user=bench dbname=lambda"
    idle: asyncio.Queue[psycopg.AsyncConnection[Any]] = asyncio.Queue()
    for _ in range(WIRE_CONNECTIONS):
        conn = await psycopg.AsyncConnection.connect(dsn, autocommit=True)
        for page in range(HOT_KEYS):  # prepared on every connection before the clock starts
            await conn.execute(query, (*bounds, f"/hot/{page}"), prepare=True)
        idle.put_nowait(conn)
    rng = random.Random(13)
    latencies: list[float] = []
    errors = Errors()

    async def one(scheduled: float) -> None:
        conn = await idle.get()
        try:
            cursor = await conn.execute(
                query, (*bounds, f"/hot/{rng.randrange(HOT_KEYS)}"), prepare=True
            )
            await cursor.fetchall()
        except psycopg.Error:
            errors[0] += 1
        finally:
            idle.put_nowait(conn)
        latencies.append((clock() - scheduled) * 1000)

    elapsed = await paced(one, rate, seconds)
    while not idle.empty():
        await idle.get_nowait().close()
    return pct(latencies, 0.99), len(latencies) / elapsed, errors


def day_of_hours(newest: int) -> dict[str, str]:
    """The last day as 24 one-hour windows: from `newest - 24 h` rounded up to the hour (the
    last window is the hour `newest` falls in)."""
    start = -(-(newest - DAY) // HOUR) * HOUR
    return {"window": "1h", "start": format_time(start), "end": format_time(newest)}


def check_totals(rolled: dict[str, Any], merged: dict[str, Any]) -> str:
    """The rollup's total against the total merged over every key: the same windows, W,
    sources, counts, min and max; sums and averages to a relative 1e-9; distinct counts are
    reported (a rollup's sketch is built from the events, the merged one by unions)."""
    problems = []
    for field in ("batch_watermark", "speed_status"):
        if rolled[field] != merged[field]:
            problems.append(f"{field}: {rolled[field]} != {merged[field]}")
    a, b = rolled["points"], merged["points"]
    if len(a) != 24 or len(b) != 24:
        problems.append(f"{len(a)} and {len(b)} points, not 24")
    worst_distinct = 0.0
    for x, y in zip(a, b, strict=False):
        for field in ("start", "end", "source", "count", "min", "max"):
            if x[field] != y[field]:
                problems.append(f"{x['start']} {field}: {x[field]} != {y[field]}")
        for field in ("sum", "avg"):
            if not math.isclose(x[field], y[field], rel_tol=1e-9):
                problems.append(f"{x['start']} {field}: {x[field]} != {y[field]}")
        d1, d2 = x["distinct_user_id"], y["distinct_user_id"]
        worst_distinct = max(worst_distinct, abs(d1 - d2) / max(d1, d2, 1))
    if problems:
        raise SystemExit("grid total (rollup) != grid_plain total (merged): " + "; ".join(problems))
    sources = ",".join(
        f"{s}:{sum(p['source'] == s for p in a)}" for s in ("batch", "mixed", "speed")
    )
    return (
        f"check: grid's total (rollup grid[]) == grid_plain's total (merged over every key): "
        f"{len(a)} points ({sources}), {sum(p['count'] for p in a)} events, counts/min/max "
        f"equal, sum/avg within 1e-9; distinct_user_id differs by at most "
        f"{100 * worst_distinct:.2f}%"
    )


@contextlib.contextmanager
def profiled(directory: Path | None, pid: int, workers: int, name: str) -> Iterator[None]:
    """py-spy records the server process (with its worker processes, if several) while the
    block runs (folded stacks, one line per distinct stack, aggregated by function) into
    `directory/<name>.txt`; nothing without a directory."""
    if directory is None:
        yield
        return
    out = directory / f"{name}.txt"
    spy = subprocess.Popen(
        [
            str(Path(sys.executable).with_name("py-spy")),
            *("record", "--pid", str(pid), "--format", "raw", "--output", str(out)),
            *("--function", "--nonblocking", "--rate", "200"),
            *(["--subprocesses"] if workers > 1 else []),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    time.sleep(1.5)  # attached
    try:
        yield
    finally:
        spy.send_signal(signal.SIGINT)
        spy.wait(60)
        print(f"  profile: {out}; {profile_top(out)}", flush=True)


def profile_top(path: Path, n: int = 8) -> str:
    """The `n` functions the most samples were in (self time), with their share."""
    if not path.exists():
        return "no samples"
    own: defaultdict[str, int] = defaultdict(int)
    for line in path.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        own[stack.rsplit(";", 1)[-1]] += int(count)
    total = sum(own.values())
    ranked = sorted(own.items(), key=lambda item: -item[1])[:n]
    return f"{total} samples, self: " + ", ".join(
        f"{frame} {100 * samples / total:.0f}%" for frame, samples in ranked
    )


def republish(postgres_url: str) -> None:
    """A publication that changes no cell: the served row rewritten (a new stamp), as every
    run's publication rewrites it, so every cached batch point is stale."""
    with psycopg.connect(postgres_url, autocommit=True) as conn:
        conn.execute("UPDATE served_view SET generation = generation WHERE id = 1")


async def measure_grid(
    args: argparse.Namespace,
    port: int,
    newest: int,
    server_pid: int,
    s60: Callable[[], str],
    postgres_url: str,
) -> str:
    """The grid scenarios and s60_1000 (see the module's doc); returns their BENCH fields."""
    scale = 0.5 if args.quick else 1.0
    profile = None if args.profile is None else Path(args.profile)
    if profile is not None:
        profile.mkdir(parents=True, exist_ok=True)
    day = day_of_hours(newest)

    def path(metric: str, **extra: str) -> str:
        return f"/v1/metrics/{metric}/series?" + urlencode({**day, **extra})

    rolled_path, merged_path = path("grid"), path("grid_plain")
    grouped_path = path("grid", group_by="page")
    clients: list[RawHttp] = []

    async def fresh() -> RawHttp:
        """A client per phase, its first connection opened before the phase (an overloaded
        phase leaves hundreds of connections behind, which the server then closes)."""
        for old in clients:
            old.close()
        clients[:] = [RawHttp("127.0.0.1", port)]
        await clients[0].get("/v1/metrics")
        return clients[0]

    client = await fresh()

    with profiled(profile, server_pid, args.workers, "total_merged_first"):
        started = clock()
        status, merged_body = await client.fetch(merged_path)
        merged_first_ms = (clock() - started) * 1000
    if status != 200:
        raise SystemExit(f"grid_plain total: HTTP {status}: {merged_body[:300]!r}")
    status, rolled_body = await client.fetch(rolled_path)
    if status != 200:
        raise SystemExit(f"grid total: HTTP {status}: {rolled_body[:300]!r}")
    print(
        f"total_merged_first (grid_plain, 1h x 24 over every key, nothing cached): "
        f"{merged_first_ms:.0f} ms",
        flush=True,
    )
    print(check_totals(orjson.loads(rolled_body), orjson.loads(merged_body)), flush=True)

    def fixed(path: str) -> Callable[[], str]:
        return lambda: path

    before = series_histogram(port)
    with profiled(profile, server_pid, args.workers, "total_rollup"):
        rolled_p99, rolled_rps, e1 = await open_loop(
            await fresh(), fixed(rolled_path), args.total_rollup_rate, 20 * scale
        )
    rolled_inside = server_p99_bound_ms(before, series_histogram(port))
    print(
        f"total_rollup (grid, the rollup grid[]): {args.total_rollup_rate:g} req/s offered, "
        f"{rolled_rps:.1f} achieved, p99 {rolled_p99:.1f} ms, errors {e1}; inside the server "
        f"p99 <= {rolled_inside:g} ms",
        flush=True,
    )
    with profiled(profile, server_pid, args.workers, "total_merged_warm"):
        merged_p99, merged_rps, e2 = await open_loop(
            await fresh(), fixed(merged_path), args.merged_rate, 30 * scale
        )
    print(
        f"total_merged_warm (grid_plain): {args.merged_rate:g} req/s offered, "
        f"{merged_rps:.1f} achieved, p99 {merged_p99:.1f} ms, errors {e2}",
        flush=True,
    )
    republish(postgres_url)
    with profiled(profile, server_pid, args.workers, "total_merged_burst"):
        _, burst_p50, burst_max = await closed_loop(
            lambda: RawHttp("127.0.0.1", port), fixed(merged_path), BURST, requests=BURST
        )
    print(
        f"total_merged_burst (grid_plain): {BURST} identical requests at once after a "
        f"publication: p50 {burst_p50:.0f} ms, slowest {burst_max:.0f} ms",
        flush=True,
    )
    client = await fresh()
    with profiled(profile, server_pid, args.workers, "group_by_first"):
        started = clock()
        status, body = await client.fetch(grouped_path)
        grouped_first_ms = (clock() - started) * 1000
    groups = orjson.loads(body)["groups"] if status == 200 else []
    if status != 200 or len(groups) != PAGES or any(len(g["points"]) != 24 for g in groups):
        raise SystemExit(f"group_by=page: HTTP {status}: {body[:300]!r}")
    with profiled(profile, server_pid, args.workers, "group_by"):
        grouped_p99, grouped_rps, e3 = await open_loop(
            await fresh(), fixed(grouped_path), args.group_by_rate, 30 * scale
        )
    print(
        f"group_by (grid, group_by=page: {len(groups)} groups x 24 points, every full key): "
        f"first {grouped_first_ms:.0f} ms; {args.group_by_rate:g} req/s offered, "
        f"{grouped_rps:.1f} achieved, p99 {grouped_p99:.1f} ms, errors {e3}",
        flush=True,
    )
    before = series_histogram(port)
    with profiled(profile, server_pid, args.workers, "s60_1000"):
        high_p99, high_rps, e4 = await open_loop(await fresh(), s60, args.s60_1000_rate, 20 * scale)
    inside = server_p99_bound_ms(before, series_histogram(port))
    high_pct = 100 * high_rps / args.s60_1000_rate
    print(
        f"s60_1000: {args.s60_1000_rate:g} req/s offered, {high_rps:.1f} achieved "
        f"({high_pct:.1f}%), p99 {high_p99:.1f} ms, errors {e4}; inside the server p99 <= "
        f"{inside:g} ms",
        flush=True,
    )
    for old in clients:
        old.close()
    return (
        f"total_rollup_rate={args.total_rollup_rate:g} total_rollup_achieved_rps={rolled_rps:.1f} "
        f"total_rollup_p99_ms={rolled_p99:.1f} total_rollup_server_p99_ms={rolled_inside:g} "
        f"total_merged_first_ms={merged_first_ms:.0f} "
        f"total_merged_rate={args.merged_rate:g} total_merged_warm_p99_ms={merged_p99:.1f} "
        f"total_merged_burst{BURST}_max_ms={burst_max:.0f} "
        f"group_by_rate={args.group_by_rate:g} group_by_first_ms={grouped_first_ms:.0f} "
        f"group_by_p99_ms={grouped_p99:.1f} s60_1000_rate={args.s60_1000_rate:g} "
        f"s60_1000_achieved_rps={high_rps:.1f} s60_1000_achieved_pct={high_pct:.1f} "
        f"s60_1000_p99_ms={high_p99:.1f}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="smaller data, shorter phases")
    parser.add_argument("--s1440-rate", type=float, default=100)
    parser.add_argument("--s60-rate", type=float, default=500)
    parser.add_argument(
        "--quantiles", action="store_true", help="the metric also keeps quantiles(latency_ms)"
    )
    parser.add_argument("--total-rollup-rate", type=float, default=200)
    parser.add_argument("--merged-rate", type=float, default=5)
    parser.add_argument("--group-by-rate", type=float, default=2)
    parser.add_argument("--s60-1000-rate", type=float, default=1000)
    parser.add_argument(
        "--grid-events", type=int, help="events of the grid dataset (300k; --quick 150k)"
    )
    parser.add_argument(
        "--workers", type=int, default=1, help="API processes (`lambdactl serve --workers`)"
    )
    parser.add_argument(
        "--profile",
        metavar="DIR",
        help="py-spy the server during the grid and vs_bare scenarios into DIR",
    )
    args = parser.parse_args()

    base = Settings()
    states = stack_up(base)
    down = [s.name for s in states if not s.reachable]
    if down:
        raise SystemExit(f"services unreachable: {down}")
    with psycopg.connect(base.postgres.url, autocommit=True) as admin:
        admin.execute(
            sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(PG_DB))
        )
        admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(PG_DB)))
    config = bench_config(
        with_db(base.postgres.url, PG_DB),
        with_db(base.redis.url, str(REDIS_DB)),
        quantiles=args.quantiles,
        pg_port=free_port(),
    )
    settings = Settings(**config)
    upgrade(settings.postgres.url)
    now = int(time.time() * 1000) // MINUTE * MINUTE
    newest = now - (now - W_MINUTE * MINUTE - HOUR - GRACE) % HOUR
    started = time.monotonic()
    grid_events = args.grid_events or (150_000 if args.quick else 300_000)
    watermark = load_view(settings, newest, 150_000 if args.quick else 400_000, grid_events)
    print(f"load took {time.monotonic() - started:.0f} s", flush=True)

    with tempfile.TemporaryDirectory() as tmp:
        config_path = Path(tmp) / "lambda.yaml"
        config_path.write_text(yaml.safe_dump(config))
        port = free_port()
        server = start_server(config_path, port, args.workers)
        try:
            gc.collect()
            gc.freeze()  # the generator's own GC pauses would be charged to the server
            with BrokerUsage() as broker:
                head, tail = uvloop.run(
                    measure(args, port, newest, watermark, settings, server.pid, config_path)
                )
            print(head, broker.figures(), tail, flush=True)
        finally:
            server.terminate()
            server.wait(10)


if __name__ == "__main__":
    main()
