"""Helpers for the end-to-end tests that run the platform as an operator does: services of the
test's own (so a test may stop, restart or wipe them without disturbing the rest of the suite),
the layers as `lambdactl` subprocesses, and polling until something holds."""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx

from batch_layer import execute_run
from lambdactl.generator import GeneratorSpec, generate, produce
from lambdactl.stack import stack_down, stack_up
from serving_layer.timefmt import format_time
from shared.config import Settings
from shared.db.runs import RunRequest
from tests import oracle
from tests.batch.helpers import oracle_mismatches, queue, run_record, served_view
from tests.conftest import TEST_REDIS_DB, Platform, reconfigured
from tests.speed.support import speed_cells

MINUTE = 60_000
SHORT_BACKOFFS: dict[str, dict[str, Any]] = {
    "speed": {"watermark_refresh_s": 1.0, "outage_backoff_s": 0.2, "outage_backoff_max_s": 2.0},
    "batch": {
        "poll_s": 0.5,
        "heartbeat_s": 1.0,
        "retry_backoff_s": 1.0,
        "outage_backoff_s": 0.2,
        "outage_backoff_max_s": 2.0,
    },
}
"""Settings that make the layers notice an outage, and retry after one, within seconds."""


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


@contextmanager
def private_services(services: tuple[str, ...], kafka: str | None = None) -> Iterator[Settings]:
    """`services` (of kafka, redis, postgres) started on free ports under a data directory of
    their own; yields the stack settings that start and stop them (`stack_up`/`stack_down`
    with them restart one), and stops them and removes their data afterwards. `kafka`: the
    bootstrap servers to use when Kafka is not among `services`."""
    # Not under pytest's tmp dir: the postgres user must reach the cluster's directory.
    data_dir = Path(tempfile.mkdtemp(prefix="lp-private-"))
    data_dir.chmod(0o755)
    managed = Settings(
        kafka={"bootstrap_servers": kafka or f"127.0.0.1:{free_port()}"},
        redis={"url": f"redis://127.0.0.1:{free_port()}/0"},
        postgres={"url": f"postgresql://lambda:lambda@127.0.0.1:{free_port()}/lambda"},
        stack={"data_dir": data_dir},
    )
    try:
        stack_up(managed, services)
        yield managed
    finally:
        with contextlib.suppress(Exception):
            stack_down(managed, services)
        shutil.rmtree(data_dir, ignore_errors=True)


def on_services(platform: Platform, managed: Settings, **sections: dict[str, Any]) -> Platform:
    """`platform` on the services of `managed` (`private_services`), with `SHORT_BACKOFFS`
    and the given sections' settings on top of them."""
    merged = {
        name: {**SHORT_BACKOFFS.get(name, {}), **sections.get(name, {})}
        for name in {*SHORT_BACKOFFS, *sections}
    }
    return reconfigured(
        platform,
        kafka={"bootstrap_servers": managed.kafka.bootstrap_servers},
        redis={"url": managed.redis.url},
        postgres={"url": managed.postgres.url},
        **merged,
    )


def spawn(env: dict[str, str], args: list[str], log: Path) -> subprocess.Popen[bytes]:
    """`python -m lambdactl <args>` in a process group of its own, so `kill_group` also ends
    what it started (the batch runner's Spark JVM)."""
    return subprocess.Popen(
        [sys.executable, "-m", "lambdactl", *args],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=log.open("ab"),
        cwd=os.getcwd(),
        start_new_session=True,
    )


def kill_group(process: subprocess.Popen[bytes], sig: int = signal.SIGKILL) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, sig)


def stop_group(process: subprocess.Popen[bytes], timeout_s: float = 30) -> int | None:
    """SIGTERM the process group, SIGKILL it after `timeout_s`; the exit code (None: killed)."""
    if process.poll() is not None:
        kill_group(process)
        return process.returncode
    kill_group(process, signal.SIGTERM)
    try:
        return process.wait(timeout_s)
    except subprocess.TimeoutExpired:
        kill_group(process)
        process.wait(10)
        return None
    finally:
        kill_group(process)


def until(what: str, check: Callable[[], object], timeout_s: float, step_s: float = 0.2) -> float:
    """Seconds until `check()` is true (fails after `timeout_s`)."""
    began = time.monotonic()
    while not check():
        assert time.monotonic() - began < timeout_s, f"{what}: not within {timeout_s} s"
        time.sleep(step_s)
    return time.monotonic() - began


def ready(base: str) -> bool:
    """Whether the API at `base` answers `/readyz` with 200."""
    try:
        return httpx.get(f"{base}/readyz", timeout=15).status_code == 200
    except httpx.HTTPError:
        return False


def gauge(metrics: str, name: str, labels: str = "") -> float | None:
    """A sample of a Prometheus endpoint (None: not exposed or not reachable)."""
    try:
        text = httpx.get(f"{metrics}/metrics", timeout=5).text
    except httpx.HTTPError:
        return None
    selector = re.escape(name) + (re.escape("{" + labels + "}") if labels else "")
    found = re.search(rf"^{selector} (\S+)$", text, re.M)
    return None if found is None else float(found.group(1))


def speed_mismatches_after_w(platform: Platform, records: list[Any]) -> list[str]:
    """The speed layer's base cells from the served W on, against the oracle over `records`
    (the topic's records; the events rule 2 calls late left out)."""
    served, _ = served_view(platform.settings)
    assert served is not None, "no run has published yet"
    want = oracle.compute_cells(
        platform.config, records, late_rule=True, watermarks=served.watermarks
    )
    base = {m.name: m.base_window_ms for m in platform.settings.plans.values()}

    def after_w(cells: dict[oracle.Cell, Any]) -> dict[oracle.Cell, Any]:
        return {
            cell: values
            for cell, values in cells.items()
            if cell[1] == base[cell[0]] and cell[2] >= (served.watermarks[cell[0]] or 0)
        }

    return oracle.compare(after_w(want), after_w(speed_cells(platform)))


class EventStream:
    """Traffic for a fault test: an hour of events produced up front (90 to 30 minutes ago),
    then 12 chunks of 1,500 over the last 30 minutes, one every half second, from a thread;
    all with the idempotent producer of `lambdactl produce`. `sent` counts the acknowledged
    events."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        self.bootstrap, self.topic = bootstrap, topic
        self.now = int(time.time() * 1000) // MINUTE * MINUTE
        history = GeneratorSpec(self.now - 90 * MINUTE, self.now - 30 * MINUTE, 4000)
        self.sent = produce(bootstrap, topic, generate(history))
        self._thread = threading.Thread(target=self._stream)

    def _stream(self) -> None:
        for chunk in range(12):
            spec = GeneratorSpec(self.now - 30 * MINUTE, self.now, 1500, seed=100 + chunk)
            self.sent += produce(self.bootstrap, self.topic, generate(spec))
            time.sleep(0.5)

    def start(self) -> None:
        self._thread.start()

    def join(self, timeout_s: float) -> None:
        self._thread.join(timeout_s)
        assert not self._thread.is_alive(), f"producing took over {timeout_s:.0f} s"


def _without_xdist(environ: Mapping[str, str]) -> dict[str, str]:
    """`environ` without pytest-xdist's worker variables, so a pytest run in a subprocess is
    not taken for a worker of the run that started it."""
    return {k: v for k, v in environ.items() if not k.startswith("PYTEST_XDIST")}


def rerun_suites(paths: list[str], env: dict[str, str], timeout_s: float) -> str:
    """Runs pytest over `paths` in a subprocess with `env` added (e.g. the services it should
    use instead); asserts that every test passed, none skipped; returns pytest's summary."""
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *paths],
        env={**_without_xdist(os.environ), "LP_TEST_REDIS_DB": str(TEST_REDIS_DB), **env},
        capture_output=True,
        text=True,
        timeout=timeout_s,
    )
    summary = run.stdout.strip().splitlines()[-1] if run.stdout.strip() else ""
    assert run.returncode == 0, f"{run.stdout[-6000:]}\n{run.stderr[-3000:]}"
    assert " passed" in summary and "skipped" not in summary, summary
    return summary


def settles_exactly(platform: Platform, spark: Any, events: EventStream, mode: str) -> None:
    """After a fault, once the stream is drained: every acknowledged event is in the log once,
    a run of `mode` succeeds, and the batch view and the speed cells after W equal the
    oracle."""
    settings = platform.settings
    records = oracle.read_topic(events.bootstrap, events.topic)
    assert len(records) == events.sent, "an acknowledged record was lost or written twice"
    run_id = queue(settings, RunRequest(mode))
    execute_run(settings, spark, run_id)
    assert run_record(settings, run_id).status == "succeeded"
    assert oracle_mismatches(settings, platform.config) == []
    assert speed_mismatches_after_w(platform, records) == []


def series_mismatches(
    body: Mapping[str, Any],
    metric: str,
    key: Mapping[str, str],
    span: tuple[int, int],
    watermark: int,
    batch_want: Mapping[Any, Any],
    speed_want: Mapping[Any, Any],
) -> tuple[int, list[str]]:
    """A merged 1m series answer over `span` against the oracle (rule 8: `batch_want` for the
    windows that end by W, `speed_want` after); returns (points compared, mismatches)."""
    got = {p["start"]: p for p in body["points"]}
    mismatches: list[str] = []
    points = 0
    for window_start in range(*span, MINUTE):
        cell = (metric, MINUTE, window_start, tuple(key.values()))
        want = (batch_want if window_start + MINUTE <= watermark else speed_want).get(cell)
        point = got.pop(format_time(window_start), None)
        if want is None or point is None:
            if want is not None or point is not None:
                mismatches.append(f"{cell}: want {want}, got {point}")
            continue
        points += 1
        fields = {k: v for k, v in point.items() if k not in ("start", "end", "source")}
        mismatches += oracle.compare({cell: want}, {cell: fields})
    return points, mismatches
