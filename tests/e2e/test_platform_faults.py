"""The whole platform while its processes die and its broker restarts (#14 item 1), in turn:
kill -9 of a speed worker; kill -9 of the API (restarted); kill -9 of the batch runner mid-run
(restarted); a restart of the Kafka broker. What each must keep, and how it is checked against
the oracle, is in `tests/e2e/fault_world.py`; the stores' faults are in
`test_platform_store_faults.py` (the two run on separate test workers)."""

from __future__ import annotations

import time
from functools import partial

import pytest
from confluent_kafka import KafkaException

from lambdactl.stack import stack_down, stack_up
from shared.config import Settings
from tests.e2e.fault_world import World, ride_out
from tests.e2e.support import ready, until
from tests.speed.support import end_offsets

pytestmark = [pytest.mark.services, pytest.mark.long(180), pytest.mark.timeout(600)]


def kill_worker(world: World) -> float:
    time.sleep(2)
    killed = time.monotonic()
    world.kill("speed-1")
    time.sleep(1)  # events land in its partitions: the other worker must take them
    recovery = world.recover(killed)
    world.start("speed-1")
    return recovery


def kill_api(world: World) -> float:
    time.sleep(2)
    down = time.monotonic()
    world.kill("api")
    time.sleep(2)
    back = time.monotonic()
    world.start("api")
    until("the API is back", lambda: ready(world.api), 60)
    world.outages.api_down.append((down, time.monotonic()))
    return world.recover(back)


def kill_runner(world: World) -> float:
    run_id = world.queue_run()
    until(
        "the run starts",
        lambda: world.run_status(run_id)["status"] == "running",
        60,
        0.05,
    )
    time.sleep(0.3)  # inside Spark's work: a warm incremental run takes 2 s or more
    world.kill("batch runner")
    back = time.monotonic()
    world.start("batch runner")
    world.wait_run(run_id)
    failed = world.run_status(run_id)
    assert failed["status"] == "failed", failed
    return time.monotonic() - back


def restart_broker(world: World) -> float:
    time.sleep(2)
    stack_down(world.managed, ("kafka",))
    time.sleep(2)
    back = time.monotonic()
    stack_up(world.managed, ("kafka",))
    until("the broker leads its partitions again", partial(_leading, world.settings), 60)
    return world.recover(back)


def _leading(settings: Settings) -> bool:
    """Whether the broker answers end offsets for every partition of the source (a restarted
    broker answers 'not leader' for a few seconds)."""
    source = settings.sources[0]
    try:
        end_offsets(settings.kafka.bootstrap_servers, source.topic, source.partitions)
    except KafkaException:
        return False
    return True


def test_platform_rides_out_dying_processes_and_a_broker_restart(
    fault_world: World, capsys: pytest.CaptureFixture[str]
) -> None:
    ride_out(
        fault_world,
        [
            ("kill -9 speed worker", kill_worker),
            ("kill -9 API", kill_api),
            ("kill -9 batch runner mid-run", kill_runner),
            ("Kafka broker restart", restart_broker),
        ],
        capsys,
    )
