"""The same batch run on a real Spark standalone cluster (a master and two workers on
loopback, one core each, started from the pyspark install), driven by a runner process with
`LAMBDA_SPARK__MASTER=spark://127.0.0.1:<port>`: it equals the oracle (as the local run
does) with executors on both workers."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pyspark
import pytest

from lambdactl.generator import GeneratorSpec
from shared.db.runs import RunRequest
from shared.kafka import create_topics
from tests.batch.helpers import HOUR, MINUTE, oracle_mismatches, produce_spec, queue, run_record
from tests.conftest import Platform

pytestmark = [pytest.mark.services, pytest.mark.long(70), pytest.mark.timeout(300)]

SPARK_CLASS = Path(pyspark.__file__).parent / "bin" / "spark-class"
WORKERS = 2


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[str]:
    port, ui = _free_port(), _free_port()
    url = f"spark://127.0.0.1:{port}"
    env = {
        **os.environ,
        "SPARK_LOCAL_IP": "127.0.0.1",
        "SPARK_LOG_DIR": str(tmp_path),
    }
    logs = [(tmp_path / name).open("wb") for name in ("master.log", "worker-0.log", "worker-1.log")]
    master = subprocess.Popen(
        [
            str(SPARK_CLASS),
            "org.apache.spark.deploy.master.Master",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--webui-port",
            str(ui),
        ],
        env=env,
        stdout=logs[0],
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    workers = [
        subprocess.Popen(
            [
                str(SPARK_CLASS),
                "org.apache.spark.deploy.worker.Worker",
                "--host",
                "127.0.0.1",
                "--cores",
                "1",
                "--memory",
                "1g",
                "--webui-port",
                str(_free_port()),
                "--work-dir",
                str(tmp_path / f"work-{n}"),
                url,
            ],
            env=env,
            stdout=logs[1 + n],
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        for n in range(WORKERS)
    ]
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{ui}/json/", timeout=2) as reply:
                    if json.load(reply).get("aliveworkers", 0) >= WORKERS:
                        break
            except OSError:
                pass
            assert time.monotonic() < deadline, (tmp_path / "worker-0.log").read_text()[-2000:]
            time.sleep(1)
        yield url
    finally:
        for proc in (*workers, master):
            proc.terminate()
        for proc in (*workers, master):
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                proc.kill()
        for log in logs:
            log.close()


def test_batch_run_on_a_standalone_cluster(
    platform: Platform, cluster: str, tmp_path: Path
) -> None:
    settings = platform.settings
    create_topics(settings)
    now = int(time.time() * 1000) // MINUTE * MINUTE
    produce_spec(settings, GeneratorSpec(now - 2 * HOUR, now, 1000, seed=61))
    run_id = queue(settings, RunRequest("full"))
    env = {**platform.env, "LAMBDA_SPARK__MASTER": cluster, "LAMBDA_SPARK__DRIVER_MEMORY": "1g"}
    job = subprocess.run(
        [sys.executable, "-m", "lambdactl", "batch", "runner", "--once", "--no-schedule"],
        env=env,
        capture_output=True,
        timeout=240,
        check=False,
    )
    record = run_record(settings, run_id)
    assert record.status == "succeeded", (record.error, job.stderr[-3000:])
    assert oracle_mismatches(settings, platform.config) == []
    # each worker launched an executor of the run's application (its directory in the work dir)
    for n in range(WORKERS):
        assert list((tmp_path / f"work-{n}").glob("app-*/*")), f"worker {n} ran no executor"
