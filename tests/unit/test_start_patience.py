"""Waiting for a service the stack started: a service that keeps writing its log (a broker
loading thousands of partitions) is still starting; one silent for `START_TIMEOUT_S` is not."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from lambdactl import stack


def test_a_service_writing_its_log_is_waited_for_and_a_silent_one_is_not(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(stack, "START_TIMEOUT_S", 0.3)
    log = tmp_path / "kafka.log"
    log.write_text("starting\n")
    patience = stack._StartPatience(log)
    for _ in range(8):  # 0.8 s in all, longer than START_TIMEOUT_S, writing all along
        time.sleep(0.1)
        with log.open("a") as out:
            out.write("Loaded partition\n")
        assert not patience.exhausted()
    time.sleep(0.4)
    assert patience.exhausted()
    assert "wrote nothing to its log for 0.3 s" in patience.why()


def test_a_service_writing_forever_is_given_up_at_the_limit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(stack, "START_LIMIT_S", 0.3)
    log = tmp_path / "postgres.log"
    patience = stack._StartPatience(log)  # no log yet: size 0
    time.sleep(0.1)
    log.write_text("redo in progress\n")
    assert not patience.exhausted()
    time.sleep(0.3)
    log.write_text("redo in progress, still\n")
    assert patience.exhausted()
    assert "within 0.3 s, although it kept writing its log" in patience.why()
