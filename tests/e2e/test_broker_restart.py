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
from lambdactl.generator import GeneratorSpec, generate, produce
from lambdactl.stack import stack_down, stack_up
from shared.config import Settings
from shared.db.runs import RunRequest
from shared.kafka import create_topics
from tests import oracle
from tests.batch.helpers import oracle_mismatches, queue, run_record, served_view
from tests.conftest import Platform, reconfigured
from tests.e2e.support import private_services
from tests.speed.support import speed_cells, start_worker, stop_worker, wait_until_applied

pytestmark = [pytest.mark.services, pytest.mark.timeout(420)]

MINUTE = 60_000
CHUNKS = 12
CHUNK_EVENTS = 1500


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
    now = int(time.time() * 1000) // MINUTE * MINUTE
    sent = produce(
        bootstrap, topic, generate(GeneratorSpec(now - 90 * MINUTE, now - 30 * MINUTE, 4000))
    )

    def stream() -> None:
        nonlocal sent
        for chunk in range(CHUNKS):
            spec = GeneratorSpec(now - 30 * MINUTE, now, CHUNK_EVENTS, seed=100 + chunk)
            sent += produce(bootstrap, topic, generate(spec))
            time.sleep(0.5)

    worker = start_worker(platform, tmp_path / "speed.log")
    # The restart must land mid-stream, not during the worker's first join: a join answered by
    # a broker still loading its metadata can leave the worker with no partitions (noted on #14).
    wait_until_applied(platform, timeout_s=120, workers=[worker])
    producer = threading.Thread(target=stream)
    run_id = queue(settings, RunRequest("full"))
    run_error: list[BaseException] = []

    def batch_run() -> None:
        try:
            execute_run(settings, spark, run_id)
        except Exception as exc:  # a clean failure is allowed; it is recorded on the run
            run_error.append(exc)

    try:
        producer.start()
        time.sleep(2.0)
        reader = threading.Thread(target=batch_run)
        reader.start()
        time.sleep(1.0)
        stack_down(managed, ("kafka",))
        time.sleep(3.0)
        stack_up(managed, ("kafka",))
        producer.join(180)
        reader.join(300)
        assert not producer.is_alive() and not reader.is_alive()
        first = run_record(settings, run_id)
        assert first.status in ("succeeded", "failed"), first
        assert (first.status == "failed") == bool(run_error), (first, run_error)
        wait_until_applied(platform, timeout_s=180, workers=[worker])
        assert worker.poll() is None, "the speed worker died with the broker"
    finally:
        if worker.poll() is None:
            stop_worker(worker)
        else:
            worker.wait(10)

    records = oracle.read_topic(bootstrap, topic)
    assert len(records) == sent, "a produced record was lost or written twice"
    after = queue(settings, RunRequest("full"))
    execute_run(settings, spark, after)
    assert run_record(settings, after).status == "succeeded"
    assert oracle_mismatches(settings, platform.config) == []

    served, _ = served_view(settings)
    assert served is not None
    want = oracle.compute_cells(
        platform.config, records, late_rule=True, watermarks=served.watermarks
    )
    base = {m.name: m.base_window_ms for m in settings.plans.values()}

    def after_w(cells: dict[oracle.Cell, Any]) -> dict[oracle.Cell, Any]:
        return {
            cell: values
            for cell, values in cells.items()
            if cell[1] == base[cell[0]] and cell[2] >= (served.watermarks[cell[0]] or 0)
        }

    assert oracle.compare(after_w(want), after_w(speed_cells(platform))) == []
