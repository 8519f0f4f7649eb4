"""Apache Kafka stopped and started mid-stream, on a broker of the test's own (the rest of the
suite keeps the shared one): events produced by idempotent producers, a speed worker consuming
and a full batch run reading while the broker goes away and comes back. Nothing produced is
lost or written twice, the worker rides the outage out, the run succeeds or fails cleanly, and
after the next run the batch view and the speed cells after W equal the oracle."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from batch_layer import execute_run
from lambdactl.stack import stack_down, stack_up
from shared.config import Settings
from shared.db.runs import RunRequest
from shared.kafka import create_topics
from tests.batch.helpers import queue, run_record
from tests.conftest import Platform, reconfigured
from tests.e2e.support import (
    EventStream,
    private_services,
    settles_exactly,
)
from tests.speed.support import start_worker, stop_worker, wait_until_applied

pytestmark = [pytest.mark.services, pytest.mark.long(45), pytest.mark.timeout(420)]


@pytest.fixture
def own_broker(platform: Platform) -> Iterator[tuple[Platform, Settings]]:
    """The test's platform on a broker of its own, and the stack settings that manage it."""
    with private_services(("kafka",)) as managed:
        kafka = {"bootstrap_servers": managed.kafka.bootstrap_servers}
        yield reconfigured(platform, kafka=kafka), managed


def test_broker_restart_mid_stream_loses_nothing(
    own_broker: tuple[Platform, Settings], spark: Any, tmp_path: Path
) -> None:
    platform, managed = own_broker
    settings = platform.settings
    bootstrap, topic = settings.kafka.bootstrap_servers, settings.sources[0].topic
    create_topics(settings)
    events = EventStream(bootstrap, topic)
    worker = start_worker(platform, tmp_path / "speed.log")
    # The restart must land mid-stream, not during the worker's first join: a join answered by
    # a broker still loading its metadata can leave the worker with no partitions (noted on #14).
    wait_until_applied(platform, timeout_s=120, workers=[worker])
    run_id = queue(settings, RunRequest("full"))
    run_error: list[BaseException] = []

    def batch_run() -> None:
        try:
            execute_run(settings, spark, run_id)
        except Exception as exc:  # a clean failure is allowed; it is recorded on the run
            run_error.append(exc)

    try:
        events.start()
        time.sleep(2.0)
        reader = threading.Thread(target=batch_run)
        reader.start()
        time.sleep(1.0)
        stack_down(managed, ("kafka",))
        time.sleep(3.0)
        stack_up(managed, ("kafka",))
        events.join(180)
        reader.join(300)
        assert not reader.is_alive()
        first = run_record(settings, run_id)
        assert first.status in ("succeeded", "failed"), first
        assert (first.status == "failed") == bool(run_error), (first, run_error)
        wait_until_applied(platform, timeout_s=180, workers=[worker])
        assert worker.poll() is None, "the speed worker died with the broker"
    finally:
        stop_worker(worker)
    settles_exactly(platform, spark, events, "full")
