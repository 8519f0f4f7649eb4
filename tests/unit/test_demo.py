"""The demo's watch over its children (#14): one that exits is named with the end of its log
and restarted, a bounded number of times, then the demo stops loudly; the others are left
running and stopped with the demo, also when the demo is ended by SIGTERM or SIGHUP (#30)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from rich.console import Console

from lambdactl.demo import Children
from shared.errors import LambdaError


def _python(code: str) -> list[str]:
    return [sys.executable, "-c", code]


def _exited(children: Children, name: str) -> None:
    child = next(c for c in children.children if c.name == name)
    deadline = time.monotonic() + 10
    while child.process.poll() is None:
        assert time.monotonic() < deadline, f"the {name} did not exit"
        time.sleep(0.02)


def test_a_child_that_exits_is_reported_restarted_then_given_up(tmp_path: Path) -> None:
    console = Console(record=True, width=200)
    crashing = "import sys; print('boom: the store went away'); sys.exit(3)"
    with Children(console, max_restarts=2) as children:
        steady = children.start("API", _python("import time; time.sleep(60)"), tmp_path / "a.log")
        children.start("speed worker", _python(crashing), tmp_path / "speed.log")
        for restarts in (1, 2):
            _exited(children, "speed worker")
            children.check()
            assert children.children[1].restarts == restarts
        text = console.export_text()
        assert text.count("the speed worker exited with code 3") == 2
        assert "boom: the store went away" in text
        assert "restarted the speed worker (2 of 2 restarts)" in text
        _exited(children, "speed worker")
        with pytest.raises(LambdaError, match="the speed worker exited 3 times; the demo stops"):
            children.check()
        assert steady.process.poll() is None, "a running child is left alone"
    assert steady.process.poll() is not None, "leaving the demo stops every child"


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGHUP])
def test_a_signal_that_ends_the_demo_stops_its_children(tmp_path: Path, signum: int) -> None:
    pid_file = tmp_path / "child.pid"
    demo = f"""
import sys, time
from pathlib import Path
from rich.console import Console
from lambdactl.demo import Children
try:
    with Children(Console()) as children:
        child = children.start("API", [sys.executable, "-c", "import time; time.sleep(60)"],
                               Path({str(tmp_path / "api.log")!r}))
        Path({str(pid_file)!r}).write_text(str(child.process.pid))
        time.sleep(60)
except KeyboardInterrupt:
    print("demo stopped")
"""
    process = subprocess.Popen(_python(demo), stdout=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 30
    while not pid_file.exists() or not pid_file.read_text():
        assert time.monotonic() < deadline, "the demo did not start its child"
        time.sleep(0.05)
    child = int(pid_file.read_text())
    process.send_signal(signum)
    out, _ = process.communicate(timeout=30)
    assert "demo stopped" in out and process.returncode == 0
    with pytest.raises(ProcessLookupError):
        os.kill(child, 0)  # reaped by the demo: no orphan left
