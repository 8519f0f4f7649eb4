"""Redis shut down, then PostgreSQL stopped, under the whole platform running as an operator
runs it: a speed worker, the batch runner and the API as subprocesses, events produced before,
during and after each outage, a reader querying throughout. The stores are a Redis and a
PostgreSQL of the test's own (the rest of the suite keeps the shared ones); Kafka is the
shared broker with this test's topic and consumer group.

Through each outage no process exits; the API answers batch-only with `speed_status:
"unavailable"` while Redis is down, and while PostgreSQL is down answers series from the
speed view from the W it last read on (`batch_status: "unavailable"`, rule 12) and everything
else 503 with a message (never another 5xx); the worker says it is degraded
(`speed_degraded`) and logs each change of state once; `/readyz` is ready within seconds of
recovery. The run PostgreSQL's outage interrupted is recorded as failed with its error and
retried; the worker, which kept applying events while PostgreSQL was down, resumes exactly
after Redis returns. Afterwards every batch cell, every
speed cell after W and the merged series equal the oracle."""

from __future__ import annotations

import contextlib
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis

from lambdactl.generator import GeneratorSpec, generate, produce
from lambdactl.stack import stack_down, stack_up
from serving_layer.timefmt import format_time, parse_time
from shared.config import Settings
from shared.db.connect import connect
from shared.db.migrate import upgrade
from shared.db.runs import RunRecord, RunRequest, list_runs
from shared.kafka import create_topics
from shared.speed_view import EPOCH_KEY
from tests import oracle
from tests.batch.helpers import oracle_mismatches, queue, run_record, served_view
from tests.conftest import Platform
from tests.e2e.support import (
    MINUTE,
    free_port,
    gauge,
    on_services,
    private_services,
    ready,
    series_mismatches,
    spawn,
    until,
)
from tests.speed.support import (
    fences,
    speed_cells,
    start_worker,
    stop_worker,
    wait_until_applied,
)

pytestmark = [pytest.mark.services, pytest.mark.long(100), pytest.mark.timeout(600)]

OUTAGE_S = 12.0
READY_WITHIN_S = 10.0


@dataclass
class Stores:
    platform: Platform
    managed: Settings
    """The stack settings that start and stop the test's own Redis and PostgreSQL."""
    api: str
    metrics: str


@pytest.fixture
def stores(platform: Platform) -> Iterator[Stores]:
    """The test's platform on a Redis and a PostgreSQL of its own, with short backoffs."""
    api_port, metrics_port = free_port(), free_port()
    kafka = platform.settings.kafka.bootstrap_servers
    with private_services(("redis", "postgres"), kafka=kafka) as managed:
        upgrade(managed.postgres.url)
        own = on_services(
            platform, managed, speed={"metrics_port": metrics_port}, serving={"port": api_port}
        )
        yield Stores(
            own, managed, f"http://127.0.0.1:{api_port}", f"http://127.0.0.1:{metrics_port}"
        )


@dataclass
class Answer:
    started: float
    ended: float
    path: str
    status: int
    body: dict[str, Any]


@dataclass
class Reader:
    """Queries the API in a loop, a series and `/v1/status` in a thread each, and keeps every
    answer (while PostgreSQL is down a request waits for a connection only briefly)."""

    base: str
    metric: str
    answers: list[Answer] = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)
    threads: list[threading.Thread] = field(default_factory=list)

    def start(self) -> None:
        now = int(time.time() * 1000) // MINUTE * MINUTE
        series = (
            f"/v1/metrics/{self.metric}/series?window=1m"
            f"&start={format_time(now - 180 * MINUTE)}&end={format_time(now + 60 * MINUTE)}"
        )
        for path in (series, "/v1/status"):
            thread = threading.Thread(target=self._poll, args=(path,), daemon=True)
            thread.start()
            self.threads.append(thread)

    def join(self) -> None:
        self.stop.set()
        for thread in self.threads:
            thread.join(30)

    def _poll(self, path: str) -> None:
        with httpx.Client(base_url=self.base, timeout=20) as client:
            while not self.stop.wait(0.2):
                started = time.monotonic()
                try:
                    response = client.get(path)
                except httpx.HTTPError as exc:  # the API must keep answering
                    self.answers.append(
                        Answer(started, time.monotonic(), path, 0, {"error": str(exc)})
                    )
                    continue
                try:
                    body = response.json()
                except ValueError:
                    body = {"text": response.text[:200]}
                ended = time.monotonic()
                self.answers.append(Answer(started, ended, path, response.status_code, body))


def _alive(processes: dict[str, subprocess.Popen[bytes]], logs: Path) -> None:
    for name, process in processes.items():
        assert process.poll() is None, f"the {name} exited with {process.returncode}; see {logs}"


def _readyz(base: str) -> dict[str, Any]:
    response = httpx.get(f"{base}/readyz", timeout=10)
    body: dict[str, Any] = response.json()
    return {"status": response.status_code, **body}


def _runs(settings: Settings) -> list[RunRecord]:
    with connect(settings.postgres.url, autocommit=True) as conn:
        return list_runs(conn, limit=50)


def _run_done(settings: Settings, run_id: int) -> bool:
    return run_record(settings, run_id).status in ("succeeded", "failed", "cancelled")


def _produce_live(settings: Settings, events: int, seed: int) -> int:
    now = int(time.time() * 1000)
    spec = GeneratorSpec(now - 3 * MINUTE, now, events, disorder_ms=10_000, seed=seed)
    return produce(settings.kafka.bootstrap_servers, settings.sources[0].topic, generate(spec))


def _count(log: Path, text: str) -> int:
    return log.read_text(errors="replace").count(text)


def test_redis_and_postgres_outages_are_ridden_out(stores: Stores, tmp_path: Path) -> None:
    platform, managed = stores.platform, stores.managed
    settings = platform.settings
    bootstrap, topic = settings.kafka.bootstrap_servers, settings.sources[0].topic
    create_topics(settings)
    now = int(time.time() * 1000) // MINUTE * MINUTE
    sent = produce(
        bootstrap, topic, generate(GeneratorSpec(now - 90 * MINUTE, now - 10 * MINUTE, 3000))
    )
    logs = {name: tmp_path / f"{name}.log" for name in ("speed", "runner", "api")}
    processes = {
        "speed worker": start_worker(platform, logs["speed"]),
        "batch runner": spawn(platform.env, ["batch", "runner", "--no-schedule"], logs["runner"]),
        "API": spawn(platform.env, ["serve"], logs["api"]),
    }
    reader = Reader(stores.api, "views_total")
    phases: dict[str, tuple[float, float]] = {}
    timings: dict[str, float] = {}
    try:
        first = queue(settings, RunRequest("full"))
        until("the first full run", lambda: _run_done(settings, first), 240, 0.5)
        assert run_record(settings, first).status == "succeeded", run_record(settings, first)
        sent += _produce_live(settings, 800, seed=2)
        wait_until_applied(platform, timeout_s=120, workers=[processes["speed worker"]])
        until("the API is ready", lambda: ready(stores.api), 60)
        reader.start()
        time.sleep(1.0)

        # -- Redis shut down (its data saved), then started again with it -------------------
        client = redis.Redis.from_url(settings.redis.url)
        epoch = client.get(EPOCH_KEY)
        with contextlib.suppress(redis.ConnectionError):
            client.shutdown(save=True)
        until("Redis stopped", lambda: not _pinging(client), 20, 0.05)
        stack_down(managed, ("redis",))
        began = time.monotonic()
        sent += _produce_live(settings, 600, seed=3)
        timings["worker_degraded_redis_s"] = until(
            "speed_degraded{cause=redis}",
            lambda: gauge(stores.metrics, "speed_degraded", 'cause="redis"') == 1.0,
            10,
        )
        assert _readyz(stores.api)["checks"]["redis"].startswith("down")
        time.sleep(max(0.0, OUTAGE_S - (time.monotonic() - began)))
        _alive(processes, tmp_path)
        phases["redis_down"] = (began, time.monotonic())
        stack_up(managed, ("redis",))
        assert client.get(EPOCH_KEY) == epoch, "Redis was to come back with its data"
        up = time.monotonic()
        timings["readyz_after_redis_s"] = until(
            "/readyz after Redis", lambda: ready(stores.api), 30
        )
        timings["worker_ok_after_redis_s"] = until(
            "speed_degraded{cause=redis} back to 0",
            lambda: gauge(stores.metrics, "speed_degraded", 'cause="redis"') == 0.0,
            30,
        )
        phases["redis_recovering"] = (up, up + timings["readyz_after_redis_s"] + 3)
        sent += _produce_live(settings, 600, seed=4)
        wait_until_applied(platform, timeout_s=60, workers=[processes["speed worker"]])
        timings["speed_drained_after_redis_s"] = time.monotonic() - up

        # -- PostgreSQL stopped while a run executes, then started again ----------------------
        interrupted = queue(settings, RunRequest("incremental"))
        until(
            "the runner claims the run",
            lambda: run_record(settings, interrupted).status != "queued",
            30,
            0.05,
        )
        stopping = time.monotonic()
        stack_down(managed, ("postgres",))
        began = time.monotonic()
        phases["pg_stopping"] = (stopping, began)  # a shutting-down server refuses already
        applied_before = fences(platform)
        sent += _produce_live(settings, 600, seed=5)
        timings["worker_degraded_pg_s"] = until(
            "speed_degraded{cause=postgres}",
            lambda: gauge(stores.metrics, "speed_degraded", 'cause="postgres"') == 1.0,
            10,
        )
        assert _readyz(stores.api)["checks"]["postgres"].startswith("down")
        until(
            "the worker applies events while PostgreSQL is down",
            lambda: fences(platform) != applied_before,
            OUTAGE_S,
        )
        time.sleep(max(0.0, OUTAGE_S - (time.monotonic() - began)))
        _alive(processes, tmp_path)
        phases["pg_down"] = (began, time.monotonic())
        stack_up(managed, ("postgres",))
        up = time.monotonic()
        timings["readyz_after_pg_s"] = until(
            "/readyz after PostgreSQL", lambda: ready(stores.api), 30
        )
        phases["pg_recovering"] = (up, up + timings["readyz_after_pg_s"] + 3)
        timings["worker_ok_after_pg_s"] = until(
            "speed_degraded{cause=postgres} back to 0",
            lambda: gauge(stores.metrics, "speed_degraded", 'cause="postgres"') == 0.0,
            30,
        )
        sent += _produce_live(settings, 600, seed=6)

        def retried() -> RunRecord | None:
            return next((r for r in _runs(settings) if r.retry_of == interrupted), None)

        def retry_done() -> bool:
            retry = retried()
            return retry is not None and retry.status in ("succeeded", "failed")

        until("the interrupted run's retry", retry_done, 180, 0.5)
        timings["retry_done_after_pg_s"] = time.monotonic() - up
        failed, retry = run_record(settings, interrupted), retried()
        assert failed.status == "failed" and failed.error, failed
        assert "PostgreSQL" in failed.error or "Operational" in failed.error, failed.error
        assert retry is not None and retry.status == "succeeded", retry
        print(f"\nthe interrupted run's error: {failed.error}")
        wait_until_applied(platform, timeout_s=60, workers=[processes["speed worker"]])
        _alive(processes, tmp_path)
        assert gauge(stores.metrics, "speed_rebuilds_total") == 0.0, "Redis kept its data"

        # Nothing lost or counted twice: the batch view, the speed view after W and the
        # merged series against the oracle.
        records = oracle.read_topic(bootstrap, topic)
        assert len(records) == sent, "a produced record was lost or written twice"
        assert oracle_mismatches(settings, platform.config) == []
        _check_cells(platform, records, stores.api)
    finally:
        reader.join()
        codes = {}
        for name, process in processes.items():
            if name == "speed worker":
                codes[name] = stop_worker(process)
            elif process.poll() is None:
                process.terminate()
                process.wait(30)
        print(f"\noutage timings (s): { {k: round(v, 2) for k, v in timings.items()} }")
    assert codes["speed worker"] == 0, f"see {logs['speed']}"

    # Each change of state logged once, by the processes that saw it.
    assert _count(logs["speed"], "event=store_down store=redis") == 1
    assert _count(logs["speed"], "event=store_recovered store=redis") == 1
    assert _count(logs["speed"], "event=store_down store=postgres") == 1
    assert _count(logs["speed"], "event=store_recovered store=postgres") == 1
    assert _count(logs["runner"], "event=store_down store=postgres") == 1
    assert _count(logs["runner"], "event=store_recovered store=postgres") == 1

    _check_answers(reader.answers, phases)
    assert timings["readyz_after_redis_s"] <= READY_WITHIN_S, timings
    assert timings["readyz_after_pg_s"] <= READY_WITHIN_S, timings


def _check_cells(platform: Platform, records: list[oracle.Record], api: str) -> None:
    """Speed cells after W against the oracle's non-late events, and merged 1m series (rule
    8: batch cells up to W, speed cells after) against the oracle, for two keys."""
    settings = platform.settings
    served, _ = served_view(settings)
    assert served is not None
    watermarks = served.watermarks
    speed_want = oracle.compute_cells(
        platform.config, records, late_rule=True, watermarks=watermarks
    )
    base = {m.name: m.base_window_ms for m in settings.plans.values()}

    def after_w(cells: dict[oracle.Cell, Any]) -> dict[oracle.Cell, Any]:
        return {
            cell: values
            for cell, values in cells.items()
            if cell[1] == base[cell[0]] and cell[2] >= (watermarks[cell[0]] or 0)
        }

    assert oracle.compare(after_w(speed_want), after_w(speed_cells(platform))) == []

    snapshot = {int(p): o for p, o in served.snapshot[settings.sources[0].topic].items()}
    batch_want = oracle.compute_cells(
        platform.config, [r for r in records if r.offset < snapshot.get(r.partition, 0)]
    )
    now = int(time.time() * 1000) // MINUTE * MINUTE
    start, end = now - 100 * MINUTE, now + 5 * MINUTE
    mismatches: list[str] = []
    points = 0
    for metric, key in (("views_total", {}), ("views_by_page", {"page": "/"})):
        response = httpx.get(
            f"{api}/v1/metrics/{metric}/series",
            params={"window": "1m", "start": format_time(start), "end": format_time(end), **key},
            timeout=30,
        )
        assert response.status_code == 200, response.text
        body = response.json()
        assert body["speed_status"] == "ok", body["speed_status"]
        compared, found = series_mismatches(
            body, metric, key, (start, end), watermarks[metric], batch_want, speed_want
        )
        points += compared
        mismatches += found
    assert mismatches == []
    assert points >= 50, points


def _pinging(client: redis.Redis) -> bool:
    try:
        return bool(client.ping())
    except redis.RedisError:
        return False


def _check_answers(answers: list[Answer], phases: dict[str, tuple[float, float]]) -> None:
    """What the contract allows in each phase; answers spanning a phase boundary are judged
    only by what every phase allows (200 or 503)."""

    def inside(answer: Answer, phase: str) -> bool:
        start, end = phases[phase]
        return start <= answer.started and answer.ended <= end

    def overlaps(answer: Answer, *names: str) -> bool:
        return any(answer.started <= phases[n][1] and answer.ended >= phases[n][0] for n in names)

    assert answers, "the reader got no answer"
    problems = []
    seen = {"redis_down": 0, "pg_down": 0, "pg_down_series": 0}
    for a in answers:
        what = f"{a.path} -> {a.status} {a.body} during [{a.started:.2f}, {a.ended:.2f}]"
        if a.status not in (200, 503):
            problems.append(f"not 200/503: {what}")
            continue
        if a.status == 503:
            if not overlaps(a, "pg_stopping", "pg_down", "pg_recovering"):
                problems.append(f"503 with PostgreSQL up: {what}")
            if not str(a.body.get("detail", "")):
                problems.append(f"503 without a message: {what}")
        if inside(a, "redis_down"):
            seen["redis_down"] += 1
            if a.status != 200 or a.body.get("speed_status") != "unavailable":
                problems.append(f"Redis down, want 200 batch-only: {what}")
        if inside(a, "pg_down"):
            seen["pg_down"] += 1
            if "/series" not in a.path:
                if a.status != 503:
                    problems.append(f"PostgreSQL down, want 503: {what}")
                continue
            seen["pg_down_series"] += 1
            body = a.body
            if a.status != 200 or body.get("batch_status") != "unavailable":
                problems.append(f"PostgreSQL down, want the speed view's windows: {what}")
                continue
            w = parse_time(body["batch_watermark"])
            if not body["points"] or any(
                parse_time(p["start"]) < w or p["source"] != "speed" for p in body["points"]
            ):
                problems.append(f"PostgreSQL down, want points from W on, from speed: {what}")
    assert problems == [], "\n".join([*problems[:20], f"phases: {phases}"])
    assert seen["redis_down"] >= 10 and seen["pg_down"] >= 2 and seen["pg_down_series"] >= 2, seen
