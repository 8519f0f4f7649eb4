"""Several API processes on one port (`lambdactl serve --workers 2`), as an operator runs them:
every process answers what one in-process app answers, none serves a cell its caches held
from before a publication, one killed with SIGKILL is replaced while the other answers, and
`/metrics` sums the requests of all of them."""

from __future__ import annotations

import os
import random
import re
import signal
import subprocess
import time
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import httpx
import psutil
import pytest
from fastapi.testclient import TestClient

from serving_layer import create_app
from serving_layer.timefmt import format_time
from tests.conftest import Platform
from tests.serving.api_process import running_api
from tests.serving.views import load_views, random_events

pytestmark = [pytest.mark.services, pytest.mark.timeout(240)]

MINUTE, HOUR = 60_000, 3_600_000
T0 = 1_767_225_600_000  # 2026-01-01T00:00:00Z
PAGES = ["/", "/a", "/b", "/c"]
WORKERS = 2
QUANTILE = re.compile(r"p\d+(\.\d+)?")
QUERIES = [
    ("views_by_page", {"window": "1m", "page": "/a"}),
    ("views_by_page", {"window": "1h"}),
    ("views_by_page", {"window": "15m", "step": "5m", "group_by": "page"}),
    ("views_total", {"window": "1m"}),
]


def _params(extra: dict[str, str]) -> dict[str, str]:
    return {"start": format_time(T0 - 2 * HOUR), "end": format_time(T0 + 2 * HOUR), **extra}


def _answers(client: httpx.Client | TestClient) -> list[Any]:
    """The answers to `QUERIES`, quantile estimates replaced by whether they lie in their
    point's [min, max]: a KLL merge compacts with random bits from a generator the sketch
    library seeds per process (its Python binding exposes no seed), so two processes merging
    the same sketches may differ within the sketch's rank bound — the oracle tests judge
    quantiles by that bound; every other field must be identical."""
    out = []
    for metric, extra in QUERIES:
        r = client.get(f"/v1/metrics/{metric}/series", params=_params(extra))
        assert r.status_code == 200, r.text
        answer = r.json()
        for series in [answer, *answer.get("groups", [])]:
            for point in series.get("points", []):
                for name in [n for n in point if QUANTILE.fullmatch(n)]:
                    point[name] = point["min"] <= point[name] <= point["max"]
        out.append(answer)
    return out


def _serving_pids(server: psutil.Process, port: int) -> dict[int, int]:
    """Worker pid -> established connections it accepted on `port` (uvicorn's supervisor
    and multiprocessing's resource tracker hold none)."""
    held = {}
    for child in server.children():
        with_port = [
            c
            for c in child.net_connections("tcp")
            if c.status == psutil.CONN_ESTABLISHED and c.laddr.port == port
        ]
        held[child.pid] = len(with_port)
    return {pid: n for pid, n in held.items() if n}


@pytest.fixture
def server(platform: Platform, tmp_path: Path) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    env = {**platform.env, "LAMBDA_SERVING__WORKERS": str(WORKERS)}
    env.pop("PROMETHEUS_MULTIPROC_DIR", None)
    with running_api(env, tmp_path / "serve.log", ready="/readyz") as running:
        yield running


def _connections_on_every_worker(
    base: str, server: psutil.Process, port: int, stack: ExitStack
) -> list[httpx.Client]:
    """Keep-alive clients, one connection each, opened until every worker holds some."""
    clients: list[httpx.Client] = []
    for _ in range(64):
        client = stack.enter_context(httpx.Client(base_url=base, timeout=30))
        assert client.get("/healthz").status_code == 200
        clients.append(client)
        held = _serving_pids(server, port)
        if len(clients) >= 8 and len(held) == WORKERS and min(held.values()) >= 2:
            return clients
    raise AssertionError(f"64 connections did not reach all {WORKERS} workers: {held}")


def _requests_counted(base: str, route: str) -> float:
    text = httpx.get(f"{base}/metrics", timeout=10).text
    pattern = rf'lambda_serving_requests_total\{{[^}}]*route="{re.escape(route)}"[^}}]*\}} (\S+)'
    return sum(float(v) for v in re.findall(pattern, text))


def test_workers_answer_alike_follow_publications_and_survive_a_kill(
    platform: Platform, server: tuple[str, subprocess.Popen[bytes]]
) -> None:
    base, process = server
    port = int(base.rsplit(":", 1)[1])
    supervisor = psutil.Process(process.pid)
    events = random_events(random.Random(11), T0 - 3 * HOUR, T0 + 3 * HOUR, 3000, PAGES)
    load_views(platform.settings, events, T0 - 37 * MINUTE, seed=1)
    with ExitStack() as stack:
        reference = stack.enter_context(TestClient(create_app(platform.settings)))
        clients = _connections_on_every_worker(base, supervisor, port, stack)

        before = _answers(reference)
        assert all(_answers(c) == before for c in clients)

        # A run publishes: more events, W later. Every process drops what its caches held.
        more = events + random_events(random.Random(12), T0 - 2 * HOUR, T0, 500, PAGES)
        load_views(platform.settings, more, T0 + 23 * MINUTE, seed=2)
        after = _answers(reference)
        assert after != before
        for client in clients:
            assert _answers(client) == after

        # One worker killed: the supervisor replaces it; the other keeps answering meanwhile.
        victim = max(_serving_pids(supervisor, port))
        os.kill(victim, signal.SIGKILL)
        deadline = time.monotonic() + 60
        while len([c for c in supervisor.children() if c.pid != victim]) < WORKERS + 1:
            assert time.monotonic() < deadline, "the killed worker was not replaced in 60 s"
            with httpx.Client(base_url=base, timeout=30) as fresh:
                assert _answers(fresh) == after
            time.sleep(0.2)

    # Counters of every process are summed, whichever one answers the scrape.
    # (the killed one's included: a dead worker's counts stay in the sum, as counters must).
    asked = _requests_counted(base, "/v1/metrics/{metric_name}/series")
    assert asked >= 2 * len(QUERIES) * len(clients)
