"""`lambdactl serve` as a subprocess, as an operator starts it: on a free port, in a session of
its own (so its worker processes are stopped with it), its output in a log file."""

from __future__ import annotations

import os
import resource
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def start_serve(env: dict[str, str], log: Path, *args: str) -> subprocess.Popen[bytes]:
    with log.open("ab") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "lambdactl", "serve", *args],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


MEMORY_CAP = 2 << 30
"""The address space a memory-capped API gets (`running_api(capped=True)`): 2 GiB."""


@contextmanager
def running_api(
    env: dict[str, str],
    log: Path,
    *args: str,
    ready: str = "/healthz",
    limit_s: float = 60,
    capped: bool = False,
) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    """The API's base URL and process once `ready` answers 200; stopped (SIGTERM, then
    SIGKILL) with every process of its session afterwards. `capped`: its address space is
    limited to `MEMORY_CAP` once it answers (RLIMIT_AS), so every request runs under the
    cap and one that would take the machine's memory fails in the API instead."""
    port = free_port()
    process = start_serve(env, log, "--port", str(port), *args)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + limit_s
        while True:
            assert process.poll() is None, f"`lambdactl serve` exited: {log.read_text()}"
            try:
                if httpx.get(f"{base}{ready}", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, f"the API was not ready within {limit_s} s"
            time.sleep(0.2)
        if capped:
            resource.prlimit(process.pid, resource.RLIMIT_AS, (MEMORY_CAP, MEMORY_CAP))
        yield base, process
    finally:
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(10)
