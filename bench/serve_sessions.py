"""Serving benchmark of a session metric (rule 13 in docs/semantics.md): one key's sessions and
a sessions series over a day, read from a view the real layers built.

    .venv/bin/python bench/serve_sessions.py [--quick] [--events N] [--profile DIR]

It brings up the local stack (`lambdactl.stack.stack_up`) and, in a PostgreSQL database, a
Redis database and a topic of its own (4 partitions), produces the sample generator's
pageviews keyed by user over the last 26 h (400k events, `--quick` 150k; 2% late by 15 min,
2% duplicates), runs a real full batch run over them with Spark, then starts a real speed
worker, which continues each key's sessions from the run's W on and applies the events after
it; the worker keeps running, idle, while the API is measured. The metric is
`bench.common.SESSION_METRIC` (sessions per user, gap 30m, cut at 4h: W lies about 4 h
before the newest event, so a day's sessions come from both views).

The API (one uvicorn worker) is then driven open loop from the same machine, the key of each
request drawn from the 500 users with the most events (the generator's users are Pareto
distributed: a few send most events, cut into sessions of up to 4 h; most send a few):

- `key_sessions`: `GET /v1/metrics/user_sessions/sessions` for one user over the last day
  (target p99 <= 20 ms at 200 req/s);
- `key_series`: `GET /v1/metrics/user_sessions/series?window=1h` for one user over the last
  day, 24 windows joining the metric's cells and its two parts' (target p99 <= 50 ms at
  100 req/s);
- `total_series`: the same series over every user (the metric's total), first request and
  p99 at 5 req/s (no target: reported);
- `top`: the users with the most sessions in the last whole day, closed loop.

`--sessions N` (the case of 1,000,000) ends the history 3 h earlier and, after the run,
produces N sessions of users of their own in those 3 h, after W: the total series then reads
the speed view's totals per bucket (rule 13) where it read every user's cells; it checks the
total counts them all, and prints the totals' Redis memory per bucket and partition beside a
key's cell.

Before measuring, it checks the answers are whole: every drawn user's sessions are listed
(none past `limit`), their sources include both views, and one user's series counts as many
sessions as its list holds. `--profile DIR` records the server with py-spy during each
scenario (`DIR/<scenario>.txt`)."""

from __future__ import annotations

import argparse
import gc
import os
import random
import sys
import tempfile
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import orjson
import psycopg
import redis
import uvloop
import yaml
from psycopg import sql

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from batch_layer import execute_run, spark_session  # noqa: E402
from bench.common import SESSION_METRIC, RawHttp, clock, free_port, log, with_db  # noqa: E402
from bench.serve import closed_loop, open_loop, profiled, start_server  # noqa: E402
from bench.speed import measure_worker, stop_worker  # noqa: E402
from lambdactl.generator import GeneratorSpec, SampleRecord, generate, produce  # noqa: E402
from lambdactl.stack import stack_up  # noqa: E402
from serving_layer.timefmt import format_time  # noqa: E402
from shared.config import Settings  # noqa: E402
from shared.db.connect import connect  # noqa: E402
from shared.db.migrate import upgrade  # noqa: E402
from shared.db.runs import RunRequest, queue_run  # noqa: E402
from shared.kafka import admin_client, create_topics  # noqa: E402
from shared.speed_view.keys import cell_pattern  # noqa: E402
from tests.conftest import drop_database  # noqa: E402
from tests.speed.support import end_offsets  # noqa: E402

MINUTE, HOUR, DAY = 60_000, 3_600_000, 86_400_000
PARTITIONS = 4
REDIS_DB = 12
DRAWN_USERS = 500
METRIC = SESSION_METRIC["name"]


def bench_config(topic: str, base: Settings, pg_url: str, redis_url: str) -> dict[str, Any]:
    """The session metric alone, over a source of its own."""
    return {
        "sources": [
            {"name": "pageviews", "topic": topic, "time_field": "ts", "partitions": PARTITIONS}
        ],
        "metrics": [SESSION_METRIC],
        "tables": [],
        "kafka": {"bootstrap_servers": base.kafka.bootstrap_servers},
        "redis": {"url": redis_url},
        "postgres": {"url": pg_url},
        "spark": base.spark.model_dump(),
    }


def produced(settings: Settings, newest: int, events: int) -> Counter[str]:
    """Produce the sample events of the 26 h before `newest`, keyed by user; their count per
    user (duplicates and late events included)."""
    users: Counter[str] = Counter()

    def counted(records: Iterator[SampleRecord]) -> Iterator[SampleRecord]:
        for record in records:
            users[record.key.decode()] += 1
            yield record

    spec = GeneratorSpec(newest - 26 * HOUR, newest, events, keyed_by_user=True)
    produce(settings.kafka.bootstrap_servers, settings.sources[0].topic, counted(generate(spec)))
    return users


SPEED_ERA = 3 * HOUR
"""With `--sessions`: the history ends this long before now, and the extra sessions fill it."""


def produced_sessions(settings: Settings, newest: int, sessions: int) -> int:
    """`sessions` sessions of users of their own (`s<i>`, 1 to 3 events a few minutes apart)
    over the `SPEED_ERA` before `newest`, after the history's W, produced in time order (so
    none is late) once the run is done: the speed era a total series reads. Returns the
    events produced."""
    rng = random.Random(11)
    events = []
    for i in range(sessions):
        first = newest - SPEED_ERA + rng.randrange(SPEED_ERA - 20 * MINUTE)
        at = first
        for n in range(1 + i % 3):
            events.append((at, i, n))
            at += rng.randrange(1_000, 5 * MINUTE)
    events.sort()

    def records() -> Iterator[SampleRecord]:
        for ts, i, n in events:
            body = {"ts": ts, "event_id": f"s{i}-{n}", "user_id": f"s{i}", "latency_ms": 10.0 + n}
            yield SampleRecord(f"s{i}".encode(), orjson.dumps(body))

    return produce(settings.kafka.bootstrap_servers, settings.sources[0].topic, records())


def totals_memory(store: redis.Redis, settings: Settings) -> str:
    """The Redis memory of the session metric's totals (the three rollups `[]`, the
    durations' multiset included) per bucket and partition, beside its keys' own cells per
    key, as `MEMORY USAGE` counts them."""
    totals: list[int] = []
    per_key: list[float] = []
    for plan in settings.plans.values():
        pattern = cell_pattern(plan.source.topic, plan.name, plan.version)
        for name in store.scan_iter(match=pattern, count=1000):
            used = int(store.memory_usage(name, samples=0) or 0)
            if plan.rollup is not None:
                totals.append(used)
            elif plan.session_part is None and (fields := store.hlen(name)):
                per_key.append(used / fields)
    per_total = sum(totals) / max(1, len(totals))
    return (
        f"totals_bytes_per_bucket_partition={per_total:.0f} totals_hashes={len(totals)} "
        f"key_cell_bytes_per_key={sum(per_key) / max(1, len(per_key)):.0f}"
    )


def full_run(settings: Settings) -> float:
    """A full batch run with Spark, as the scheduler starts one; its wall seconds (the Spark
    session's start-up included)."""
    began = time.monotonic()
    spark = spark_session(settings)
    with connect(settings.postgres.url, autocommit=True) as conn:
        run_id, _ = queue_run(conn, RunRequest("full"))
    summary = execute_run(settings, spark, run_id)
    spark.stop()
    log(f"full run: {summary}")
    return time.monotonic() - began


async def fetch_json(client: RawHttp, path: str) -> Any:
    status, body = await client.fetch(path)
    if status != 200:
        raise SystemExit(f"GET {path}: HTTP {status}: {body[:300]!r}")
    return orjson.loads(body)


async def whole_answers(client: RawHttp, day: dict[str, str], users: list[str]) -> str:
    """Every drawn user's sessions over the day (each answer within `limit`), where they come
    from, and one user's series against its list; stops the run if an answer is not whole."""
    sources: Counter[str] = Counter()
    counts = []
    for user in users:
        answer = await fetch_json(client, sessions_path(day, user))
        listed = answer["sessions"]
        if len(listed) >= SESSIONS_LIMIT:
            raise SystemExit(f"{user}: {len(listed)} sessions in a day, past the bench's limit")
        counts.append(len(listed))
        sources.update(s["source"] for s in listed)
    if set(sources) != {"batch", "speed"}:
        raise SystemExit(f"the day's sessions come from {dict(sources)}, not from both views")
    most = max(range(len(users)), key=counts.__getitem__)
    busiest, listed = users[most], counts[most]
    series = await fetch_json(client, series_path(day, busiest))
    in_series = sum(p["sessions"] for p in series["points"])
    if in_series != listed:
        raise SystemExit(f"{busiest}: the series counts {in_series} sessions, {listed} listed")
    counts.sort()
    return (
        f"check: {len(users)} users' sessions over the day: {sum(counts)} sessions "
        f"(median {counts[len(counts) // 2]} per user, most {counts[-1]}), "
        f"{sources['batch']} from the batch view and {sources['speed']} from the speed view; "
        f"{busiest}'s hourly series counts its {listed} sessions"
    )


SESSIONS_LIMIT = 1000
"""The `limit` of a key's sessions: far above a day's (with a 30 min gap a key has at most 48
sessions a day; the check stops the run if any answer reaches it)."""


def sessions_path(day: dict[str, str], user: str) -> str:
    query = {"start": day["start"], "end": day["end"], "user_id": user, "limit": SESSIONS_LIMIT}
    return f"/v1/metrics/{METRIC}/sessions?" + urlencode(query)


def series_path(day: dict[str, str], user: str | None) -> str:
    query = {"window": "1h", **day, **({} if user is None else {"user_id": user})}
    return f"/v1/metrics/{METRIC}/series?" + urlencode(query)


async def measure(
    args: argparse.Namespace, port: int, server_pid: int, newest: int, users: list[str]
) -> str:
    """Every scenario (see the module's doc); returns the BENCH line's fields."""
    rng = random.Random(7)
    scale = 0.5 if args.quick else 1.0
    profile = None if args.profile is None else Path(args.profile)
    if profile is not None:
        profile.mkdir(parents=True, exist_ok=True)
    start = -(-(newest - DAY) // HOUR) * HOUR
    day = {"start": format_time(start), "end": format_time(newest)}
    client = RawHttp("127.0.0.1", port)
    print(await whole_answers(client, day, users), flush=True)

    def key_sessions() -> str:
        return sessions_path(day, rng.choice(users))

    def key_series() -> str:
        return series_path(day, rng.choice(users))

    for _ in range(200):  # warm up: connections, plans, the batch point cache
        await client.get(key_sessions())
        await client.get(key_series())

    with profiled(profile, server_pid, 1, "key_sessions"):
        sessions_p99, sessions_rps, e1 = await open_loop(
            client, key_sessions, args.sessions_rate, 20 * scale
        )
    print(
        f"key_sessions (one user's sessions over a day): {args.sessions_rate:g} req/s offered, "
        f"{sessions_rps:.1f} achieved, p99 {sessions_p99:.1f} ms (target <= 20), errors {e1}",
        flush=True,
    )
    with profiled(profile, server_pid, 1, "key_series"):
        series_p99, series_rps, e2 = await open_loop(
            client, key_series, args.series_rate, 20 * scale
        )
    print(
        f"key_series (one user's sessions series, 1h x 24): {args.series_rate:g} req/s "
        f"offered, {series_rps:.1f} achieved, p99 {series_p99:.1f} ms (target <= 50), "
        f"errors {e2}",
        flush=True,
    )
    total = series_path(day, None)
    started = clock()
    answer = await fetch_json(client, total)
    total_first_ms = (clock() - started) * 1000
    counted = sum(p["sessions"] for p in answer["points"] if p["source"] == "speed")
    if counted < args.sessions:
        raise SystemExit(f"the total counts {counted} sessions after W, not {args.sessions}")
    print(f"check: the total series counts {counted} sessions in its speed windows", flush=True)
    with profiled(profile, server_pid, 1, "total_series"):
        total_p99, total_rps, e3 = await open_loop(
            client, lambda: total, args.total_rate, 20 * scale
        )
    print(
        f"total_series (every user, 1h x 24): first {total_first_ms:.0f} ms; "
        f"{args.total_rate:g} req/s offered, {total_rps:.1f} achieved, p99 {total_p99:.1f} ms, "
        f"errors {e3}",
        flush=True,
    )
    top = f"/v1/metrics/{METRIC}/top?" + urlencode(
        {"window": "1d", "at": format_time(newest - DAY), "by": "sessions", "n": 10}
    )
    top_rps, _, top_p99 = await closed_loop(
        lambda: RawHttp("127.0.0.1", port), lambda: top, 4, requests=int(100 * scale)
    )
    print(f"top (1d by sessions, 4 concurrent): {top_rps:.0f} req/s, p99 {top_p99:.1f} ms")
    client.close()
    return (
        f"sessions_rate={args.sessions_rate:g} sessions_achieved_rps={sessions_rps:.1f} "
        f"sessions_p99_ms={sessions_p99:.1f} series_rate={args.series_rate:g} "
        f"series_achieved_rps={series_rps:.1f} series_p99_ms={series_p99:.1f} "
        f"total_first_ms={total_first_ms:.0f} total_p99_ms={total_p99:.1f} "
        f"top_p99_ms={top_p99:.1f}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="150k events, shorter phases")
    parser.add_argument("--events", type=int, help="events produced (400k; --quick 150k)")
    parser.add_argument("--sessions-rate", type=float, default=200)
    parser.add_argument("--series-rate", type=float, default=100)
    parser.add_argument("--total-rate", type=float, default=20)
    parser.add_argument(
        "--sessions",
        type=int,
        default=0,
        help="sessions of users of their own produced after W (the issue's case: 1000000)",
    )
    parser.add_argument("--profile", metavar="DIR", help="py-spy the server per scenario")
    args = parser.parse_args()

    base = Settings()
    down = [s.name for s in stack_up(base) if not s.reachable]
    if down:
        raise SystemExit(f"services unreachable: {down}")
    tag = uuid.uuid4().hex[:8]
    dbname = f"lp_bench_sessions_{tag}"
    with psycopg.connect(base.postgres.url, autocommit=True) as admin:
        admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(dbname)))
    redis_url = with_db(base.redis.url, str(REDIS_DB))
    config = bench_config(
        f"bench-sessions-{tag}", base, with_db(base.postgres.url, dbname), redis_url
    )
    settings = Settings(**config)
    upgrade(settings.postgres.url)
    create_topics(settings)
    store = redis.Redis.from_url(redis_url)
    store.flushdb()
    try:
        run(args, settings, config, store)
    finally:
        store.flushdb()
        drop_database(base.postgres.url, dbname)
        source = settings.sources[0]
        topics = [source.topic, source.dlq_topic, source.late_topic]
        admin = admin_client(base)  # held until the deletions are done: its end cancels them
        for future in admin.delete_topics(topics, operation_timeout=30).values():
            future.result()


def run(
    args: argparse.Namespace, settings: Settings, config: dict[str, Any], store: redis.Redis
) -> None:
    newest = int(time.time() * 1000) // MINUTE * MINUTE
    events = args.events or (150_000 if args.quick else 400_000)
    began = time.monotonic()
    history_end = newest - SPEED_ERA if args.sessions else newest
    users = produced(settings, history_end, events)
    log(f"produced {sum(users.values())} records of {len(users)} users")
    produced_s = time.monotonic() - began
    run_s = full_run(settings)
    if args.sessions:
        extra = produced_sessions(settings, newest, args.sessions)
        log(f"produced {args.sessions} sessions after W ({extra} events)")
    topic = settings.sources[0].topic
    ends = end_offsets(settings.kafka.bootstrap_servers, topic, PARTITIONS)
    with tempfile.TemporaryDirectory() as tmp:
        config_path = Path(tmp) / "lambda.yaml"
        config_path.write_text(yaml.safe_dump(config))
        env = {k: v for k, v in os.environ.items() if not k.startswith("LAMBDA_")}
        env["LAMBDA_CONFIG"] = str(config_path)
        env["PYTHONPATH"] = str(ROOT)
        began = time.monotonic()
        caught_up = measure_worker(env, store, topic, ends, 600 + args.sessions // 1000)
        (worker,) = caught_up.workers
        try:
            log(
                f"load: produced in {produced_s:.0f} s, full run {run_s:.0f} s, the speed "
                f"worker caught up in {time.monotonic() - began:.0f} s "
                f"({caught_up.rate:,.0f} events/s)"
            )
            port = free_port()
            server = start_server(config_path, port, 1)
            try:
                gc.collect()
                gc.freeze()  # the generator's own GC pauses would be charged to the server
                drawn = [user for user, _ in users.most_common(DRAWN_USERS)]
                fields = uvloop.run(measure(args, port, server.pid, newest, drawn))
                memory = totals_memory(store, settings)
                print(
                    f"BENCH serve_sessions events={events} sessions_after_w={args.sessions} "
                    f"{fields} {memory}",
                    flush=True,
                )
            finally:
                server.terminate()
                server.wait(10)
        finally:
            stop_worker(worker)


if __name__ == "__main__":
    main()
