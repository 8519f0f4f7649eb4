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
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx

from lambdactl.stack import stack_down, stack_up
from shared.config import Settings
from tests.conftest import Platform, reconfigured

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
