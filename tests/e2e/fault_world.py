"""The whole platform under faults (#14 item 1), the machinery the two fault tests share
(`test_platform_faults.py`: processes killed and the broker restarted;
`test_platform_store_faults.py`: PostgreSQL and Redis restarted and unreachable): a Kafka
broker, a Redis and a PostgreSQL of the test's own (so they can be stopped, restarted and
wiped), two speed workers, the API and the batch runner as `lambdactl` subprocesses, events
produced continuously (late, duplicate and malformed ones included) and a reader querying the
API throughout. Stopped means shut down: connections are refused.

During each fault no long-running process exits (those killed on purpose are restarted), the
API answers only what the contract allows (200; batch-only with `speed_status: "unavailable"`
while Redis is down; while PostgreSQL is down, series from the speed view from W on with
`batch_status: "unavailable"` (rule 12) and 503 with a message otherwise; refused connections
only while the API itself is down), and a batch-served point never changes while the served row
stays the same (rule 6: cells with `end <= W` change only with a run), nor does W move back.
After each, the producer pauses, the stream drains, an incremental run (queued through the
operator API) completes with every event in its snapshot, and every batch cell, every speed
cell after W and the merged 1m series equal the oracle over every event produced so far; per
base cell the merged view's count minus the oracle's gives the events lost (shortfalls) and
counted twice (excesses). The table printed at the end holds these per fault; all must be 0.
"""

from __future__ import annotations

import contextlib
import statistics
import subprocess
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
from confluent_kafka import KafkaError, Message, Producer

from lambdactl.generator import GeneratorSpec, SampleRecord, generate
from serving_layer.timefmt import format_time
from shared.config import Settings
from shared.db.connect import connect
from shared.db.migrate import upgrade
from shared.db.runs import list_runs
from shared.kafka import create_topics
from tests import oracle
from tests.batch.helpers import as_points, served_view
from tests.conftest import Platform, reconfigured
from tests.e2e.support import (
    MINUTE,
    free_port,
    kill_group,
    on_services,
    private_services,
    ready,
    series_mismatches,
    spawn,
    stop_group,
    until,
)
from tests.speed.support import speed_cells, wait_until_applied

RATE_PER_S = 200
"""Events produced per second while no check runs."""
TICK_S = 0.25
SERIES: tuple[tuple[str, dict[str, str]], ...] = (
    ("views_total", {}),
    ("views_by_page", {"page": "/"}),
)
"""What the reader queries and the check compares through the API: a total and one key."""


# -- the producer ------------------------------------------------------------------------------


class ContinuousProducer:
    """Produces generated events (late, duplicate and malformed ones included; keyed by event
    id, so copies share a partition) at `RATE_PER_S`, with event times around now, from a
    thread. Idempotent, `acks=all`; a record whose delivery failed (the broker restarting) is
    sent again until delivered, so the test's producer loses nothing itself. `pause` returns
    once everything produced so far is delivered."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        self.topic = topic
        self.producer = Producer(
            {
                "bootstrap.servers": bootstrap,
                "enable.idempotence": True,
                "acks": "all",
                "linger.ms": 20,
            }
        )
        self.delivered = 0
        self.resent = 0
        self._failed: list[SampleRecord] = []
        self._chunk = 0
        self._stop = threading.Event()
        self._pause = threading.Event()
        self._idle = threading.Event()
        self._thread = threading.Thread(target=self._run, name="producer", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def close(self) -> None:
        self._stop.set()
        self._thread.join(60)
        self._drain()

    def pause(self, timeout_s: float = 120) -> None:
        self._pause.set()
        assert self._idle.wait(timeout_s), "the producer did not deliver within 120 s"

    def resume(self) -> None:
        self._idle.clear()
        self._pause.clear()

    def send_all(self, records: Iterator[SampleRecord]) -> None:
        for record in records:
            self._send(record)
        self._drain()

    def _send(self, record: SampleRecord) -> None:
        def delivered(error: KafkaError | None, _message: Message) -> None:
            if error is None:
                self.delivered += 1
            else:
                self._failed.append(record)

        while True:
            try:
                self.producer.produce(
                    self.topic, key=record.key, value=record.value, on_delivery=delivered
                )
                return
            except BufferError:
                self.producer.poll(0.1)

    def _drain(self) -> None:
        while True:
            self.producer.flush(1.0)
            if not self._resend_failed() and len(self.producer) == 0:
                return

    def _resend_failed(self) -> bool:
        """Send again what the broker did not take; False when there was nothing."""
        failed, self._failed = self._failed, []
        self.resent += len(failed)
        for record in failed:
            self._send(record)
        return bool(failed)

    def _run(self) -> None:
        per_tick = int(RATE_PER_S * TICK_S)
        while not self._stop.is_set():
            if self._pause.is_set():
                self._drain()
                self._idle.set()
                self._stop.wait(0.05)
                continue
            began = time.monotonic()
            now = int(time.time() * 1000)
            self._chunk += 1
            spec = GeneratorSpec(
                now - int(TICK_S * 1000),
                now,
                per_tick,
                malformed_fraction=0.01,
                seed=10_000 + self._chunk,
            )
            for record in generate(spec):
                self._send(record)
            self.producer.poll(0)
            self._resend_failed()
            self._stop.wait(max(0.0, TICK_S - (time.monotonic() - began)))


# -- the reader --------------------------------------------------------------------------------


@dataclass
class Answer:
    started: float
    ended: float
    fault: str
    path: str
    status: int
    body: dict[str, Any]


@dataclass
class Reader:
    """Queries the API in a loop from a thread — `/v1/status`, the `SERIES`, `/v1/status`
    again — and keeps every answer. A series answered between two status answers naming the
    same served row (generation, `published_at`) was read from that row; its batch points
    (`source == "batch"`) must then be those of every other answer from the same row
    (`violations` otherwise), and a metric's W never moves back."""

    base: str
    fault: str = "setup"
    answers: list[Answer] = field(default_factory=list)
    violations: list[str] = field(default_factory=list)
    compared: int = 0
    """Batch points read again from the same served row (and found unchanged, or a violation)."""
    _points: dict[tuple[str, str], tuple[Any, dict[str, Any]]] = field(default_factory=dict)
    _watermarks: dict[str, str] = field(default_factory=dict)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._poll, name="reader", daemon=True)
        self._thread.start()

    def join(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(60)

    def _get(self, client: httpx.Client, path: str, params: dict[str, str]) -> Answer:
        started, fault = time.monotonic(), self.fault
        try:
            response = client.get(path, params=params)
        except httpx.HTTPError as exc:
            answer = Answer(started, time.monotonic(), fault, path, 0, {"error": str(exc)})
        else:
            try:
                body = response.json()
            except ValueError:
                body = {"text": response.text[:300]}
            answer = Answer(started, time.monotonic(), fault, path, response.status_code, body)
        self.answers.append(answer)
        return answer

    def _poll(self) -> None:
        now = int(time.time() * 1000) // MINUTE * MINUTE
        window = {
            "window": "1m",
            "start": format_time(now - 180 * MINUTE),
            "end": format_time(now + 60 * MINUTE),
        }
        with httpx.Client(base_url=self.base, timeout=20) as client:
            while not self._stop.wait(0.1):
                before = self._get(client, "/v1/status", {})
                series = [
                    self._get(client, f"/v1/metrics/{metric}/series", {**window, **key})
                    for metric, key in SERIES
                ]
                after = self._get(client, "/v1/status", {})
                stamp = _stamp(before)
                if stamp is not None and stamp == _stamp(after):
                    for answer in series:
                        if answer.status == 200:
                            self._check(stamp, answer)

    def _check(self, stamp: Any, answer: Answer) -> None:
        what = f"{answer.path} {answer.body.get('key')}"
        w = answer.body.get("batch_watermark")
        if w is not None:
            last = self._watermarks.get(what)
            if last is not None and w < last:
                self.violations.append(f"{answer.fault}: W of {what} moved back {last} -> {w}")
            self._watermarks[what] = w
        if answer.body.get("batch_status") == "unavailable":  # rule 12: windows from W only
            if w is None or any(
                p["start"] < w or p["source"] != "speed" for p in answer.body["points"]
            ):
                self.violations.append(
                    f"{answer.fault}: {what} speed-only answer with points "
                    f"before W or not from speed: {answer.body}"
                )
            return
        batch = {p["start"]: p for p in answer.body["points"] if p["source"] == "batch"}
        for start, point in batch.items():
            seen = self._points.get((what, start))
            if seen is not None and seen[0] == stamp:
                self.compared += 1
            if seen is not None and seen[0] == stamp and seen[1] != point:
                self.violations.append(
                    f"{answer.fault}: batch point {what} {start} changed without a run: "
                    f"{seen[1]} -> {point}"
                )
            self._points[(what, start)] = (stamp, point)
        for (path, start), (seen_stamp, point) in self._points.items():
            if path == what and seen_stamp == stamp and start not in batch:
                self.violations.append(
                    f"{answer.fault}: batch point {what} {start} vanished without a run: {point}"
                )


def _stamp(answer: Answer) -> tuple[Any, Any] | None:
    if answer.status != 200:
        return None
    return answer.body.get("generation"), answer.body.get("published_at")


# -- the platform ------------------------------------------------------------------------------


@dataclass
class Outages:
    """When each kind of answer was allowed: (start, end) monotonic intervals."""

    api_down: list[tuple[float, float]] = field(default_factory=list)
    pg_down: list[tuple[float, float]] = field(default_factory=list)
    """From PostgreSQL's stop until a few seconds (`SETTLE_S` of the store faults' test) after
    `/readyz` saw it back: the API's pools reconnect with a backoff of their own, so a request
    may find none for a moment yet."""
    redis_down: list[tuple[float, float]] = field(default_factory=list)
    """Strictly inside Redis's downtime: every series answer is batch-only."""


@dataclass
class Verdict:
    """A fault's API answers: how many, those the contract forbids and those it allows only
    during an outage (by status; 0: no answer), and how long each 503 took."""

    answers: int = 0
    errors: Counter[str] = field(default_factory=Counter)
    allowed: Counter[str] = field(default_factory=Counter)
    waits_503: list[float] = field(default_factory=list)


@dataclass
class Row:
    fault: str
    cells: int
    mismatches: int
    lost: int
    doubled: int
    recovery_s: float
    verdict: Verdict = field(default_factory=Verdict)


@dataclass
class World:
    platform: Platform
    managed: Settings
    api: str
    worker_platforms: dict[str, Platform]
    worker_metrics: dict[str, str]
    logs: Path
    processes: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    outages: Outages = field(default_factory=Outages)

    @property
    def settings(self) -> Settings:
        return self.platform.settings

    def start(self, name: str) -> None:
        """Start (or restart) one of the platform's processes by name."""
        log = self.logs / f"{name}.log"
        if name in self.worker_platforms:
            self.processes[name] = spawn(self.worker_platforms[name].env, ["speed"], log)
        elif name == "api":
            self.processes[name] = spawn(self.platform.env, ["serve"], log)
        else:
            self.processes[name] = spawn(
                self.platform.env, ["batch", "runner", "--no-schedule"], log
            )

    def kill(self, name: str) -> None:
        """kill -9 of one process (and what it started), which is then no longer watched."""
        process = self.processes.pop(name)
        kill_group(process)
        process.wait(30)

    def assert_alive(self) -> None:
        for name, process in self.processes.items():
            if process.poll() is not None:
                tail = (self.logs / f"{name}.log").read_text(errors="replace")[-3000:]
                raise AssertionError(f"the {name} exited with {process.returncode}:\n{tail}")

    @property
    def workers(self) -> list[subprocess.Popen[bytes]]:
        return [self.processes[name] for name in self.worker_platforms if name in self.processes]

    def queue_run(self, mode: str = "incremental") -> int:
        response = httpx.post(f"{self.api}/v1/batch/runs", json={"mode": mode}, timeout=30)
        assert response.status_code == 202, response.text
        run_id: int = response.json()["run_id"]
        return run_id

    def run_status(self, run_id: int) -> dict[str, Any]:
        with connect(self.settings.postgres.url, autocommit=True) as conn:
            runs = list_runs(conn, limit=100)
        run = next(r for r in runs if r.id == run_id)
        retry = next((r.id for r in runs if r.retry_of == run_id), None)
        return {"status": run.status, "error": run.error, "retry": retry}

    def wait_run(self, run_id: int, timeout_s: float = 180) -> None:
        """Until run `run_id` (or, when it failed, its retry) succeeded."""
        deadline = time.monotonic() + timeout_s
        while True:
            state = self.run_status(run_id)
            if state["status"] == "succeeded":
                return
            if state["status"] in ("failed", "cancelled") and state["retry"] is not None:
                run_id = state["retry"]
                continue
            assert state["status"] in ("queued", "running", "failed"), state
            assert time.monotonic() < deadline, f"run {run_id} not done: {state}"
            self.assert_alive()
            time.sleep(0.25)

    def recover(self, since: float | None = None) -> float:
        """Seconds since `since` (default: now) until `/readyz` is 200 and the speed view
        holds every record produced until now (and no rebuild is pending)."""
        began = time.monotonic() if since is None else since
        wait_until_applied(self.platform, timeout_s=120, workers=self.workers)
        until("/readyz", lambda: ready(self.api), 60)
        return time.monotonic() - began


@contextlib.contextmanager
def open_world(platform: Platform, tmp_path: Path) -> Iterator[World]:
    """The test's platform on a broker, a Redis and a PostgreSQL of its own, short backoffs."""
    with private_services(("kafka", "redis", "postgres")) as managed:
        upgrade(managed.postgres.url)
        api_port = free_port()
        own = on_services(platform, managed, serving={"port": api_port})
        ports = {name: free_port() for name in ("speed-1", "speed-2")}
        yield World(
            own,
            managed,
            f"http://127.0.0.1:{api_port}",
            {name: reconfigured(own, speed={"metrics_port": p}) for name, p in ports.items()},
            {name: f"http://127.0.0.1:{p}" for name, p in ports.items()},
            tmp_path,
        )


# -- the scenario --------------------------------------------------------------------------------

Fault = tuple[str, Callable[[World], float]]
"""A fault's name and what injects it: returns the seconds the platform took to recover."""


def ride_out(
    world: World, faults: list[Fault], capsys: pytest.CaptureFixture[str]
) -> dict[str, Verdict]:
    """History produced and a full run published, then the producer and the reader started and
    `faults` injected in turn, each followed by the check; the table is printed (also on a
    failure). Asserts what every fault must keep (nothing lost, doubled or mismatched, no answer
    the contract forbids, a reader that read throughout); returns the API answers' verdicts by
    fault for what a fault allows."""
    began = time.monotonic()
    settings = world.settings
    create_topics(settings)
    producer = ContinuousProducer(settings.kafka.bootstrap_servers, settings.sources[0].topic)
    now = int(time.time() * 1000) // MINUTE * MINUTE
    history = GeneratorSpec(now - 90 * MINUTE, now - 5 * MINUTE, 4000, malformed_fraction=0.01)
    producer.send_all(generate(history))
    for name in ("batch runner", "api", *world.worker_platforms):
        world.start(name)
    reader = Reader(world.api)
    rows: list[Row] = []
    try:
        until("the API answers", lambda: ready(world.api), 90)
        world.wait_run(world.queue_run("full"), timeout_s=240)
        world.recover()
        producer.start()
        reader.start()
        for name, inject in faults:
            reader.fault = name
            recovery = inject(world)
            world.assert_alive()
            cells, mismatches, lost, doubled = check(world, producer)
            rows.append(Row(name, cells, len(mismatches), lost, doubled, recovery))
            assert mismatches == [], f"{name}: " + "\n".join(mismatches[:20])
    finally:
        reader.join()
        producer.close()
        for process in world.processes.values():
            stop_group(process)
        verdicts = judge(reader.answers, world.outages)
        for row in rows:
            row.verdict = verdicts.get(row.fault, Verdict())
        with capsys.disabled():  # the table of the faults done so far, also on a failure
            print(_table(rows, time.monotonic() - began, reader, producer))
    assert reader.violations == [], "\n".join(reader.violations[:20])
    assert reader.compared >= 1000, f"the reader re-read few batch points: {reader.compared}"
    for row in rows:
        assert (row.mismatches, row.lost, row.doubled) == (0, 0, 0), row
        assert not row.verdict.errors, row
        assert row.verdict.answers >= 20, f"the reader hardly read during {row.fault}: {row}"
    return {row.fault: row.verdict for row in rows}


# -- the check after each fault ------------------------------------------------------------------


def check(world: World, producer: ContinuousProducer) -> tuple[int, list[str], int, int]:
    """Pause, drain, run, compare everything with the oracle over every event produced so far;
    returns (cells checked, mismatches, events lost, events counted twice)."""
    settings, config = world.settings, world.platform.config
    producer.pause()
    try:
        world.assert_alive()
        wait_until_applied(world.platform, timeout_s=120, workers=world.workers)
        world.wait_run(world.queue_run())
        records = oracle.read_topic(settings.kafka.bootstrap_servers, settings.sources[0].topic)
        served, stored = served_view(settings)
        speed = speed_cells(world.platform)
        series = _read_series(world)
    finally:
        producer.resume()
    assert len(records) == producer.delivered, "the broker lost or duplicated a record"
    assert served is not None
    topic = settings.sources[0].topic
    ends = {r.partition: r.offset + 1 for r in records}
    snapshot = {int(p): o for p, o in served.snapshot[topic].items()}
    partitions = range(settings.sources[0].partitions)
    assert [snapshot.get(p, 0) for p in partitions] == [ends.get(p, 0) for p in partitions]
    watermarks = {m: w or 0 for m, w in served.watermarks.items()}
    everything = oracle.compute_cells(config, records)
    non_late = oracle.compute_cells(config, records, late_rule=True, watermarks=watermarks)
    base = {m.name: m.base_window_ms for m in settings.plans.values()}

    def after_w(cells: dict[oracle.Cell, Any]) -> dict[oracle.Cell, Any]:
        return {c: v for c, v in cells.items() if c[1] == base[c[0]] and c[2] >= watermarks[c[0]]}

    batch = as_points(settings, stored)
    mismatches = [f"batch: {m}" for m in oracle.compare(everything, batch)]
    mismatches += [f"speed: {m}" for m in oracle.compare(after_w(non_late), after_w(speed))]
    series_points, series_mismatches = _series_mismatches(series, everything, non_late, watermarks)
    mismatches += [f"series: {m}" for m in series_mismatches]

    merged = {
        c: v["count"]
        for c, v in batch.items()
        if c[1] == base[c[0]] and c[2] + c[1] <= watermarks[c[0]]
    }
    merged.update({c: v["count"] for c, v in after_w(speed).items()})
    want = {c: v["count"] for c, v in everything.items() if c[1] == base[c[0]]}
    lost = sum(max(0, n - merged.get(c, 0)) for c, n in want.items())
    doubled = sum(max(0, n - want.get(c, 0)) for c, n in merged.items())
    cells = len(batch) + len(after_w(speed)) + series_points
    return cells, mismatches, lost, doubled


Series = list[tuple[str, dict[str, str], int, int, dict[str, Any]]]
"""(metric, key, start, end, the answer) of the merged 1m series of `SERIES`."""


def _read_series(world: World, settle_s: float = 30) -> Series:
    """The merged 1m series of `SERIES` over the last 3 hours, as the API answers them, once
    every answer has the speed view (`speed_status: "ok"`). Right after Redis restarts, a
    request on a pooled connection Redis closed may still answer batch-only: that is the
    contract's answer while Redis is unreachable, and the recovery ends with the next ones."""
    deadline = time.monotonic() + settle_s
    while True:
        now = int(time.time() * 1000) // MINUTE * MINUTE
        start, end = now - 180 * MINUTE, now + 5 * MINUTE
        out: Series = []
        for metric, key in SERIES:
            response = httpx.get(
                f"{world.api}/v1/metrics/{metric}/series",
                params={"window": "1m", "start": format_time(start), "end": format_time(end)} | key,
                timeout=30,
            )
            assert response.status_code == 200, response.text
            out.append((metric, key, start, end, response.json()))
        if all(body["speed_status"] == "ok" for *_, body in out) or time.monotonic() > deadline:
            return out
        time.sleep(0.5)


def _series_mismatches(
    series: Series,
    everything: dict[oracle.Cell, Any],
    non_late: dict[oracle.Cell, Any],
    watermarks: dict[str, int],
) -> tuple[int, list[str]]:
    """The series against the oracle (rule 8: batch cells up to W, speed cells after it)."""
    mismatches: list[str] = []
    points = 0
    for metric, key, start, end, body in series:
        assert body["speed_status"] == "ok", body["speed_status"]

        compared, found = series_mismatches(
            body, metric, key, (start, end), watermarks[metric], everything, non_late
        )
        points += compared
        mismatches += found
    return points, mismatches


def judge(answers: list[Answer], outages: Outages) -> dict[str, Verdict]:
    """Each answer against what the contract allows when it was given, per fault."""
    verdicts: dict[str, Verdict] = {}

    def during(answer: Answer, spans: list[tuple[float, float]]) -> bool:
        return any(answer.started <= end and answer.ended >= start for start, end in spans)

    def inside(answer: Answer, spans: list[tuple[float, float]]) -> bool:
        return any(start <= answer.started and answer.ended <= end for start, end in spans)

    for a in answers:
        verdict = verdicts.setdefault(a.fault, Verdict())
        verdict.answers += 1
        status = str(a.status)
        if a.path.endswith("/series") and inside(a, outages.redis_down):
            batch_only = a.body.get("speed_status") == "unavailable"
            status = f"{a.status} batch-only" if batch_only else f"{a.status} not batch-only"
        elif a.status == 200 and a.body.get("batch_status") == "unavailable":
            status = "200 speed-only"  # rule 12: PostgreSQL unreachable
        if status == "200":
            continue
        if a.status == 503:
            verdict.waits_503.append(a.ended - a.started)
        allowed = (
            status == "200 batch-only"
            or (status == "200 speed-only" and during(a, outages.pg_down))
            or (a.status == 0 and during(a, outages.api_down))
            or (a.status == 503 and during(a, outages.pg_down) and bool(a.body.get("detail")))
        )
        (verdict.allowed if allowed else verdict.errors)[status] += 1
    return verdicts


def _table(rows: list[Row], wall_s: float, reader: Reader, producer: ContinuousProducer) -> str:
    def counts(counter: Counter[str]) -> str:
        return ", ".join(f"{k}: {n}" for k, n in sorted(counter.items())) or "-"

    def waits(verdict: Verdict) -> str:
        if not verdict.waits_503:
            return ""
        return f" (p50 {statistics.median(verdict.waits_503):.2f} s)"

    head = (
        "fault",
        "cells checked",
        "mismatches",
        "events lost",
        "double-counted",
        "API answers",
        "API errors by status",
        "allowed during the outage",
        "recovery s",
    )
    body = [
        (
            r.fault,
            str(r.cells),
            str(r.mismatches),
            str(r.lost),
            str(r.doubled),
            str(r.verdict.answers),
            counts(r.verdict.errors),
            counts(r.verdict.allowed) + waits(r.verdict),
            f"{r.recovery_s:.1f}",
        )
        for r in rows
    ]
    widths = [max(len(line[i]) for line in (head, *body)) for i in range(len(head))]
    lines = [
        " | ".join(c.ljust(w) for c, w in zip(line, widths, strict=True)) for line in (head, *body)
    ]
    lines.insert(1, "-+-".join("-" * w for w in widths))
    summary = (
        f"{producer.delivered} events delivered ({producer.resent} re-sent after a failed "
        f"delivery); {len(reader.answers)} API answers read, {reader.compared} batch points "
        f"read again from the same served row, {len(reader.violations)} of them changed; "
        f"{wall_s:.0f} s"
    )
    return "\n\nwhole-platform faults (#14)\n" + "\n".join(lines) + "\n" + summary + "\n"
