"""`./dev`'s bootstrap is quiet when pip succeeds (its output, setuptools' editable-install
warnings among it, goes to .venv/pip.log) and shows that output, names the log and exits with
pip's status when pip fails (#50). Run on a copy of `dev` beside a stand-in virtualenv whose
`python -m pip` prints some noise and exits as told."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

DEV = Path(__file__).resolve().parents[2] / "dev"
NOISE = [f"SetuptoolsDeprecationWarning: noise line {i}" for i in range(40)]
FAKE_PYTHON = """#!/usr/bin/env bash
# `python -m pip ARGS`: 40 lines of noise on stdout and stderr, then the status the next line
# of $FAKE_STATUSES says (0 when there is none), and ARGS kept in $FAKE_CALLS.
echo "$*" >> "$FAKE_CALLS"
for i in $(seq 0 39); do
  if (( i % 2 )); then echo "SetuptoolsDeprecationWarning: noise line $i" >&2
  else echo "SetuptoolsDeprecationWarning: noise line $i"; fi
done
n=$(wc -l < "$FAKE_CALLS")
status=$(sed -n "${n}p" "$FAKE_STATUSES")
exit "${status:-0}"
"""
FAKE_LAMBDACTL = """#!/usr/bin/env bash
echo "lambdactl $*"
"""


def _tree(tmp_path: Path) -> Path:
    root = tmp_path / "repo"
    bin_dir = root / ".venv" / "bin"
    bin_dir.mkdir(parents=True)
    shutil.copy(DEV, root / "dev")
    (root / "pyproject.toml").write_text("[project]\nname = 'x'\n")
    (root / "constraints.txt").write_text("")
    for name, text in [("python", FAKE_PYTHON), ("lambdactl", FAKE_LAMBDACTL)]:
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    return root


def _dev(root: Path, statuses: list[int]) -> subprocess.CompletedProcess[str]:
    (root / "statuses").write_text("".join(f"{s}\n" for s in statuses))
    env = {
        **os.environ,
        "PYTHON": sys.executable,
        "FAKE_CALLS": str(root / "calls"),
        "FAKE_STATUSES": str(root / "statuses"),
    }
    (root / "calls").write_text("")
    return subprocess.run(
        ["bash", str(root / "dev"), "demo", "--duration", "5"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_a_successful_bootstrap_prints_one_line_and_keeps_pip_output_in_a_log(
    tmp_path: Path,
) -> None:
    root = _tree(tmp_path)
    done = _dev(root, [0, 0])
    assert done.returncode == 0, done.stderr
    assert done.stdout == "lambdactl demo --duration 5\n"
    assert done.stderr == "./dev: installing the project into .venv (pip's output: .venv/pip.log)\n"
    log = (root / ".venv" / "pip.log").read_text().splitlines()
    assert sorted(log) == sorted(NOISE * 2)  # both pip runs' stdout and stderr
    calls = (root / "calls").read_text().splitlines()
    assert calls == ["-m pip install --upgrade pip", "-m pip install -c constraints.txt -e .[dev]"]
    # Installed: the next run does not call pip, and prints nothing of its own.
    again = _dev(root, [])
    assert (again.returncode, again.stdout, again.stderr) == (0, done.stdout, "")
    assert (root / "calls").read_text() == ""


@pytest.mark.parametrize("failing", [1, 2])
def test_a_failing_pip_is_shown_with_its_log_and_stops_dev(tmp_path: Path, failing: int) -> None:
    root = _tree(tmp_path)
    done = _dev(root, [0, 3] if failing == 2 else [3])
    assert done.returncode == 3
    assert done.stdout == ""  # lambdactl never ran
    shown = done.stderr.splitlines()
    assert shown[0] == "./dev: installing the project into .venv (pip's output: .venv/pip.log)"
    assert sorted(shown[1:-1]) == sorted(NOISE * failing)  # everything pip printed
    command = "pip install --upgrade pip" if failing == 1 else "pip install -c constraints.txt"
    assert shown[-1].startswith(f"./dev: `{command}")
    assert shown[-1].endswith("failed (exit status 3); its output is above and in .venv/pip.log")
    assert not (root / ".venv" / ".installed").exists()  # the next run tries again
