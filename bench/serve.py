"""Serving-layer benchmark: one uvicorn worker over real Redis + PostgreSQL holding a realistic
view, driven open loop (latency counted from each request's scheduled send time).

    .venv/bin/python bench/serve.py [--quick]

It brings up the local stack (`lambdactl.stack.stack_up`), loads a fresh PostgreSQL database
`lp_bench` and Redis database 11 directly in the stores' formats (10k keys, 4 source partitions,
count/sum/min/max/avg/distinct, W = newest event - 1 h - grace), starts the server as a
subprocess, then measures:

- `s1440`: the last day at 1m (1,440 cells straddling W) at a constant rate (target p99 <= 100 ms);
- `s60`: the last hour at 1m (60 speed cells) at a constant rate (target p99 <= 50 ms);
- `max_rps`: closed loop, concurrency 16, on the s60 query;
- `top_p99_ms`: `top` over a batch hour and over a speed minute, closed loop;
- `raw_ms`: the underlying PostgreSQL statement + Redis call of one s1440 request, and the
  ratio of an unloaded request's median latency to it;
- `broker_cpu_s`, `broker_rss_mb`: the local Kafka broker's CPU seconds and peak RSS meanwhile
  (queries never read Kafka: this is what an idle broker costs beside the server).

The load generator runs on the same machine as the server (here: 2 cores, shared)."""

from __future__ import annotations

import argparse
import asyncio
import gc
import os
import random
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import urlencode
from urllib.request import urlopen

import psycopg
import redis
import redis.asyncio as aioredis
import uvloop
import yaml
from prometheus_client.parser import text_string_to_metric_families
from psycopg import sql

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from batch_layer.publish import Publication, publish_full_generation  # noqa: E402
from bench.broker_usage import BrokerUsage  # noqa: E402
from lambdactl.stack import stack_up  # noqa: E402
from serving_layer.batch_view import SERIES_SQL  # noqa: E402
from serving_layer.merged_view import MergedView, split_starts  # noqa: E402
from serving_layer.timefmt import format_time  # noqa: E402
from shared.aggregations import CellState, encode_state, fold_inputs  # noqa: E402
from shared.config import Settings  # noqa: E402
from shared.db.cells import BatchCell  # noqa: E402
from shared.db.migrate import upgrade  # noqa: E402
from shared.speed_view import EPOCH_KEY, cell_key, encode_key, fence_key  # noqa: E402

MINUTE, HOUR, DAY = 60_000, 3_600_000, 86_400_000
GRACE = 2 * MINUTE
PARTITIONS = 4
KEYS = 10_000
HOT_KEYS = 50
REDIS_DB = 11
PG_DB = "lp_bench"


def bench_config(pg_url: str, redis_url: str, quantiles: bool = False) -> dict[str, Any]:
    """The benchmark's one metric; `quantiles` adds `quantiles(latency_ms)` to it."""
    aggregations = ["count", "sum", "min", "max", "avg", "distinct(user_id)"]
    if quantiles:
        aggregations.append("quantiles(latency_ms)")
    return {
        "sources": [
            {"name": "bench", "topic": "bench-views", "time_field": "ts", "partitions": PARTITIONS}
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
            }
        ],
        "redis": {"url": redis_url},
        "postgres": {"url": pg_url},
    }


def _with_db(url: str, name: str) -> str:
    return url.rpartition("/")[0] + "/" + name


def load_view(settings: Settings, newest: int, sparse_events: int, seed: int = 1) -> int:
    """Events for 10k keys (50 hot keys with events every minute of the last 26 h, the rest
    sparse), aggregated into batch cells up to W (every window) and speed sub-cells after W."""
    metric = settings.plans[settings.metrics[0].name]
    version = metric.version
    watermark = (newest - HOUR - GRACE) // MINUTE * MINUTE
    rng = random.Random(seed)
    first = newest - 26 * HOUR
    states: dict[tuple[int, int, str], list[tuple[float, str]]] = defaultdict(list)
    speed: dict[tuple[int, int, str], list[tuple[float, str]]] = defaultdict(list)

    def add(t: int, page: str, value: float, user: str) -> None:
        base_start = t - t % MINUTE
        if base_start + MINUTE <= watermark:
            for size in metric.windows_ms:
                states[(size, t - t % size, page)].append((value, user))
        else:
            speed[(base_start, rng.randrange(PARTITIONS), page)].append((value, user))

    def state_of(events: list[tuple[float, str]]) -> CellState:
        values = [v for v, _ in events]
        items = [values if i.number else [u for _, u in events] for i in metric.sketch_inputs]
        return fold_inputs(metric.kinds, None, values, items, len(events))

    for h in range(HOT_KEYS):
        page = f"/hot/{h}"
        for minute in range(first, newest, MINUTE):
            for _ in range(3):
                add(
                    minute + rng.randrange(MINUTE),
                    page,
                    rng.lognormvariate(4, 0.6),
                    f"u{rng.randrange(2000)}",
                )
    for _ in range(sparse_events):
        page = f"/page/{rng.randrange(KEYS - HOT_KEYS)}"
        add(
            rng.randrange(first, newest),
            page,
            rng.lognormvariate(4, 0.6),
            f"u{rng.randrange(20000)}",
        )

    rows = (
        BatchCell(metric.name, version, size, start, [page], 0, 0.0, None, None, [], []).with_state(
            state_of(events), metric.kinds
        )
        for (size, start, page), events in states.items()
    )
    publication = Publication(
        snapshot={"bench-views": {str(p): 0 for p in range(PARTITIONS)}},
        watermarks={metric.name: watermark},
        rebuild_from={"bench-views": {str(p): 0 for p in range(PARTITIONS)}},
        versions={metric.name: version},
    )
    with psycopg.connect(settings.postgres.url) as conn:
        _, written = publish_full_generation(conn, rows, [], ["bench"], publication)
        conn.commit()
        conn.execute("ANALYZE batch_cells")
        conn.commit()
    client = redis.Redis.from_url(settings.redis.url)
    client.flushdb()
    client.set(EPOCH_KEY, "bench")
    pipe = client.pipeline(transaction=False)
    for n, ((start, partition, page), events) in enumerate(speed.items()):
        pipe.hset(
            cell_key(metric.name, version, start, partition),
            encode_key([page]),
            encode_state(state_of(events)),
        )
        if n % 5000 == 4999:
            pipe.execute()
    for p in range(PARTITIONS):
        pipe.hset(fence_key("bench-views", p), mapping={"offset": 1000, "stream_time": newest})
    pipe.execute()
    print(
        f"loaded {written} batch cells, {len(speed)} speed sub-cells; W = "
        f"{format_time(watermark)}, newest event {format_time(newest)}",
        flush=True,
    )
    return watermark


class RawHttp:
    """A minimal keep-alive HTTP/1.1 GET client on asyncio streams (cheaper than httpx, so
    the load generator steals less CPU from the server it shares the cores with)."""

    def __init__(self, host: str, port: int) -> None:
        self.host, self.port = host, port
        self._idle: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = []

    async def get(self, path: str) -> int:
        reused = bool(self._idle)
        if reused:
            reader, writer = self._idle.pop()
        else:
            reader, writer = await asyncio.open_connection(self.host, self.port)
        try:
            writer.write(f"GET {path} HTTP/1.1\r\nHost: {self.host}\r\n\r\n".encode())
            head = await reader.readuntil(b"\r\n\r\n")
        except (OSError, asyncio.IncompleteReadError):
            writer.close()
            if not reused:
                raise
            return await self.get(path)  # the server closed an idle keep-alive connection
        status = int(head[9:12])
        length = 0
        for line in head.split(b"\r\n"):
            if line[:15].lower() == b"content-length:":
                length = int(line[15:])
        await reader.readexactly(length)
        self._idle.append((reader, writer))
        return status

    def close(self) -> None:
        for _, writer in self._idle:
            writer.close()


clock = time.perf_counter
"""Latencies use a precise clock: uvloop's `loop.time()` has millisecond resolution and is
cached for a whole loop iteration."""


def pct(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


async def open_loop(
    client: RawHttp, paths: Callable[[], str], rate: float, seconds: float
) -> tuple[float, float, int]:
    """Send at a constant rate; latency from each request's scheduled time, so a generator or
    a server that falls behind is charged for it. One scheduler fires each request at its
    time (creating every request's task up front took longer than the first sends' slots,
    which charged the generator's own start-up to the first ~100 requests). Returns
    (p99 ms, achieved req/s, errors)."""
    latencies: list[float] = []
    errors = 0

    async def one(scheduled: float) -> None:
        nonlocal errors
        try:
            status = await client.get(paths())
        except (OSError, asyncio.IncompleteReadError):
            status = 0
        if status != 200:
            errors += 1
        latencies.append((clock() - scheduled) * 1000)

    in_flight = []
    t0 = clock()
    for i in range(int(rate * seconds)):
        scheduled = t0 + i / rate
        delay = scheduled - clock()
        if delay > 0:
            await asyncio.sleep(delay)
        in_flight.append(asyncio.ensure_future(one(scheduled)))
    await asyncio.gather(*in_flight)
    elapsed = clock() - t0
    return pct(latencies, 0.99), len(latencies) / elapsed, errors


async def closed_loop(
    client_factory: Callable[[], RawHttp],
    paths: Callable[[], str],
    concurrency: int,
    seconds: float | None = None,
    requests: int | None = None,
) -> tuple[float, float, float]:
    """Each worker sends its next request when the previous answered. Returns
    (req/s, p50 ms, p99 ms)."""
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
                await client.get(paths())
                latencies.append((clock() - started) * 1000)
        finally:
            client.close()

    await asyncio.gather(*(worker() for _ in range(concurrency)))
    elapsed = clock() - t0
    return len(latencies) / elapsed, pct(latencies, 0.5), pct(latencies, 0.99)


SERIES_ROUTE = "/v1/metrics/{metric_name}/series"


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
        params = {
            "metric": metric.name,
            "version": version,
            "generation": generation,
            "x": stamp,
            "key": [page],
            "sizes": [MINUTE] * len(batch),
            "starts": list(batch),
            "needs": [metric.aggregations.needs_sketches(1)] * len(batch),
        }
        timings = []
        for _ in range(repeats):
            started = time.perf_counter()
            rows = await (await conn.execute(SERIES_SQL, params)).fetchall()
            await view.speed.read_key(
                metric.name, version, speed, MINUTE, PARTITIONS, encode_key([page])
            )
            timings.append((time.perf_counter() - started) * 1000)
        assert len(rows) == len(batch)
    await client.aclose()
    return statistics.median(timings)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_server(config_path: Path, port: int) -> subprocess.Popen[bytes]:
    code = (
        "from serving_layer import run_server\n"
        "from shared.config import load_settings\n"
        f"run_server(load_settings(), '127.0.0.1', {port})\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("LAMBDA_")}
    env["LAMBDA_CONFIG"] = str(config_path)
    env["PYTHONPATH"] = str(ROOT)
    server = subprocess.Popen([sys.executable, "-c", code], env=env, cwd=ROOT)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return server
        except OSError:
            time.sleep(0.1)
    server.kill()
    raise SystemExit("the server did not start")


async def measure(
    args: argparse.Namespace, port: int, newest: int, watermark: int, settings: Settings
) -> None:
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
    print(
        f"BENCH serve s1440_rate={args.s1440_rate} s1440_achieved_rps={s1440_rps:.1f} "
        f"s1440_p99_ms={s1440_p99:.1f} s60_rate={args.s60_rate} "
        f"s60_achieved_rps={s60_rps:.1f} s60_p99_ms={s60_p99:.1f} max_rps={max_rps:.0f} "
        f"top_p99_ms={top_p99:.1f} raw_ms={raw:.2f} ratio={request_ms / raw:.2f}",
        end=" ",
        flush=True,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="smaller data, shorter phases")
    parser.add_argument("--s1440-rate", type=float, default=100)
    parser.add_argument("--s60-rate", type=float, default=500)
    parser.add_argument(
        "--quantiles", action="store_true", help="the metric also keeps quantiles(latency_ms)"
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
        _with_db(base.postgres.url, PG_DB),
        _with_db(base.redis.url, str(REDIS_DB)),
        quantiles=args.quantiles,
    )
    settings = Settings(**config)
    upgrade(settings.postgres.url)
    newest = int(time.time() * 1000) // MINUTE * MINUTE
    started = time.monotonic()
    watermark = load_view(settings, newest, 150_000 if args.quick else 400_000)
    print(f"load took {time.monotonic() - started:.0f} s", flush=True)

    with tempfile.TemporaryDirectory() as tmp:
        config_path = Path(tmp) / "lambda.yaml"
        config_path.write_text(yaml.safe_dump(config))
        port = free_port()
        server = start_server(config_path, port)
        try:
            gc.collect()
            gc.freeze()  # the generator's own GC pauses would be charged to the server
            with BrokerUsage() as broker:
                uvloop.run(measure(args, port, newest, watermark, settings))
            print(broker.figures(), flush=True)
        finally:
            server.terminate()
            server.wait(10)


if __name__ == "__main__":
    main()
