"""`lambdactl serve` as a subprocess, as an operator starts it: on a free port, in a session of
its own (so its worker processes are stopped with it), its output in a log file."""

from __future__ import annotations

import os
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


@contextmanager
def running_api(
    env: dict[str, str], log: Path, *args: str, ready: str = "/healthz", limit_s: float = 60
) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    """The API's base URL and process once `ready` answers 200; stopped (SIGTERM, then
    SIGKILL) with every process of its session afterwards."""
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
        yield base, process
    finally:
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(10)
