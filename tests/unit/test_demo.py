"""The demo's watch over its children (#14): one that exits is named with the end of its log
and restarted, a bounded number of times, then the demo stops loudly; the others are left
running and stopped with the demo."""

from __future__ import annotations

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
