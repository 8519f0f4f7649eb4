"""The quix-streams peer of bench/speed.py: per page, 1-minute tumbling windows on event time
(the JSON field `ts`, epoch ms) with count, sum, min and max of `latency_ms`, in quix's RocksDB
window store with its changelog.

Runs in its own virtualenv (`bench/peers/.venv-quix`, made by `bench.peers.quix_python`), never
in the platform's: it imports nothing from this repository.

    python quix_peer.py --bootstrap HOST:PORT --topic T --events N --grace-ms G --app-id A
        [--guarantee at-least-once|exactly-once] [--timeout-s S] [--warmup-events W]

Reads the topic from the beginning as consumer group `--app-id`, times from the first record
read to the moment all `--events` records were aggregated or dropped as late (the window's
`on_late` callback), prints one JSON line and exits, deleting its internal topics and state.
With `--warmup-events W` it also times the rest of the run from the moment W records were
aggregated or dropped (`warm_events_per_s`: (N - W) / that time; `cpu_us_per_event`: the
process's CPU time over the same span per record).
"""

from __future__ import annotations

import argparse
import json
import logging
import shutil
import sys
import tempfile
import time
from typing import Any

from confluent_kafka.admin import AdminClient
from quixstreams import Application
from quixstreams.dataframe.windows import Count, Max, Min, Sum


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bootstrap", required=True)
    parser.add_argument("--topic", required=True)
    parser.add_argument("--events", type=int, required=True)
    parser.add_argument("--grace-ms", type=int, required=True)
    parser.add_argument("--app-id", required=True)
    parser.add_argument("--guarantee", default="at-least-once")
    parser.add_argument("--timeout-s", type=float, default=600.0)
    parser.add_argument("--warmup-events", type=int, default=0)
    args = parser.parse_args()

    state_dir = tempfile.mkdtemp(prefix="quix-peer-")
    app = Application(
        broker_address=args.bootstrap,
        consumer_group=args.app_id,
        auto_offset_reset="earliest",
        processing_guarantee=args.guarantee,
        state_dir=state_dir,
        loglevel="WARNING",
    )
    topic = app.topic(
        args.topic,
        value_deserializer="json",
        timestamp_extractor=lambda value, headers, timestamp, kind: value["ts"],
    )

    first = warm = done = 0.0
    warm_cpu = done_cpu = 0.0
    aggregated = late = 0
    windows: dict[tuple[Any, int], dict[str, Any]] = {}
    started = time.monotonic()

    def on_read(_value: Any) -> None:
        nonlocal first
        if not first:
            first = time.perf_counter()
        if time.monotonic() - started > args.timeout_s:
            app.stop()

    def finished() -> None:
        nonlocal warm, warm_cpu, done, done_cpu
        if aggregated + late == args.warmup_events:
            warm, warm_cpu = time.perf_counter(), time.process_time()
        if aggregated + late == args.events:
            done, done_cpu = time.perf_counter(), time.process_time()
            app.stop()

    def on_late(*_: Any) -> bool:
        nonlocal late
        late += 1
        finished()
        return False  # counted, not logged

    def on_window(row: dict[str, Any], key: Any, _ts: int, _headers: Any) -> None:
        nonlocal aggregated
        aggregated += 1
        windows[key, row["start"]] = row
        finished()

    sdf = app.dataframe(topic).update(on_read).group_by("page")
    sdf = (
        sdf.tumbling_window(duration_ms=60_000, grace_ms=args.grace_ms, on_late=on_late)
        .agg(count=Count(), sum=Sum("latency_ms"), min=Min("latency_ms"), max=Max("latency_ms"))
        .current()
    )
    sdf.update(on_window, metadata=True)
    try:
        app.run()
        if not done:
            sys.exit(
                f"only {aggregated} aggregated + {late} late of {args.events} records "
                f"in {args.timeout_s} s"
            )
        pages: dict[str, list[float]] = {}
        for (page, _start), row in windows.items():
            total = pages.setdefault(page, [0, 0.0, float("inf"), float("-inf")])
            total[0] += row["count"]
            total[1] += row["sum"]
            total[2] = min(total[2], row["min"])
            total[3] = max(total[3], row["max"])
        seconds = done - first
        warm_seconds = done - (warm or first)
        figures = {
            "peer": "quix",
            "guarantee": args.guarantee,
            "events": args.events,
            "aggregated": aggregated,
            "late": late,
            "seconds": seconds,
            "events_per_s": args.events / seconds,
            "warmup_events": args.warmup_events,
            "warm_seconds": warm_seconds,
            "warm_events_per_s": (args.events - args.warmup_events) / warm_seconds,
            "cpu_us_per_event": (done_cpu - warm_cpu) * 1e6 / (args.events - args.warmup_events),
            "pages": dict(sorted(pages.items())),
        }
        print(json.dumps(figures), flush=True)
    finally:
        shutil.rmtree(state_dir, ignore_errors=True)
        delete_internal_topics(args.bootstrap, args.app_id)


def delete_internal_topics(bootstrap: str, app_id: str) -> None:
    """quix names its repartition and changelog topics after the consumer group."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    internal = [t for t in admin.list_topics(timeout=10).topics if app_id in t]
    if internal:
        for future in admin.delete_topics(internal).values():
            try:
                future.result(30)
            except Exception as exc:  # a leftover topic is only untidy
                logging.warning("could not delete %s: %s", internal, exc)


if __name__ == "__main__":
    main()
