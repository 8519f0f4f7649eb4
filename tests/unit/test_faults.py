"""Fault points: `LAMBDA_FAULT=<name>[@n]` makes the process SIGKILL itself at that point."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from shared.faults import fault_point

REPO = Path(__file__).resolve().parents[2]


def run(script: str, fault: str | None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "LAMBDA_FAULT"}
    if fault is not None:
        env["LAMBDA_FAULT"] = fault
    return subprocess.run(
        [sys.executable, "-c", "from shared.faults import fault_point\n" + script],
        env=env,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


HIT_X = "fault_point('x'); print('survived', flush=True)"
COUNT_HITS = (
    "for i in range(1, 6):\n    print(i, flush=True)\n    fault_point('x')\nprint('survived')"
)


def test_without_lambda_fault_nothing_happens(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("LAMBDA_FAULT", raising=False)
    for _ in range(3):
        assert fault_point("before_generation_flip") is None


def test_empty_lambda_fault_does_nothing() -> None:
    result = run(HIT_X, "")
    assert result.returncode == 0, result.stderr
    assert "survived" in result.stdout


def test_the_named_point_kills_the_process() -> None:
    result = run(HIT_X, "x")
    assert result.returncode == -signal.SIGKILL, result.stderr
    assert "survived" not in result.stdout


def test_another_point_does_not_kill() -> None:
    result = run("fault_point('y'); fault_point('xx'); " + HIT_X, "x_other")
    assert result.returncode == 0, result.stderr
    assert "survived" in result.stdout


def test_a_list_of_points() -> None:
    result = run(HIT_X, "other, x")
    assert result.returncode == -signal.SIGKILL, result.stderr
    assert "survived" not in result.stdout


def test_nth_hit_kills_on_that_hit_only() -> None:
    result = run(COUNT_HITS, "x@3")
    assert result.returncode == -signal.SIGKILL, result.stderr
    assert result.stdout.split() == ["1", "2", "3"]


def test_hits_of_other_points_are_not_counted() -> None:
    script = "for _ in range(5):\n    fault_point('y')\nfault_point('x'); fault_point('x')\n"
    result = run(script + "print('survived')", "x@3")
    assert result.returncode == 0, result.stderr
    assert "survived" in result.stdout


def test_nth_hit_beyond_the_hits_reached_survives() -> None:
    result = run(COUNT_HITS, "x@6")
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["1", "2", "3", "4", "5", "survived"]
